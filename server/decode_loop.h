// The execute step: one slot's batch-size-1 decode loop. It owns the slot's thread pool and one
// Session (KV cache) per served model, created on the model's first job (or up front by
// AddModel), and runs the jobs the scheduler hands it: prefill, then sample / detokenize /
// stop-string filter / stream each token, with cancellation and the deadline checked after
// every token. Between jobs it picks up a model's new sparse source (its own SparseFfn, which
// has per-token buffers) or drops it to serve dense, and drops the sessions of models the
// registry has unloaded (each session shares ownership of its loaded model, so that is when
// their memory can go). It never decides what runs.
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "engine/model/session.h"
#include "engine/sparse/sparse_ffn.h"
#include "engine/util/thread_pool.h"
#include "server/job.h"
#include "server/metrics.h"
#include "server/stop_matcher.h"

namespace thermocline::server {

struct SparseSource;
struct LoadedModel;

struct DecodeLoopOptions {
  int threads = 1;
  int64_t max_batch = 64;
  int decode_delay_ms = 0;  // debug: sleep after each token
};

class DecodeLoop {
 public:
  DecodeLoop(const DecodeLoopOptions& options, Metrics* metrics);
  // Creates the model's session (index = ServedModel::index) now rather than on its first job.
  absl::Status AddModel(const std::shared_ptr<const LoadedModel>& model);
  // Drops the sessions of models the registry has unloaded (and with them the slot's share of
  // their weights), but the one a job runs on now: Run drops that one when the job ends.
  // Thread-safe (one lock per call; Run takes it twice per job, never per token).
  void ReleaseUnloaded();

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
  // The model's session with the backend of its current sparse source; created on first use.
  // Marks it running (until Finish).
  absl::StatusOr<Session*> Prepare(const std::shared_ptr<const LoadedModel>& model);
  FinishReason Generate(Job& job, GenerationStats* stats, absl::Status* error);
  // Emits text and the logprobs of the tokens whose text has been fully emitted (all pending
  // ones when `final`). False when the sink says stop.
  bool Emit(Job& job, std::string_view text, bool final);

  DecodeLoopOptions options_;
  Metrics* metrics_;
  ThreadPool pool_;
  struct PerModel {
    std::shared_ptr<const LoadedModel> model;  // what `session` runs; declared first: freed last
    std::unique_ptr<Session> session;
    std::unique_ptr<SparseFfn> sparse;           // null: dense
    std::shared_ptr<const SparseSource> source;  // what `sparse` was built from
  };
  static void Drop(PerModel& m);
  // No job runs any more: drops what ReleaseUnloaded had to leave.
  void Finish();
  std::mutex models_mu_;          // guards models_ (a job's Session is its slot's alone)
  std::vector<PerModel> models_;  // by ServedModel::index
  int running_ = -1;              // models_ index of the job running now
  // Reused across jobs so that a token costs no allocation.
  std::vector<int32_t> history_;
  std::vector<float> raw_logits_;
  StopMatcher stop_;
  std::vector<TokenLogprobs> pending_logprobs_;
  size_t produced_ = 0;  // bytes of text generated so far in this job
};

}  // namespace thermocline::server
