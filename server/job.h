// A generation job as the scheduler and the decode loop see it, and the sink through which the
// loop streams its output to a front end (SSE, a collected JSON body, a gRPC stream...).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "engine/runtime/generate.h"
#include "engine/sampling/sampler.h"
#include "server/metrics.h"
#include "server/model_registry.h"
#include "server/request.h"

namespace thermocline::server {

using Clock = std::chrono::steady_clock;

// How a job ended: the engine's one stop-reason enum (engine/runtime/generate.h), kError and
// kCancelled included.
using thermocline::StopReason;

struct GenerationStats {
  int64_t prompt_tokens = 0;
  int64_t cached_tokens = 0;  // of the prompt tokens, found in the slot's KV cache
  int64_t completion_tokens = 0;
  double queue_seconds = 0;   // waiting for a slot
  double ttft_seconds = -1;   // arrival to first token; -1 when none
  double total_seconds = 0;   // arrival to finish
  double prompt_seconds = 0;  // prefill (the engine's measure)
  double decode_seconds = 0;  // evaluating generated tokens
};

// One generated token's log-probability and its most likely alternatives.
struct TokenLogprobs {
  int32_t id = 0;
  float logprob = 0;       // 0 and `top` empty when only token ids were asked for
  size_t text_offset = 0;  // where its text starts in the completion text
  std::vector<Sampler::TokenLogprob> top;
};

// Receives a job's output. Calls come from one thread at a time (the slot running the job, or
// the thread that cancels it while queued): any number of OnDelta, then exactly one OnFinish.
class GenerationSink {
 public:
  virtual ~GenerationSink() = default;
  // Text safe to show (stop strings already removed) and the logprobs of the tokens it covers.
  // Returns false to stop generation (the consumer is gone): the per-token callback that can
  // say stop.
  virtual bool OnDelta(std::string_view text, absl::Span<const TokenLogprobs> logprobs) = 0;
  // An embedding job's vector of inputs[index] (ApiKind::kEmbedding), before OnFinish.
  virtual void OnEmbedding(size_t index, std::vector<float> vector) {}
  // `error` is set when reason is kError; `cancel` says why when reason is kCancelled.
  virtual void OnFinish(StopReason reason, CancelReason cancel, const GenerationStats& stats,
                        const absl::Status& error) = 0;
};

struct Job {
  GenerationRequest request;
  ModelLease model;  // keeps the model in memory until the job is gone, even if it is unloaded
  std::unique_ptr<GenerationSink> sink;  // lives as long as the job; destroyed before `model`
  Clock::time_point arrival = Clock::now();
  Clock::time_point deadline = Clock::time_point::max();

  // Thread-safe: any thread may cancel; the decode loop checks after every token.
  void Cancel(CancelReason reason) {
    cancel_reason_.store(static_cast<int>(reason), std::memory_order_relaxed);
    cancelled_.store(true, std::memory_order_release);
  }
  bool cancelled() const { return cancelled_.load(std::memory_order_acquire); }
  CancelReason cancel_reason() const {
    return static_cast<CancelReason>(cancel_reason_.load(std::memory_order_relaxed));
  }

 private:
  std::atomic<bool> cancelled_{false};
  std::atomic<int> cancel_reason_{0};
};

}  // namespace thermocline::server
