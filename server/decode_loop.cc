#include "server/decode_loop.h"

#include <algorithm>
#include <thread>

#include "absl/strings/str_cat.h"
#include "engine/tokenizer/tokenizer.h"
#include "server/model_registry.h"
#include "spdlog/spdlog.h"

namespace thermocline::server {
namespace {

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

bool Contains(const std::vector<int32_t>& v, int32_t id) {
  return std::find(v.begin(), v.end(), id) != v.end();
}

}  // namespace

DecodeLoop::DecodeLoop(const DecodeLoopOptions& options, Metrics* metrics)
    : options_(options), metrics_(metrics), pool_(std::max(1, options.threads)) {}

absl::Status DecodeLoop::AddModel(const std::shared_ptr<const LoadedModel>& model) {
  auto session = Prepare(model);
  Finish();
  return session.ok() ? absl::OkStatus() : session.status();
}

void DecodeLoop::Drop(PerModel& m) {
  if (m.session != nullptr) m.session->set_ffn_backend(nullptr);
  m.sparse.reset();
  m.source.reset();
  m.session.reset();
  m.model.reset();
}

void DecodeLoop::ReleaseUnloaded() {
  std::lock_guard<std::mutex> lock(models_mu_);
  for (size_t i = 0; i < models_.size(); ++i) {
    PerModel& m = models_[i];
    if (static_cast<int>(i) != running_ && m.model != nullptr && m.model->unloaded()) Drop(m);
  }
}

void DecodeLoop::Finish() {
  {
    std::lock_guard<std::mutex> lock(models_mu_);
    running_ = -1;
  }
  ReleaseUnloaded();
}

absl::StatusOr<Session*> DecodeLoop::Prepare(const std::shared_ptr<const LoadedModel>& loaded) {
  const LoadedModel& model = *loaded;
  const size_t index = static_cast<size_t>(model.served->index);
  std::lock_guard<std::mutex> lock(models_mu_);
  running_ = static_cast<int>(index);
  if (index >= models_.size()) models_.resize(index + 1);
  PerModel& m = models_[index];
  if (m.model != loaded) Drop(m);  // a session of an earlier load of the model
  if (m.session == nullptr) {
    SessionOptions so;
    so.n_ctx = model.n_ctx;
    so.max_batch = options_.max_batch;
    auto session = Session::Create(*model.model, &pool_, so);
    if (!session.ok()) return session.status();
    m.session = std::move(*session);
    m.model = loaded;
    const size_t n_vocab = static_cast<size_t>(model.model->hparams().n_vocab);
    raw_logits_.resize(std::max(raw_logits_.size(), n_vocab));
    history_.reserve(std::max<size_t>(history_.capacity(), model.n_ctx));
  }
  std::shared_ptr<const SparseSource> source = model.served->sparse_source();
  if (source != m.source) {
    m.session->set_ffn_backend(nullptr);
    m.sparse.reset();
    m.source = source;
    if (source != nullptr) {
      SparseFfnOptions options;
      options.dense_prefill = true;
      auto weights = model.SparseWeightsFor(source, pool_);
      absl::StatusOr<std::unique_ptr<SparseFfn>> ffn =
          weights.ok() ? SparseFfn::Create(*std::move(weights), &pool_, options)
                       : absl::StatusOr<std::unique_ptr<SparseFfn>>(weights.status());
      if (ffn.ok()) {
        m.sparse = std::move(*ffn);
        m.sparse->set_session(m.session.get());
        m.session->set_ffn_backend(m.sparse.get());
      } else {
        // Checked by the registry before it was published; serve dense rather than fail.
        spdlog::error("model '{}': cannot serve sparse from {}: {}; serving dense",
                      model.config().name, source->path, std::string(ffn.status().message()));
      }
    }
  }
  return m.session.get();
}

DecodeLoop::Outcome DecodeLoop::Run(Job& job) {
  Outcome out;
  const Clock::time_point start = Clock::now();
  out.stats.queue_seconds = Seconds(start - job.arrival);
  metrics_->ObserveQueueWait(out.stats.queue_seconds);
  if (!job.cancelled() && start >= job.deadline) job.Cancel(CancelReason::kDeadline);
  if (job.cancelled()) {
    out.reason = FinishReason::kCancelled;
  } else {
    out.reason = Generate(job, &out.stats, &out.error);
  }
  Finish();
  if (out.reason == FinishReason::kCancelled) metrics_->CountCancellation(job.cancel_reason());
  out.stats.total_seconds = Seconds(Clock::now() - job.arrival);
  metrics_->ObserveRequestDuration(out.stats.total_seconds);
  return out;
}

FinishReason DecodeLoop::Generate(Job& job, GenerationStats* stats, absl::Status* error) {
  const GenerationRequest& r = job.request;
  const LoadedModel& served = *job.model;
  const Tokenizer& tok = served.tokenizer();
  auto prepared = Prepare(job.model.shared());
  if (!prepared.ok()) {
    *error = prepared.status();
    return FinishReason::kError;
  }
  Session& session = **prepared;
  const int32_t n_vocab = static_cast<int32_t>(served.model->hparams().n_vocab);

  session.Reset();
  stats->prompt_tokens = static_cast<int64_t>(r.prompt.size());
  if (absl::Status s = session.Eval(r.prompt); !s.ok()) {
    *error = s;
    return FinishReason::kError;
  }
  metrics_->AddPromptTokens(stats->prompt_tokens);

  Sampler sampler(r.sampling, n_vocab);
  // Generated text continues the prompt: the detokenizer sees the prompt first, as the
  // engine's Generate does, so the two give the same text.
  StreamingDetokenizer detok(tok);
  for (int32_t id : r.prompt) detok.Push(id);
  history_.assign(r.prompt.begin(), r.prompt.end());
  stop_.Reset(&r.stop);
  pending_logprobs_.clear();
  produced_ = 0;

  FinishReason reason = FinishReason::kLength;
  Clock::time_point last = Clock::now();
  for (int32_t i = 0; i < r.max_tokens; ++i) {
    float* logits = session.mutable_logits();
    if (r.logprobs) std::copy_n(logits, n_vocab, raw_logits_.data());
    for (const auto& [id, bias] : r.logit_bias) logits[id] += bias;
    const int32_t id = sampler.Sample(logits, history_);
    if (!r.ignore_eos && (tok.IsEndOfGeneration(id) || Contains(r.stop_tokens, id))) {
      reason = FinishReason::kStop;
      break;
    }
    history_.push_back(id);
    ++stats->completion_tokens;
    metrics_->AddGeneratedToken();
    const Clock::time_point now = Clock::now();
    if (i == 0) {
      stats->ttft_seconds = Seconds(now - job.arrival);
      metrics_->ObserveTimeToFirstToken(stats->ttft_seconds);
    } else {
      metrics_->ObserveInterToken(Seconds(now - last));
    }
    last = now;

    const std::string text = detok.Push(id);
    if (r.logprobs || r.token_ids) {
      TokenLogprobs& lp = pending_logprobs_.emplace_back();
      lp.id = id;
      lp.text_offset = produced_;
      if (r.logprobs) {
        const absl::Span<const float> raw(raw_logits_.data(), n_vocab);
        lp.logprob = Sampler::Logprob(raw, id);
        if (r.top_logprobs > 0) Sampler::TopLogprobs(raw, r.top_logprobs, &lp.top);
      }
    }
    produced_ += text.size();
    bool stopped = false;
    const std::string_view out = stop_.Push(text, &stopped);
    if (!Emit(job, out, /*final=*/stopped)) job.Cancel(CancelReason::kClientGone);
    if (stopped) {
      stats->stop_sequence = true;
      return FinishReason::kStop;
    }
    if (job.cancelled()) return FinishReason::kCancelled;
    if (now >= job.deadline) {
      job.Cancel(CancelReason::kDeadline);
      return FinishReason::kCancelled;
    }
    if (i + 1 == r.max_tokens || session.n_past() >= session.n_ctx()) break;
    if (options_.decode_delay_ms > 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(options_.decode_delay_ms));
    }
    if (absl::Status s = session.Eval({&id, 1}); !s.ok()) {
      *error = s;
      return FinishReason::kError;
    }
  }
  // Bytes the detokenizer still holds may complete a stop string too.
  bool stopped = false;
  const std::string tail = detok.Flush();
  std::string_view out = stop_.Push(tail, &stopped);
  if (!stopped) {
    std::string rest(out);
    rest += stop_.Flush();
    Emit(job, rest, /*final=*/true);
  } else {
    Emit(job, out, /*final=*/true);
    reason = FinishReason::kStop;
    stats->stop_sequence = true;
  }
  return reason;
}

bool DecodeLoop::Emit(Job& job, std::string_view text, bool final) {
  size_t ready = 0;
  if (final) {
    // Tokens that start before the end of the emitted text (a stop string may cut the last).
    while (ready < pending_logprobs_.size() &&
           pending_logprobs_[ready].text_offset < stop_.emitted()) {
      ++ready;
    }
    if (stop_.emitted() == produced_) ready = pending_logprobs_.size();
  } else {
    // Tokens whose text has been emitted entirely.
    while (ready < pending_logprobs_.size()) {
      const size_t end = ready + 1 < pending_logprobs_.size()
                             ? pending_logprobs_[ready + 1].text_offset
                             : produced_;
      if (end > stop_.emitted()) break;
      ++ready;
    }
  }
  if (text.empty() && ready == 0) return true;
  const bool go_on =
      job.sink->OnDelta(text, absl::Span<const TokenLogprobs>(pending_logprobs_.data(), ready));
  pending_logprobs_.erase(pending_logprobs_.begin(), pending_logprobs_.begin() + ready);
  return go_on;
}

}  // namespace thermocline::server
