#include "server/grpc_generate_stream.h"

#include <utility>

#include "server/errors.h"
#include "server/grpc_common.h"
#include "spdlog/spdlog.h"

namespace thermocline::server {

namespace pb = thermocline::v1;

// gRPC cancels a call when its deadline passes; the call's deadline (system clock) and the job's
// (steady clock) may disagree by this much.
constexpr Clock::duration kDeadlineSlack = std::chrono::milliseconds(20);

class GenerateStream::Sink final : public GenerationSink {
 public:
  explicit Sink(GenerateStream* stream) : stream_(stream) {}
  bool OnDelta(std::string_view text, absl::Span<const TokenLogprobs> logprobs) override {
    return stream_->OnDelta(text, logprobs);
  }
  void OnFinish(StopReason reason, CancelReason cancel, const GenerationStats& stats,
                const absl::Status& error) override {
    stream_->OnFinish(reason, cancel, stats, error);
  }

 private:
  // The reactor outlives every call: it is deleted in OnDone, which follows Finish, which follows
  // OnFinish, the sink's last call.
  GenerateStream* const stream_;
};

GenerateStream::GenerateStream(grpc::CallbackServerContext* context, std::shared_ptr<Job> job,
                               const Tokenizer* tokenizer, GrpcShared* shared,
                               Clock::time_point call_deadline, bool access_log)
    : context_(context),
      job_(std::move(job)),
      tokenizer_(tokenizer),
      shared_(shared),
      deadline_is_call_(call_deadline != Clock::time_point::max() &&
                        job_->deadline == call_deadline),
      logprobs_(job_->request.logprobs),
      access_log_(access_log) {
  job_->request.token_ids = true;
  shared_->active_streams.fetch_add(1);
  job_->sink = std::make_unique<Sink>(this);
}

void GenerateStream::Start(Scheduler* scheduler) {
  scheduler_ = scheduler;
  if (absl::Status s = scheduler->Submit(job_); !s.ok()) FinishOnce(ToGrpcStatus(s));
}

bool GenerateStream::OnDelta(std::string_view text, absl::Span<const TokenLogprobs> logprobs) {
  bool write = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    // Gone: the job has been cancelled (with its reason) or is about to be; the decode loop stops
    // at its own check.
    if (call_gone_) return true;
    pending_.mutable_text()->append(text.data(), text.size());
    for (const TokenLogprobs& t : logprobs) {
      pending_.add_token_ids(t.id);
      if (!logprobs_) continue;
      pb::TokenLogprob* lp = pending_.add_logprobs();
      lp->set_token_id(t.id);
      lp->set_token(ProtoText(tokenizer_->TokenToPiece(t.id)));
      lp->set_logprob(t.logprob);
      for (const Sampler::TokenLogprob& alt : t.top) {
        pb::TopLogprob* top = lp->add_top();
        top->set_token_id(alt.id);
        top->set_token(ProtoText(tokenizer_->TokenToPiece(alt.id)));
        top->set_logprob(alt.logprob);
      }
    }
    has_pending_ = true;
    write = TakeWriteLocked();
  }
  if (write) StartWrite(&in_flight_);
  return true;
}

namespace {

pb::GenerateResponse::StopReason StopReasonOf(StopReason reason, CancelReason cancel,
                                              const GenerationStats& stats) {
  switch (reason) {
    case StopReason::kEndOfGeneration:
      return pb::GenerateResponse::EOS;
    case StopReason::kStopSequence:
      return pb::GenerateResponse::STOP_SEQUENCE;
    case StopReason::kLength:
    case StopReason::kContextFull:
      return pb::GenerateResponse::MAX_TOKENS;
    case StopReason::kCancelled:
      return cancel == CancelReason::kDeadline ? pb::GenerateResponse::DEADLINE
                                               : pb::GenerateResponse::CANCELLED;
    case StopReason::kError:
      break;
  }
  return pb::GenerateResponse::ERROR;
}

}  // namespace

