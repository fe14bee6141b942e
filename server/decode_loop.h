// The execute step: one slot's batch-size-1 decode loop. It owns the slot's thread pool and one
// Session (KV cache) per served model, all allocated once, and runs the jobs the scheduler
// hands it: prefill, then sample / detokenize / stop-string filter / stream each token, with
// cancellation and the deadline checked after every token. It never decides what runs.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "engine/model/session.h"
#include "engine/util/thread_pool.h"
#include "server/job.h"
#include "server/metrics.h"
#include "server/stop_matcher.h"

namespace thermocline::server {

struct DecodeLoopOptions {
  int threads = 1;
  int64_t max_batch = 64;
  int decode_delay_ms = 0;  // debug: sleep after each token
};

class DecodeLoop {
 public:
  DecodeLoop(const DecodeLoopOptions& options, Metrics* metrics);
  // Creates a session per model (index = ServedModel::index). Call before Run.
  absl::Status AddModel(const ServedModel& model);

  struct Outcome {
    FinishReason reason = FinishReason::kStop;
    GenerationStats stats;
    absl::Status error;
  };
  // Runs `job` to its end, streaming through job.sink->OnDelta; the caller frees the slot and
  // then passes the outcome to job.sink->OnFinish. Not thread-safe: the slot thread alone
  // calls it.
  Outcome Run(Job& job);

 private:
  FinishReason Generate(Job& job, GenerationStats* stats, absl::Status* error);
  // Emits text and the logprobs of the tokens whose text has been fully emitted (all pending
  // ones when `final`). False when the sink says stop.
  bool Emit(Job& job, std::string_view text, bool final);

  DecodeLoopOptions options_;
  Metrics* metrics_;
  ThreadPool pool_;
  std::vector<std::unique_ptr<Session>> sessions_;
  // Reused across jobs so that a token costs no allocation.
  std::vector<int32_t> history_;
  std::vector<float> raw_logits_;
  StopMatcher stop_;
  std::vector<TokenLogprobs> pending_logprobs_;
  size_t produced_ = 0;  // bytes of text generated so far in this job
};

}  // namespace thermocline::server
