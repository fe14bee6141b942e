// Neuron-aware FFN operators (PowerInfer's): a row-sparse mat-vec for gate/up that computes only
// the rows in an active-index list, and the axpy form of down over its transposed copy down_t
// (each neuron's output weights one contiguous row): out = Σ act_j · down_t[idx_j]. Every type
// with kernels (engine/ops/kernels.h); the scalar references are the parity tests' yardstick.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model/activation.h"
#include "engine/ops/kernels.h"
#include "engine/ops/matmul.h"
#include "engine/ops/weight_layout.h"
#include "engine/util/thread_pool.h"

namespace thermocline {

// How the operators fetch scattered rows (and the benchmarks' read floors, which must fetch as
// they do): each active row's first kPrefetchBytes are prefetched kPrefetchRows rows before it is
// computed on.
// kPrefetchRows: far enough that a row's DRAM latency hides behind the work on the rows before
// it. Measured end to end on the 1.1B Q4_0 synthetic model, 2 threads, quiet machine: 4 rows
// 1.45x over dense, 8 rows 1.50x, 16 rows 1.57-1.64x, 32 rows 1.58x (with kPrefetchBytes 2048:
// whole Q4_0/Q8_0 rows); 4 rows of 1 KB again: 1.43-1.55x. The operator benchmark (bench --ops)
// cannot tell them apart.
// kPrefetchBytes: all of a 2048-wide Q4_0 or Q8_0 row. The hardware prefetchers stream the rest
// of a long row once its first lines have been read in order, and a prefetch per line of an
// 8 KB F32 row would cost more instructions than it saves.
constexpr int64_t kPrefetchRows = 16;
constexpr size_t kPrefetchBytes = 2048;
inline void PrefetchRow(const uint8_t* p, size_t bytes) {
  const size_t end = bytes < kPrefetchBytes ? bytes : kPrefetchBytes;
  for (size_t o = 0; o < end; o += 64) __builtin_prefetch(p + o);
}

// Per-executor buffers of the sparse operators, sized once so that a token never allocates.
class SparseScratch {
 public:
  // n_threads: the executor's pool size; max_cols: the longest activation row (n_embd) and
  // output row; max_active: the largest active list (n_ff).
  void Reserve(int n_threads, int64_t max_cols, int64_t max_active);
  float* acc(int thread) { return acc_.data() + thread * cols_; }
  int32_t* nz_idx() { return nz_idx_.data(); }
  float* nz_act() { return nz_act_.data(); }
  int n_threads() const { return n_threads_; }

