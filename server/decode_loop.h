// The execute step: one slot's batch-size-1 decode loop. It owns the slot's thread pool and one
// engine session (engine/runtime/engine.h) per served model, created on the model's first job
// (or up front by AddModel), and runs the jobs the scheduler hands it through the engine's
// Generate loop (engine/runtime/generate.h). This file is that loop's per-token callback: stop
// strings, logprobs, streaming, the deadline, cancellation and metrics. Between jobs it picks up
// a model's new engine (a sidecar that arrived) and drops the sessions of models the registry
// has unloaded (each session shares ownership of its loaded model, so that is when their memory
// can go). It never decides what runs.
//
// The prefix cache: each session remembers the token ids its KV cache holds (the last job's
// prompt and output). A job whose prompt begins with some of them keeps that prefix of the KV
// cache (Session::Truncate) and prefills only the rest; the scheduler asks CachedPrefix to send
// a job to the slot that holds most of its prompt.
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "engine/runtime/engine.h"
#include "engine/runtime/generate.h"
#include "engine/util/thread_pool.h"
#include "server/job.h"
#include "server/metrics.h"
#include "server/stop_matcher.h"

namespace thermocline::server {

struct LoadedModel;

struct DecodeLoopOptions {
  int threads = 1;
  bool prompt_cache = true;  // reuse the KV cache of the prompt prefix a job shares with the last
  int decode_delay_ms = 0;   // debug: sleep after each token
  int prefill_delay_ms = 0;  // debug: sleep after each prefill chunk
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
    StopReason reason = StopReason::kEndOfGeneration;
    GenerationStats stats;
    absl::Status error;
  };
  struct PrefixMatch {
    int64_t shared = 0;  // prompt tokens a job would find in the KV cache
    int64_t held = 0;    // tokens the KV cache holds
  };
  // What a job of `model` with `prompt` would find here: the common prefix of the prompt and
  // the session's tokens, less the last prompt token (always evaluated). Zeros with the cache
  // off or no session of the model's current engine. Thread-safe; meaningful while no job runs
  // here.
  PrefixMatch CachedPrefix(const LoadedModel& model, absl::Span<const int32_t> prompt);

  // Runs `job` to its end, streaming through job.sink->OnDelta; the caller frees the slot and
  // then passes the outcome to job.sink->OnFinish. Not thread-safe: the slot thread alone
  // calls it.
  Outcome Run(Job& job);

 private:
  class TokenSink;
  StopReason Generate(Job& job, GenerationStats* stats, absl::Status* error);
  // An embedding job (server/decode_loop_embed.cc).
  StopReason Embed(Job& job, GenerationStats* stats, absl::Status* error);

  DecodeLoopOptions options_;
  Metrics* metrics_;
  ThreadPool pool_;
  struct PerModel {
    std::shared_ptr<const LoadedModel> model;  // what `session` runs; declared first: freed last
    std::unique_ptr<EngineSession> session;    // holds its engine
    // The token ids of the session's KV cache, positions 0 .. n_past - 1 (the prefix cache).
    std::vector<int32_t> tokens;
  };
  // models_[index] when it holds a session of `model` on its current engine; else null. Under
  // models_mu_.
  PerModel* Current(const LoadedModel& model);
  static void Drop(PerModel& m);
  // The model's session on its current engine; created on first use, and again when the
  // model's engine has changed. Marks it running (until Finish).
  absl::StatusOr<PerModel*> Prepare(const std::shared_ptr<const LoadedModel>& model);
  // No job runs any more: drops what ReleaseUnloaded had to leave.
  void Finish();
  std::mutex models_mu_;          // guards models_ (a job's session is its slot's alone)
  std::vector<PerModel> models_;  // by ServedModel::index
  int running_ = -1;              // models_ index of the job running now
  // Reused across jobs so that a token costs no allocation.
  StopMatcher stop_;
  std::vector<TokenLogprobs> pending_logprobs_;
};

}  // namespace thermocline::server