void GenerateStream::OnFinish(StopReason reason, CancelReason cancel, const GenerationStats& stats,
                              const absl::Status& error) {
  const pb::GenerateResponse::StopReason stop = StopReasonOf(reason, cancel, stats);
  grpc::Status status = grpc::Status::OK;
  // The client cancelled or its deadline passed: it reads nothing more.
  bool client_side = false;
  if (stop == pb::GenerateResponse::ERROR) {
    status = grpc::Status(grpc::StatusCode::INTERNAL,
                          std::string("generation failed: ") + std::string(error.message()));
  } else if (reason == StopReason::kCancelled && cancel == CancelReason::kShutdown) {
    status = ToGrpcStatus(Unavailable("shutting_down", "the server shut down before the end"));
  } else if (reason == StopReason::kCancelled && cancel == CancelReason::kClientGone) {
    status = grpc::Status(grpc::StatusCode::CANCELLED, "the client cancelled the call");
    client_side = true;
  } else if (reason == StopReason::kCancelled && deadline_is_call_) {
    status = grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "the call's deadline passed");
    client_side = true;
  }
  bool write = false, finish = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stats_ = stats;
    final_status_ = status;
    job_done_ = true;
    if (client_side) call_gone_ = true;
    if (call_gone_) {
      finish = !writing_;
    } else {
      pending_.set_stop_reason(stop);
      pb::Usage* usage = pending_.mutable_usage();
      usage->set_prompt_tokens(stats.prompt_tokens);
      usage->set_completion_tokens(stats.completion_tokens);
      usage->set_total_tokens(stats.prompt_tokens + stats.completion_tokens);
      usage->set_cached_tokens(stats.cached_tokens);
      usage->set_truncated_messages(job_->request.truncated_messages);
      pb::Timings* t = pending_.mutable_timings();
      t->set_queue_seconds(stats.queue_seconds);
      t->set_time_to_first_token_seconds(stats.ttft_seconds);
      t->set_total_seconds(stats.total_seconds);
      const double decode_s = stats.total_seconds - stats.ttft_seconds;
      t->set_decode_tokens_per_second(stats.completion_tokens >= 2 && decode_s > 0
                                          ? (stats.completion_tokens - 1) / decode_s
                                          : 0);
      if (stop == pb::GenerateResponse::ERROR)
        pending_.set_error(ProtoText(std::string(error.message())));
      has_pending_ = true;
      write = TakeWriteLocked();
    }
  }
  if (write) StartWrite(&in_flight_);
  if (finish) FinishOnce(status);
}

bool GenerateStream::TakeWriteLocked() {
  if (writing_ || !has_pending_ || call_gone_) return false;
  in_flight_.Clear();
  in_flight_.Swap(&pending_);
  has_pending_ = false;
  writing_ = true;
  return true;
}

void GenerateStream::OnWriteDone(bool ok) {
  bool write = false, finish = false;
  grpc::Status status;
  {
    std::lock_guard<std::mutex> lock(mu_);
    writing_ = false;
    if (!ok) call_gone_ = true;
    write = TakeWriteLocked();
    // The last message has gone out (or cannot): the call ends.
    finish = !write && job_done_;
    status = final_status_;
  }
  // A write fails once the call is gone, which may be before OnCancel says why.
  if (!ok && !finish) scheduler_->Cancel(job_, WhyGone());
  if (write) StartWrite(&in_flight_);
  if (finish) FinishOnce(status);
}

CancelReason GenerateStream::WhyGone() const {
  if (shared_->draining.load()) return CancelReason::kShutdown;
  if (job_->deadline != Clock::time_point::max() &&
      Clock::now() + kDeadlineSlack >= job_->deadline) {
    return CancelReason::kDeadline;
  }
  return CancelReason::kClientGone;
}

void GenerateStream::OnCancel() {
  const CancelReason reason = WhyGone();
  // The job's reason is set before the sink refuses tokens, so that the decode loop ends it with
  // this reason. A queued job finishes right here (OnFinish on this thread); a running one after
  // its current token.
  if (scheduler_ != nullptr) scheduler_->Cancel(job_, reason);
  std::lock_guard<std::mutex> lock(mu_);
  call_gone_ = true;
}

void GenerateStream::FinishOnce(const grpc::Status& status) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (finish_called_) return;
    finish_called_ = true;
  }
  if (access_log_) {
    spdlog::info("{} grpc {} {} prompt={} completion={} ttft={:.3f}s total={:.3f}s",
                 context_->peer(), job_->request.kind == ApiKind::kChat ? "Chat" : "Generate",
                 status.ok() ? "OK" : std::to_string(static_cast<int>(status.error_code())),
                 stats_.prompt_tokens, stats_.completion_tokens, stats_.ttft_seconds,
                 stats_.total_seconds);
  }
  Finish(status);
}

void GenerateStream::OnDone() {
  shared_->active_streams.fetch_sub(1);
  delete this;
}

}  // namespace thermocline::server