 private:
  int n_threads_ = 0;
  int64_t cols_ = 0;
  std::vector<float> acc_;       // (n_threads, max_cols) per-part accumulators (part 0 unused)
  std::vector<int32_t> nz_idx_;  // (max_active) active neurons with a nonzero activation
  std::vector<float> nz_act_;    // (max_active)
};

// ---- Gate and up: row-sparse mat-vec over activations prepared once per token ----

// Whether the row-sparse operators take rows of `type` (the type table's sparse column).
bool SparseRowsSupported(GgmlType type);

// Bytes of x: (n) prepared for the row dots of weights of `type`, for any ISA (int8 panels for
// Q8_0/Q4_0, F32 for float types; engine/ops/row_dot.h).
size_t PreparedBytes(GgmlType type, int64_t n);
// dst = x: (n) prepared for the row dots of `type` weights on `isa`. Once per token and type.
void PrepareActivations(GgmlType type, Isa isa, const float* x, int64_t n, void* dst);

// y[j] = dot(w.row(idx[j]), x) for j < n_active; x from PrepareActivations(w.type, isa).
// Parts of equal numbers of rows, as many as the work pays for (a tiny list stays on the
// calling thread).
void SparseMatVec(ThreadPool& pool, Isa isa, const WeightView& w, const void* x, const int32_t* idx,
                  int64_t n_active, float* y);
// Gate and up fused in one pass over the active list (one hand-off to the pool):
// y_gate[j] = dot(gate.row(idx[j]), x_gate), y_up[j] = dot(up.row(idx[j]), x_up); x_gate and
// x_up from PrepareActivations of gate.type / up.type (the same buffer when the types match).
// gate, up: (n_ff, n_embd).
void SparseGateUp(ThreadPool& pool, Isa isa, const WeightView& gate, const void* x_gate,
                  const WeightView& up, const void* x_up, const int32_t* idx, int64_t n_active,
                  float* y_gate, float* y_up);

// ---- Single-thread forms, for callers that split a token's work among threads themselves ----

// y[j] = dot(w.row(idx[j]), x) for j < n, on the calling thread (SparseMatVec's part).
void SparseRowDots(Isa isa, const WeightView& w, const void* x, const int32_t* idx, int64_t n,
                   float* y);
// out[0, cols) += Σ_j act[j] · w_t.row(idx[j])[col0, col0 + cols), j < n, on the calling thread
// (every listed row is read: drop zero activations first). col0 and cols: multiples of w_t's
// block size (cols < w_t.cols: a column slice of the rows).
void SparseAxpyRows(Isa isa, const WeightView& w_t, int64_t col0, int64_t cols, const int32_t* idx,
                    const float* act, int64_t n, float* out);

// The gate-first FFN (CATS-style) of the n candidate slots idx[0, n) on the calling thread:
// every candidate's gate row, then up and down only where the gate's activation is large enough.
//   g = gate.row(s) · x_gate; a = act(g) (SiLU or GELU-tanh: `act` must not be gate-decided);
//   kept: |a| · scale[s] > gate_threshold (scale null: 1); u = up.row(s) · x_up for the kept;
//   v = a · u, dropped where
//   |v| <= act_threshold or v == 0; out[0, down_t.cols) += Σ v · down_t.row(s).
// g, u: (n) scratch. On return idx[0, m) and g[0, m) hold the slots that fired and their
// activations; returns m. *n_up (optional): the up rows read, and up_idx (optional, n): their
// slots.
int64_t GateFirstRows(Isa isa, FfnActivation act, const WeightView& gate, const void* x_gate,
                      const WeightView& up, const void* x_up, const WeightView& down_t,
                      int32_t* idx, int64_t n, float gate_threshold, const float* scale,
                      float act_threshold, float* g, float* u, float* out, int64_t* n_up = nullptr,
                      int32_t* up_idx = nullptr);
// Its scalar reference: dequantized rows, float x, double sums; the same outputs.
int64_t GateFirstRowsReference(FfnActivation act, const WeightView& gate, const WeightView& up,
                               const WeightView& down_t, const float* x, int32_t* idx, int64_t n,
                               float gate_threshold, const float* scale, float act_threshold,
                               float* g, float* out);
// act(g) of a gated activation's gate alone (SiLU, GELU-tanh; ReLU for the others).
float GateActivation(FfnActivation act, float g);

// A neuron's rows stored side by side, built once at load: gate row i, then up row i (and with
// down_t, down_t row i), then neuron i + 1's, so that an active neuron's weights are one
// contiguous read (random rows cost more than their bytes: each starts a new DRAM access the
// prefetchers don't foresee, and what they stream past the end of a gate row is then the rest of
// that neuron, not the next neuron's gate row). The rows may differ in type (a K-quant model's
// down_t is Q8_0): a neuron takes the sum of its rows' bytes. `gate`, `up` and `down_t` view the
// storage with that stride; pass them to the operators as they are. Costs a copy of the
// matrices.
struct InterleavedGateUp {
  OwnedWeight storage;  // all of it; its view is `gate`'s
  WeightView gate, up;  // (n_ff, n_embd) each, row_bytes = a neuron's bytes
  WeightView down_t;    // (n_ff, n_embd) over the storage when interleaved too; else data null
};
// gate, up: (n_ff, n_embd). Parallel over the pool. With `order` (n_ff entries), neuron k's rows
// are gate's and up's rows order[k]. down_t, when given: (n_ff, n_embd), already in the result's
// order (its row k goes with neuron k).
absl::StatusOr<InterleavedGateUp> InterleaveGateUp(ThreadPool& pool, const WeightView& gate,
                                                   const WeightView& up,
                                                   const int32_t* order = nullptr,
                                                   const WeightView* down_t = nullptr);

// ---- Down: axpy over down_t rows ----

// out: (w_t.cols) = Σ_j act[j] · w_t.row(idx[j]) over j < n_active, act[j] == 0 skipped.
// w_t: (n_ff, n_embd), the transposed down. Parts of equal numbers of nonzero rows, each with
// its own accumulator (part 0 writes out), reduced explicitly after they finish. The SIMD
// kernels of `isa`; scratch reserved for at least pool.size() threads and n_active rows.
void SparseAxpy(ThreadPool& pool, Isa isa, const WeightView& w_t, const int32_t* idx,
                const float* act, int64_t n_active, float* out, SparseScratch& scratch);

// out: (n, w_t.cols) = act: (n, w_t.rows) · w_t, zero activations skipped: the down of a prefill
// chunk over down_t (row i of act in slot order). Parallel over column slices of w_t small
// enough to stay in cache while the n tokens pass over them, so w_t is read from memory once per
// call; each output element is summed by one thread in row order (deterministic). `scratch`:
// the nonzero lists, reserved with ReserveAxpyTokens.
class AxpyTokensScratch {
 public:
  void Reserve(int64_t max_tokens, int64_t max_rows);

 private:
  friend void SparseAxpyTokens(ThreadPool&, Isa, const WeightView&, const float*, int64_t, float*,
                               AxpyTokensScratch&);
  int64_t max_tokens_ = 0, max_rows_ = 0;
  std::vector<int32_t> idx_;    // (max_tokens, max_rows)
  std::vector<float> act_;      // (max_tokens, max_rows)
  std::vector<int64_t> count_;  // (max_tokens)
};
void SparseAxpyTokens(ThreadPool& pool, Isa isa, const WeightView& w_t, const float* act, int64_t n,
                      float* out, AxpyTokensScratch& scratch);

// ---- The first interface, kept: `k` is KernelsFor(w.type, isa) and selects the ISA ----

// PreparedBytes of the type whose kernels `k` are (for any of its ISAs).
size_t ConvertedBytes(const TypeKernels& k, int64_t n);
// PrepareActivations of the type whose kernels `k` are, on `isa`.
void ConvertActivations(const TypeKernels& k, Isa isa, const float* x, int64_t n, void* dst);
// SparseMatVec on the ISA of `k`; x from ConvertActivations(k, that isa).
void SparseMatVec(ThreadPool& pool, const TypeKernels& k, const WeightView& w, const void* x,
                  const int32_t* idx, int64_t n_active, float* y);
// SparseAxpy on the ISA of `k` (the kernels of w_t.type).
void SparseAxpy(ThreadPool& pool, const TypeKernels& k, const WeightView& w_t, const int32_t* idx,
                const float* act, int64_t n_active, float* out, SparseScratch& scratch);

// Scalar references (dequantize each row, float arithmetic, double accumulation).
void SparseMatVecReference(const WeightView& w, const float* x, const int32_t* idx,
                           int64_t n_active, float* y);
void SparseAxpyReference(const WeightView& w_t, const int32_t* idx, const float* act,
                         int64_t n_active, float* out);

}  // namespace thermocline
