// The operator benchmark of the sparse FFN (`thermocline bench --ops`): per weight type, dense
// gate+up+down of one token (MatMul over what the engine's dense decode reads: the row groups of
// Q4_0 and the K-quants, the rows of the other types) against the neuron-aware operators
// (prepare + fused row-sparse gate/up + axpy over down_t) at a range of active fractions, on
// one thread pool, interleaved so that machine noise hits both. Random weights of an FFN shape.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/ops/ggml_types.h"
#include "engine/ops/kernels.h"
#include "engine/util/thread_pool.h"

namespace thermocline {

// How the active sets are drawn (fresh for every measurement, sorted as a predictor emits them).
enum class ActivePattern {
  kRandom,  // uniformly at random
  kMixed,   // power-law-like: half a contiguous hot block (fixed per layer), half random
};
const char* ActivePatternName(ActivePattern p);

struct SparseOpBenchOptions {
  int64_t n_embd = 2048;  // the 1.1B (TinyLlama) FFN shape
  int64_t n_ff = 5632;
  std::vector<GgmlType> types = {GgmlType::kF32, GgmlType::kF16, GgmlType::kBF16, GgmlType::kQ8_0,
                                 GgmlType::kQ4_0};
  std::vector<double> fractions = {0.01, 0.02, 0.05, 0.10, 0.20, 0.50, 1.0};
  std::vector<ActivePattern> patterns = {ActivePattern::kRandom};
  int repetitions = 21;  // measurements per (type, pattern, fraction) and path; median taken
  // Copies ("layers") of the weights are cycled through until at least this many bytes lie
  // between two uses of one copy, so that, as in a model, no op finds its weights in cache.
  int64_t min_weight_bytes = int64_t{256} << 20;
  uint64_t seed = 1;
  // The sparse path reads a neuron's gate, up and down_t rows side by side (InterleaveGateUp),
  // as SparseWeights lays them out, instead of as separate matrices.
  bool interleave_gate_up = true;
};

struct SparseOpBenchRow {
  GgmlType type = GgmlType::kF32;
  ActivePattern pattern = ActivePattern::kRandom;
  double fraction = 0;  // requested; active = max(1, round(fraction * n_ff))
  int64_t active = 0;
  // Medians in microseconds. Dense: gate+up = two MatMuls, down = one. Sparse: gate+up =
  // PrepareActivations + SparseGateUp, down = SparseAxpy (no activation is zero).
  double dense_gate_up_us = 0, dense_down_us = 0, dense_us = 0;
  double sparse_gate_up_us = 0, sparse_down_us = 0, sparse_us = 0;
  // Fastest single runs: on a busy machine the least disturbed measurement of each path.
  double dense_min_us = 0, sparse_min_us = 0;
  // Medians of only reading the bytes each path reads (a word per cache line, nothing
  // computed): dense its matrices as streams, sparse its active rows, scattered as they are.
  double dense_read_us = 0, sparse_read_us = 0;
  // The ratio the sparse path would reach if its kernels cost nothing but reading its rows:
  // on a machine that reads scattered rows slower than streams, a floor under ratio().
  double read_floor() const { return dense_us > 0 ? sparse_read_us / dense_us : 0; }
  double ratio() const { return dense_us > 0 ? sparse_us / dense_us : 0; }
  double min_ratio() const { return dense_min_us > 0 ? sparse_min_us / dense_min_us : 0; }
  double ideal() const { return static_cast<double>(active) / n_ff; }
  int64_t n_ff = 0;
};

struct SparseOpBenchResult {
  int threads = 0;
  Isa isa = Isa::kScalar;
  int64_t n_embd = 0, n_ff = 0;
  int repetitions = 0;
  std::vector<int> layers;  // per type: weight copies cycled
  std::vector<SparseOpBenchRow> rows;
};

// Runs the benchmark on `pool` with the best ISA. Errors: bad shapes (not multiples of the
// types' block sizes), fractions outside (0, 1], types without kernels.
absl::StatusOr<SparseOpBenchResult> RunSparseOpBench(ThreadPool& pool,
                                                     const SparseOpBenchOptions& options);

}  // namespace thermocline
