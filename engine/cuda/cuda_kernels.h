// Launchers of the CUDA kernels (matvec.cu, elementwise.cu), callable from host C++. Internal to
// engine/cuda/: it includes CUDA headers, so nothing outside this folder includes it. Pointers
// are device pointers unless named h_*; every launch is asynchronous on `s`.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "engine/gpu/column_layout.h"
#include "engine/ops/device_kernel.h"

namespace thermocline::cuda {

// Weight types in the kernels' numbering: the weight-type table's device column.
using KType = DeviceKernel;
// Q8_0 and Q4_0 weights are dotted with Q8_0 activations (34-byte blocks of 32), others with F32.
inline bool UsesQ8Activations(KType t) { return DeviceUsesQ8Activations(t); }
constexpr int kQ8BlockBytes = 34;

// A weight matrix on the device in GGUF's layout: rows of `cols` elements, row_bytes apart.
struct DevMatrix {
  KType type = KType::kF32;
  int64_t rows = 0;
  int64_t cols = 0;
  const uint8_t* data = nullptr;
  size_t row_bytes = 0;
};

// A column layout (engine/gpu/column_layout.h) in device memory, with its launch grid.
struct DevColumn {
  gpu::ColumnLayout::Form form = gpu::ColumnLayout::Form::kNone;
  int64_t in = 0, out = 0, out_pad = 0;
  size_t row_bytes = 0;
  int32_t offset = 0;
  const uint8_t* values = nullptr;   // integer forms
  const uint16_t* scales = nullptr;  // (in / 32, out_pad) F16
  const uint16_t* mins = nullptr;    // the same, or null
  DevMatrix rows;                    // kRows: (in, out)
  gpu::ColumnGrid grid;
};

// dst: (n / 32) Q8_0 blocks = x: (n) quantized as ggml's quantize_row_q8_0_ref. n % 32 == 0.
void QuantizeQ8_0(const float* x, int64_t n, void* dst, cudaStream_t s);

// y[j] = dot(w.row(rows ? rows[j] : j), x) for j < n_out, and only j < *count when count is
// given (a device-side length, for active lists produced on the device). x: F32 (w.cols) or
// Q8_0 blocks as UsesQ8Activations(w.type) says.
void MatVec(const DevMatrix& w, const void* x, const int32_t* rows, const int32_t* count,
            int64_t n_out, float* y, cudaStream_t s);

// The number of partial sums SparseAxpy splits max_active rows into.
int AxpySplits(int64_t max_active);
// out: (w_t.cols) = Σ_{j < *count} act[j] · w_t.row(rows[j]), act[j] == 0 skipped. Each of
// AxpySplits(max_active) slices of j writes partial: (splits, w_t.cols); the slices are then
// summed in a fixed order (deterministic, no atomics). *count <= max_active.
void SparseAxpy(const DevMatrix& w_t, const int32_t* rows, const float* act, const int32_t* count,
                int64_t max_active, float* partial, float* out, cudaStream_t s);

// The column-sparse mat-vec of input-sparse layers: y: (c.out) = Σ over the inputs i with
// |x_i| > threshold and x_i != 0 of W[:, i] · x_i, reading only those inputs' rows of c. The
// integer forms quantize each block of 32 inputs' kept entries to int8 as the CPU does
// (ColumnInput: d = amax / 127, q = round-to-even(x / d)) and sum q · u in integers, so that each
// block's contribution to an output is the CPU reference's; kRows sums x_i · w in floats. The
// ranges of c.grid write partial: (c.grid.splits, c.out), then are added in order into y.
void ColumnMatVec(const DevColumn& c, const float* x, float threshold, float* partial, float* y,
                  cudaStream_t s);

// out: (w.rows, w.cols) IEEE halves = w dequantized (for cuBLAS prefill products).
void DequantizeToF16(const DevMatrix& w, void* out, cudaStream_t s);
// out: (n) halves = x rounded to nearest.
void F32ToF16(const float* x, int64_t n, void* out, cudaStream_t s);

// out = x / rms(x) * w; (n).
void RmsNorm(const float* x, const float* w, int64_t n, float eps, float* out, cudaStream_t s);
// In place: (x[2i], x[2i+1]) of each head rotated by cos_sin[2i], cos_sin[2i+1], i < rope_dim/2.
void Rope(float* x, int64_t n_heads, int64_t head_dim, int64_t rope_dim, const float* cos_sin,
          cudaStream_t s);
// act: 0 SwiGLU, 1 ReGLU, 2 dReLU (FfnActivation's order). gate[j] := act(gate[j], up[j]) for
// j < (count ? *count : n), then 0 where |gate[j]| <= magnitude_threshold; *fired (optional)
// += the number left nonzero.
void GatedActivation(int act, float* gate, const float* up, const int32_t* count, int64_t n,
                     float magnitude_threshold, int32_t* fired, cudaStream_t s);
// One query against a KV cache: q (n_head, head_dim), k/v (n_kv, n_head_kv * head_dim),
// out (n_head, head_dim); scores: (n_head, n_kv) scratch.
void Attention(const float* q, const float* k, const float* v, int64_t n_kv, int64_t n_head,
               int64_t n_head_kv, int64_t head_dim, float* scores, float* out, cudaStream_t s);
// The same with the query's position on the device (n_kv = *pos + 1), so that one launch (a
// CUDA graph's node) serves every position; scores: (n_head, n_ctx), *pos < n_ctx. half: the
// caches hold IEEE halves, and q and the softmax weights are rounded to half before their
// products, as the CPU's F16 cache computes (kernels.h's AttendHeadF16); else floats.
void AttentionAt(const float* q, const void* k, const void* v, bool half, const int32_t* pos,
                 int64_t n_ctx, int64_t n_head, int64_t n_head_kv, int64_t head_dim, float* scores,
                 float* out, cudaStream_t s);
// Row *pos of the caches := k, v (rounded to nearest when half); (kv_dim) each.
void StoreKv(const float* k, const float* v, void* k_cache, void* v_cache, bool half,
             int64_t kv_dim, const int32_t* pos, cudaStream_t s);
// x += y; (n).
void Add(float* x, const float* y, int64_t n, cudaStream_t s);
// h = max(0, h + b); (n).
void BiasRelu(float* h, const float* b, int64_t n, cudaStream_t s);
// idx = the k < n (ascending) with logits[k] + b2[table[k]] > threshold; *count = how many.
void ThresholdCompact(const float* logits, const float* b2, const int32_t* table, int64_t n,
                      float threshold, int32_t* idx, int32_t* count, cudaStream_t s);
// Gate-first: idx = the slots k < n (ascending) with |silu(gate[k])| · (scale ? scale[k] : 1) >
// threshold, kept[j] = gate[idx[j]]; *count = how many. One thread block.
void GateFirstCompact(const float* gate, const float* scale, int64_t n, float threshold,
                      int32_t* idx, float* kept, int32_t* count, cudaStream_t s);
// The resident predictor's split: every neuron k < n with logits[k] + b2[k] > threshold (all of
// them when logits is null), the device's (compact_of[k] >= 0) as compact rows into dev_idx, the
// host's as neuron ids into host_idx, both ascending, with their counts.
void SplitCompact(const float* logits, const float* b2, const int32_t* compact_of, int64_t n,
                  float threshold, int32_t* dev_idx, int32_t* dev_count, int32_t* host_idx,
                  int32_t* host_count, cudaStream_t s);
// idx[k] = k for k < n; *count = n.
void Iota(int32_t* idx, int64_t n, int32_t* count, cudaStream_t s);

}  // namespace thermocline::cuda
