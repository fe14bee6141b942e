#include "server/decode_loop.h"

#include <algorithm>
#include <optional>
#include <thread>

#include "absl/strings/str_cat.h"
#include "engine/tokenizer/tokenizer.h"
#include "server/errors.h"
#include "server/model_registry.h"
#include "spdlog/spdlog.h"

namespace thermocline::server {
namespace {

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// The length of the common prefix of what the KV cache holds and the prompt, less the last
// prompt token: that one is evaluated again for the logits of the first generated token.
int64_t ReusablePrefix(const std::vector<int32_t>& cached, absl::Span<const int32_t> prompt) {
  const size_t limit = std::min(cached.size(), prompt.empty() ? 0 : prompt.size() - 1);
  size_t n = 0;
  while (n < limit && cached[n] == prompt[n]) ++n;
  return static_cast<int64_t>(n);
}

}  // namespace

// The per-token callback of one job: metrics, logprobs, the stop strings, streaming to the
// job's sink, cancellation and the deadline.
class DecodeLoop::TokenSink {
 public:
  TokenSink(Job& job, GenerationStats* stats, Metrics* metrics, int delay_ms, StopMatcher* stop,
            std::vector<TokenLogprobs>* pending)
      : job_(job),
        r_(job.request),
        stats_(stats),
        metrics_(metrics),
        delay_ms_(delay_ms),
        stop_(*stop),
        pending_(*pending),
        file_(job.model->model->gguf()) {
    stop_.Reset(&r_.stop);
    pending_.clear();
  }

  TokenAction OnToken(const GeneratedToken& t, int32_t n_vocab) {
    // The token came from zeros where the file's mapping faulted (mapping_guard.h): it is
    // never emitted, the job fails.
    if (file_.faulted()) return TokenAction::kCancel;
    ++stats_->completion_tokens;
    metrics_->AddGeneratedToken();
    const Clock::time_point now = Clock::now();
    if (t.index == 0) {
      stats_->ttft_seconds = Seconds(now - job_.arrival);
      metrics_->ObserveTimeToFirstToken(stats_->ttft_seconds);
    } else {
      metrics_->ObserveInterToken(Seconds(now - last_));
    }
    last_ = now;
    if (r_.logprobs || r_.token_ids) {
      TokenLogprobs& lp = pending_.emplace_back();
      lp.id = t.id;
      lp.text_offset = produced_;
      if (r_.logprobs) {
        const absl::Span<const float> raw(t.logits, n_vocab);
        lp.logprob = Sampler::Logprob(raw, t.id);
        if (r_.top_logprobs > 0) Sampler::TopLogprobs(raw, r_.top_logprobs, &lp.top);
      }
    }
    produced_ += t.text.size();
    bool stopped = false;
    const std::string_view out = stop_.Push(t.text, &stopped);
    if (!Emit(out, /*final=*/stopped)) job_.Cancel(CancelReason::kClientGone);
    if (stopped) return TokenAction::kStop;
    if (job_.cancelled()) return TokenAction::kCancel;
    if (now >= job_.deadline) {
      job_.Cancel(CancelReason::kDeadline);
      return TokenAction::kCancel;
    }
    if (delay_ms_ > 0) std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms_));
    return TokenAction::kContinue;
  }

  // The text the detokenizer held back to the end: it may complete a stop string too.
  StopReason Finish(StopReason reason, std::string_view tail) {
    bool stopped = false;
    const std::string_view out = stop_.Push(tail, &stopped);
    if (stopped) {
      Emit(out, /*final=*/true);
      return StopReason::kStopSequence;
    }
    std::string rest(out);
    rest += stop_.Flush();
    Emit(rest, /*final=*/true);
    return reason;
  }

 private:
  // Emits text and the logprobs of the tokens whose text has been fully emitted (all pending
  // ones when `final`). False when the sink says stop.
  bool Emit(std::string_view text, bool final) {
    size_t ready = 0;
    if (final) {
      // Tokens that start before the end of the emitted text (a stop string may cut the last).
      while (ready < pending_.size() && pending_[ready].text_offset < stop_.emitted()) ++ready;
      if (stop_.emitted() == produced_) ready = pending_.size();
    } else {
      // Tokens whose text has been emitted entirely.
      while (ready < pending_.size()) {
        const size_t end =
            ready + 1 < pending_.size() ? pending_[ready + 1].text_offset : produced_;
        if (end > stop_.emitted()) break;
        ++ready;
      }
    }
    if (text.empty() && ready == 0) return true;
    const bool go_on =
        job_.sink->OnDelta(text, absl::Span<const TokenLogprobs>(pending_.data(), ready));
    pending_.erase(pending_.begin(), pending_.begin() + ready);
    return go_on;
  }

  Job& job_;
  const GenerationRequest& r_;
  GenerationStats* stats_;
  Metrics* metrics_;
  const int delay_ms_;
  StopMatcher& stop_;
  std::vector<TokenLogprobs>& pending_;
  const GgufFile& file_;  // the model's weights: checked per token
  size_t produced_ = 0;   // bytes of text generated so far in this job
  Clock::time_point last_ = Clock::now();
};

