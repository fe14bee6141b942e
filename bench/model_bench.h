// Speed measurements: prefill and decode tokens/s of a model, and the machine's memory read
// bandwidth measured the same way the decode loop reads weights (all threads streaming).
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model/llama_model.h"
#include "engine/runtime/engine.h"
#include "engine/util/read_bandwidth.h"
#include "engine/util/thread_pool.h"

namespace thermocline {

struct BenchOptions {
  int64_t prompt_tokens = 64;
  int64_t gen_tokens = 64;
  int repetitions = 5;
};

struct BenchResult {
  double prompt_tokens_per_s = 0;  // median over repetitions
  double decode_tokens_per_s = 0;  // median over repetitions
  std::vector<double> prompt_runs;
  std::vector<double> decode_runs;
  uint64_t weight_bytes = 0;      // weights read per decoded token
  double decode_weight_gbps = 0;  // weight_bytes * decode_tokens_per_s
};

// Prefill and decode of a fixed pseudo-random prompt on a session of `engine` over `pool`; the
// engine's context must hold prompt_tokens + gen_tokens + 1.
absl::StatusOr<BenchResult> BenchModel(const Engine& engine, ThreadPool& pool,
                                       const BenchOptions& options);

}  // namespace thermocline
