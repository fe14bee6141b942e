// Neuron-aware FFN operators (PowerInfer's): a row-sparse mat-vec for gate/up that computes only
// the rows in an active-index list, and the axpy form of down over its transposed copy down_t
// (each neuron's output weights one contiguous row): out = Σ act_j · down_t[idx_j]. Every type
// with kernels (engine/ops/kernels.h); the scalar references are the parity tests' yardstick.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/ops/kernels.h"
#include "engine/ops/matmul.h"
#include "engine/util/thread_pool.h"

namespace thermocline {

// Per-executor buffers of the sparse operators, sized once so that a token never allocates.
class SparseScratch {
 public:
  // n_threads: the executor's pool size; max_cols: the longest activation row (n_embd) and
  // output row; max_active: the largest active list (n_ff).
  void Reserve(int n_threads, int64_t max_cols, int64_t max_active);
  float* acc(int thread) { return acc_.data() + thread * cols_; }
  float* row(int thread) { return row_.data() + thread * cols_; }
  int32_t* nz_idx() { return nz_idx_.data(); }
  float* nz_act() { return nz_act_.data(); }
  int n_threads() const { return n_threads_; }

 private:
  int n_threads_ = 0;
  int64_t cols_ = 0;
  std::vector<float> acc_;       // (n_threads, max_cols) per-thread accumulators
  std::vector<float> row_;       // (n_threads, max_cols) one dequantized down_t row per thread
  std::vector<int32_t> nz_idx_;  // (max_active) active neurons with a nonzero activation
  std::vector<float> nz_act_;    // (max_active)
};

// Bytes of n activations converted to the vec_dot_type of `k`.
size_t ConvertedBytes(const TypeKernels& k, int64_t n);
// dst = x: (n) converted to the vec_dot_type of `k` (isa: the ISA whose converter to use).
void ConvertActivations(const TypeKernels& k, Isa isa, const float* x, int64_t n, void* dst);

// y[j] = dot(w.row(idx[j]), x) for j < n_active; x already converted (ConvertActivations).
// Threads get equal numbers of rows. k: the kernels of w.type (any ISA).
void SparseMatVec(ThreadPool& pool, const TypeKernels& k, const WeightView& w, const void* x,
                  const int32_t* idx, int64_t n_active, float* y);

// out: (w_t.cols) = Σ_j act[j] · w_t.row(idx[j]) over j < n_active, act[j] == 0 skipped.
// w_t: (n_ff, n_embd), the transposed down. Per-thread accumulators, reduced explicitly;
// threads get equal numbers of nonzero rows. k: the kernels of w_t.type.
void SparseAxpy(ThreadPool& pool, const TypeKernels& k, const WeightView& w_t, const int32_t* idx,
                const float* act, int64_t n_active, float* out, SparseScratch& scratch);

// Scalar references (dequantize each row, float arithmetic, double accumulation).
void SparseMatVecReference(const WeightView& w, const float* x, const int32_t* idx,
                           int64_t n_active, float* y);
void SparseAxpyReference(const WeightView& w_t, const int32_t* idx, const float* act,
                         int64_t n_active, float* out);

// An owned transposed weight matrix (down_t), built once at load.
struct OwnedWeight {
  WeightView view;
  std::vector<uint8_t> data;
};
// down_t: (down.cols, down.rows) of down's type, or F32 when that type's block size does not
// divide down.rows (or it has no kernels). Parallel over the pool.
absl::StatusOr<OwnedWeight> TransposeWeight(ThreadPool& pool, const WeightView& down);
// An F32 or F16 weight over a copy of `values`: (rows, cols).
OwnedWeight MakeWeight(GgmlType type, const float* values, int64_t rows, int64_t cols);

}  // namespace thermocline
