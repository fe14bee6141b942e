// Drives dense inference for profiling: over a text corpus (stories separated by blank lines,
// tokenized and packed into sequences of `chunk` tokens) or over text the model samples itself
// (no dataset needed). The ActivationProfiler attached to the session does the counting.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "engine/model/llama_model.h"
#include "engine/util/thread_pool.h"
#include "offline/profile/activation_profiler.h"
#include "offline/util/progress.h"

namespace thermocline::offline {

struct ProfileRunOptions {
  int64_t tokens = 4096;     // tokens to run through the model (profiled ones, after calibration)
  std::string corpus_path;   // empty: self-generate
  int64_t chunk = 256;       // tokens per sequence; capped at the model's context
  uint64_t seed = 1;         // self-generate sampling
  float temperature = 1.0f;  // self-generate sampling
  // Sees the same FFN calls as the profiler, after it (tests, diagnostics). Not owned.
  FfnObserver* also_observe = nullptr;
};

struct ProfileSource {
  std::string kind;              // "corpus" or "self-generate"
  std::string corpus_hash;       // FNV-1a of the corpus bytes, or of the sampling settings
  int64_t tokens = 0;            // tokens the profiler counted
  size_t corpus_bytes_read = 0;  // the corpus's first bytes the profile read; the rest is unseen
};

// Runs the model until the profiler has counted options.tokens tokens (or the corpus ends,
// which is not an error: the source says how many were counted). Cancelled status when the
// progress callback asks to stop.
absl::StatusOr<ProfileSource> RunProfile(const LlamaModel& model, ThreadPool& pool,
                                         ActivationProfiler& profiler,
                                         const ProfileRunOptions& options,
                                         ProgressReporter* progress);

}  // namespace thermocline::offline