DecodeLoop::DecodeLoop(const DecodeLoopOptions& options, Metrics* metrics)
    : options_(options), metrics_(metrics), pool_(std::max(1, options.threads)) {}

absl::Status DecodeLoop::AddModel(const std::shared_ptr<const LoadedModel>& model) {
  auto session = Prepare(model);
  Finish();
  return session.ok() ? absl::OkStatus() : session.status();
}

void DecodeLoop::Drop(PerModel& m) {
  m.tokens.clear();
  m.session.reset();
  m.model.reset();
}

DecodeLoop::PerModel* DecodeLoop::Current(const LoadedModel& model) {
  const size_t index = static_cast<size_t>(model.served->index);
  if (index >= models_.size()) return nullptr;
  PerModel& m = models_[index];
  if (m.model.get() != &model || m.session == nullptr) return nullptr;
  if (&m.session->engine() != model.engine().get()) return nullptr;  // replaced on its next job
  return &m;
}

DecodeLoop::PrefixMatch DecodeLoop::CachedPrefix(const LoadedModel& model,
                                                 absl::Span<const int32_t> prompt) {
  if (!options_.prompt_cache) return {};
  std::lock_guard<std::mutex> lock(models_mu_);
  const PerModel* m = Current(model);
  if (m == nullptr) return {};
  return {ReusablePrefix(m->tokens, prompt), static_cast<int64_t>(m->tokens.size())};
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

absl::StatusOr<DecodeLoop::PerModel*> DecodeLoop::Prepare(
    const std::shared_ptr<const LoadedModel>& loaded) {
  const LoadedModel& model = *loaded;
  const size_t index = static_cast<size_t>(model.served->index);
  std::lock_guard<std::mutex> lock(models_mu_);
  running_ = static_cast<int>(index);
  if (index >= models_.size()) models_.resize(index + 1);
  PerModel& m = models_[index];
  if (m.model != loaded) Drop(m);  // a session of an earlier load of the model
  const std::shared_ptr<const Engine> engine = model.engine();
  if (m.session != nullptr && &m.session->engine() != engine.get()) {
    m.session.reset();  // the model's engine changed (a sidecar arrived): a session on the new one
    m.tokens.clear();
  }
  if (m.session == nullptr) {
    absl::StatusOr<std::unique_ptr<EngineSession>> session = engine->NewSession(&pool_);
    if (!session.ok()) return session.status();
    m.session = *std::move(session);
    m.model = loaded;
    const EnginePlacement& p = m.session->placement();
    if (p.gpu_requested && p.note != engine->placement().note && !p.note.empty()) {
      spdlog::warn("model '{}': a slot's session: {}", model.config().name, p.note);
    }
  }
  return &m;
}

DecodeLoop::Outcome DecodeLoop::Run(Job& job) {
  Outcome out;
  const Clock::time_point start = Clock::now();
  out.stats.queue_seconds = Seconds(start - job.arrival);
  metrics_->ObserveQueueWait(out.stats.queue_seconds);
  if (!job.cancelled() && start >= job.deadline) job.Cancel(CancelReason::kDeadline);
  if (job.cancelled()) {
    out.reason = StopReason::kCancelled;
  } else {
    out.reason = job.request.kind == ApiKind::kEmbedding ? Embed(job, &out.stats, &out.error)
                                                         : Generate(job, &out.stats, &out.error);
  }
  Finish();
  if (out.reason == StopReason::kCancelled) metrics_->CountCancellation(job.cancel_reason());
  out.stats.total_seconds = Seconds(Clock::now() - job.arrival);
  metrics_->ObserveRequestDuration(out.stats.total_seconds);
  return out;
}

StopReason DecodeLoop::Generate(Job& job, GenerationStats* stats, absl::Status* error) {
  const GenerationRequest& r = job.request;
  auto prepared = Prepare(job.model.shared());
  if (!prepared.ok()) {
    *error = prepared.status();
    return StopReason::kError;
  }
  PerModel& m = **prepared;  // this slot's alone while the job runs
  Session& session = m.session->session();
  const int32_t n_vocab = static_cast<int32_t>(session.model().hparams().n_vocab);
  const int64_t cached = options_.prompt_cache ? ReusablePrefix(m.tokens, r.prompt) : 0;
  session.Truncate(cached);  // the KV cache's positions past the shared prefix are forgotten
  stats->prompt_tokens = static_cast<int64_t>(r.prompt.size());
  stats->cached_tokens = cached;

  GenerateOptions options;
  options.max_tokens = r.max_tokens;
  options.sampling = r.sampling;
  options.stop_at_end_of_generation = !r.ignore_eos;
  options.stop_tokens = r.stop_tokens;
  options.logit_bias = r.logit_bias;
  options.raw_logits = r.logprobs;
  options.cached_prompt = cached;
  options.cancel_prefill = [&job, delay_ms = options_.prefill_delay_ms] {
    if (delay_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
    if (!job.cancelled() && Clock::now() >= job.deadline) job.Cancel(CancelReason::kDeadline);
    return job.cancelled();
  };
  std::optional<GrammarMatcher> grammar;  // constrained output: this job's parse state
  if (r.grammar != nullptr) options.grammar = &grammar.emplace(r.grammar, r.vocab_trie);
  TokenSink sink(job, stats, metrics_, options_.decode_delay_ms, &stop_, &pending_logprobs_);
  absl::StatusOr<GenerationResult> result =
      thermocline::Generate(session, r.prompt, options,
                            [&](const GeneratedToken& t) { return sink.OnToken(t, n_vocab); });
  // What the KV cache holds now: the first n_past tokens of prompt + output.
  std::vector<int32_t> tokens;
  if (result.ok()) {
    tokens.reserve(r.prompt.size() + result->tokens.size());
    tokens.assign(r.prompt.begin(), r.prompt.end());
    tokens.insert(tokens.end(), result->tokens.begin(), result->tokens.end());
    tokens.resize(std::min<size_t>(tokens.size(), static_cast<size_t>(session.n_past())));
  } else {
    session.Reset();  // a failed evaluation leaves nothing worth keeping
  }
  {
    std::lock_guard<std::mutex> lock(models_mu_);  // CachedPrefix reads it from other threads
    m.tokens = std::move(tokens);
  }
  const GgufFile& file = job.model->model->gguf();
  if (file.faulted()) {
    session.Reset();  // computed from zero pages: nothing of it is kept
    {
      std::lock_guard<std::mutex> lock(models_mu_);
      m.tokens.clear();
    }
    *error = Unavailable(
        "model_failed",
        absl::StrCat("model '", job.model->config().name, "': its file ", file.path(),
                     " was truncated or could not be read while this request ran; the model is "
                     "unloaded at its next request"));
    return StopReason::kError;
  }
  if (!result.ok()) {
    *error = result.status();
    return StopReason::kError;
  }
  metrics_->AddPromptTokens(stats->prompt_tokens, result->prompt_cached, result->prompt_computed);
  stats->prompt_seconds = result->prompt_seconds;
  stats->decode_seconds = result->decode_seconds;
  switch (result->stop_reason) {
    case StopReason::kStopSequence:  // its text is emitted, the rest dropped
    case StopReason::kCancelled:
      return result->stop_reason;
    default:
      return sink.Finish(result->stop_reason, result->final_text);
  }
}

}  // namespace thermocline::server
