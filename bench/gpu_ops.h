// Every CUDA operator behind a CUDA-free interface that takes host arrays: inputs are uploaded,
// the kernel runs on the device, the result is copied back. This is what the parity harness
// (tests/unit/cuda_ops_test.cc) compares to the CPU reference and what the kernel benchmark
// (tests/gpu/cuda_bench.cc) times; the decode path uses the same kernels on resident data
// (engine/gpu/gpu_ffn_executor.h). Not for the hot path: calls allocate and synchronize.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/gpu/column_layout.h"
#include "engine/gpu/gpu_memory.h"
#include "engine/model/hparams.h"
#include "engine/ops/matmul.h"

namespace thermocline::gpu {

class GpuOps {
 public:
  // A CUDA stream, a cuBLAS handle (its workspace accounted) and a memory budget of
  // `memory_cap` bytes on device `device`. UnavailableError without a device.
  static absl::StatusOr<std::unique_ptr<GpuOps>> Create(
      uint64_t memory_cap = MemoryBudget::kUnlimited, int device = 0);
  virtual ~GpuOps() = default;

  virtual const MemoryBudget& budget() const = 0;

  // y: (w.rows) = w · x, x: (w.cols). For Q8_0/Q4_0 weights x is quantized to Q8_0 on the device
  // exactly as the CPU does (ggml's quantize_row_q8_0_ref) and dotted block by block in int8.
  virtual absl::Status MatVec(const WeightView& w, const float* x, float* y) = 0;
  // Prefill product through cuBLAS: y: (n_tokens, w.rows) = x: (n_tokens, w.cols) · wᵀ. F32
  // weights in F32 (SGEMM); other types dequantized to F16 and x rounded to F16, F32 accumulate.
  virtual absl::Status Gemm(const WeightView& w, const float* x, int64_t n_tokens, float* y) = 0;

  // Neuron-aware operators. The device holds rows table[k] of w compactly (compact row k is
  // neuron table[k]); `active` lists compact rows.
  // y[j] = dot(w.row(table[active[j]]), x), j < active.size() (x converted as in MatVec).
  virtual absl::Status SparseMatVec(const WeightView& w, absl::Span<const int32_t> table,
                                    absl::Span<const int32_t> active, const float* x, float* y) = 0;
  // out: (w_t.cols) = Σ_j act[j] · w_t.row(table[active[j]]); w_t is a transposed down.
  virtual absl::Status SparseAxpy(const WeightView& w_t, absl::Span<const int32_t> table,
                                  absl::Span<const int32_t> active, const float* act,
                                  float* out) = 0;
  // The column-sparse mat-vec of input-sparse layers over a layout (its arrays on the host):
  // y: (c.out) = Σ over the inputs with |x_i| > threshold, x_i != 0, of W[:, i] · x_i;
  // x: (c.in).
  virtual absl::Status ColumnMatVec(const ColumnLayout& c, const float* x, float threshold,
                                    float* y) = 0;
  // Gate-first's list: the slots k < gate.size() (ascending) with |silu(gate[k])| · scale[k]
  // > threshold (scale empty: 1), and their gate values.
  struct GateFirstList {
    std::vector<int32_t> idx;
    std::vector<float> gate;
  };
  virtual absl::StatusOr<GateFirstList> GateFirstCompact(absl::Span<const float> gate,
                                                         absl::Span<const float> scale,
                                                         float threshold) = 0;
  // Compact rows k (ascending) with fc2.row(table[k]) · relu(fc1 · x + b1) + b2[table[k]] >
  // threshold. fc1: (rank, n_embd), fc2: (n_ff, rank).
  virtual absl::StatusOr<std::vector<int32_t>> Predict(const WeightView& fc1,
                                                       absl::Span<const float> b1,
                                                       const WeightView& fc2,
                                                       absl::Span<const float> b2,
                                                       absl::Span<const int32_t> table,
                                                       float threshold, const float* x) = 0;

  // out = x / rms(x) * weight; (n).
  virtual absl::Status RmsNorm(const float* x, const float* weight, int64_t n, float eps,
                               float* out) = 0;
  // In place, llama's adjacent-pair RoPE with cos_sin: (rope_dim) as Session computes it.
  virtual absl::Status Rope(float* x, int64_t n_heads, int64_t head_dim, int64_t rope_dim,
                            const float* cos_sin) = 0;
  // gate := act(gate) * up (engine/model/cpu_ops.h GatedActivation); (n).
  virtual absl::Status GatedActivation(FfnActivation act, float* gate, const float* up,
                                       int64_t n) = 0;
  // Decode attention of one query q: (n_head, head_dim) over a KV cache k, v: (n_kv, kv_dim),
  // kv_dim = n_head_kv * head_dim, causal up to n_kv. out: (n_head, head_dim).
  virtual absl::Status Attention(const float* q, const float* k_cache, const float* v_cache,
                                 int64_t n_kv, int64_t n_head, int64_t n_head_kv, int64_t head_dim,
                                 float* out) = 0;

  // Benchmarks on device-resident data: median seconds of one kernel call over `iters` calls.
  virtual absl::StatusOr<double> TimeMatVec(const WeightView& w, int iters) = 0;
  // Sparse gate-style mat-vec and down axpy over the rows of w (all on the device), every
  // `stride`-th row active.
  virtual absl::StatusOr<double> TimeSparseMatVec(const WeightView& w, int stride, int iters) = 0;
  virtual absl::StatusOr<double> TimeSparseAxpy(const WeightView& w_t, int stride, int iters) = 0;
  // The column-sparse mat-vec of c over x: (c.in) at `threshold`, all on the device.
  virtual absl::StatusOr<double> TimeColumnMatVec(const ColumnLayout& c, const float* x,
                                                  float threshold, int iters) = 0;
};

}  // namespace thermocline::gpu
