// The small kernels of a llama layer on the GPU: RMSNorm, RoPE, gated activations (with the
// sparse path's magnitude threshold and fired count), decode attention over a device KV cache,
// and the predictor's bias+ReLU and threshold-to-active-list. Same formulas as
// engine/model/cpu_ops.h and engine/model/session.cc, float accumulation.
#include <cuda_fp16.h>

#include <type_traits>

#include "engine/cuda/cuda_kernels.h"

namespace thermocline::cuda {
namespace {

constexpr int kThreads = 256;

unsigned Blocks(int64_t n, int per_block) {
  return static_cast<unsigned>((n + per_block - 1) / per_block);
}

// Sum / max of v over the block (blockDim.x a multiple of 32, <= 1024); every thread gets it.
template <bool kMax>
__device__ float BlockReduce(float v, float* shared /* 32 floats */) {
  for (int o = 16; o > 0; o /= 2) {
    const float u = __shfl_xor_sync(0xffffffffu, v, o);
    v = kMax ? fmaxf(v, u) : v + u;
  }
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, n_warps = blockDim.x / 32;
  __syncthreads();  // shared may still be read by a previous reduction
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = lane < n_warps ? shared[lane] : (kMax ? -INFINITY : 0.0f);
  for (int o = 16; o > 0; o /= 2) {
    const float u = __shfl_xor_sync(0xffffffffu, v, o);
    v = kMax ? fmaxf(v, u) : v + u;
  }
  return v;
}

__global__ void RmsNormKernel(const float* x, const float* w, int64_t n, float eps, float* out) {
  __shared__ float shared[32];
  float sum = 0.0f;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) sum += x[i] * x[i];
  sum = BlockReduce<false>(sum, shared);
  const float scale = 1.0f / sqrtf(sum / static_cast<float>(n) + eps);
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) out[i] = x[i] * scale * w[i];
}

__global__ void RopeKernel(float* x, int64_t n_heads, int64_t head_dim, int64_t half_rope,
                           const float* cos_sin) {
  const int64_t item = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (item >= n_heads * half_rope) return;
  const int64_t h = item / half_rope, i = item % half_rope;
  float* v = x + h * head_dim + 2 * i;
  const float c = cos_sin[2 * i], s = cos_sin[2 * i + 1];
  const float x0 = v[0], x1 = v[1];
  v[0] = x0 * c - x1 * s;
  v[1] = x0 * s + x1 * c;
}

__global__ void GatedActivationKernel(int act, float* gate, const float* up, const int32_t* count,
                                      int64_t n, float magnitude_threshold, int32_t* fired) {
  const int64_t j = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t len = count != nullptr ? *count : n;
  int nonzero = 0;
  if (j < len) {
    const float g = gate[j], u = up[j];
    float a;
    if (act == 0) {
      a = g / (1.0f + expf(-g)) * u;
    } else if (act == 1) {
      a = g > 0.0f ? g * u : 0.0f;
    } else {
      a = (g > 0.0f && u > 0.0f) ? g * u : 0.0f;
    }
    if (fabsf(a) <= magnitude_threshold) a = 0.0f;
    gate[j] = a;
    nonzero = a != 0.0f;
  }
  if (fired != nullptr) {
    const int block_count = __syncthreads_count(nonzero);
    if (threadIdx.x == 0 && block_count > 0) atomicAdd(fired, block_count);
  }
}

// A cache element as float.
__device__ __forceinline__ float CacheAt(const float* p, int64_t i) { return p[i]; }
__device__ __forceinline__ float CacheAt(const __half* p, int64_t i) { return __half2float(p[i]); }

// One block per head. Scores in global scratch; out = Σ_j softmax_j · v_j, computed by
// kThreads / head_dim groups of threads over interleaved j, summed in a fixed order.
// n_kv: *pos + 1 when pos is given; scores of head h start at h * score_stride. T: float, or
// __half for an F16 cache, whose q and softmax weights are rounded to half (the CPU's
// AttendHeadF16).
template <class T>
__global__ void AttentionKernel(const float* q, const T* k, const T* v, int64_t n_kv,
                                const int32_t* pos, int64_t score_stride, int64_t n_head,
                                int64_t group, int64_t head_dim, int64_t kv_dim, float* scores,
                                float* out) {
  constexpr bool kHalf = std::is_same_v<T, __half>;
  __shared__ float shared[32];
  __shared__ float acc[kThreads];
  if (pos != nullptr) n_kv = *pos + 1;
  const int64_t head = blockIdx.x;
  const int64_t kv_off = (head / group) * head_dim;
  const float* qh = q + head * head_dim;
  float* sc = scores + head * score_stride;
  const float scale = 1.0f / sqrtf(static_cast<float>(head_dim));
  float max = -INFINITY;
  for (int64_t j = threadIdx.x; j < n_kv; j += blockDim.x) {
    const T* kj = k + j * kv_dim + kv_off;
    float dot = 0.0f;
    for (int64_t i = 0; i < head_dim; ++i) {
      const float qi = kHalf ? __half2float(__float2half_rn(qh[i])) : qh[i];
      dot += qi * CacheAt(kj, i);
    }
    sc[j] = dot * scale;
    max = fmaxf(max, sc[j]);
  }
  max = BlockReduce<true>(max, shared);
  float sum = 0.0f;
  for (int64_t j = threadIdx.x; j < n_kv; j += blockDim.x) {
    const float e = expf(sc[j] - max);
    sc[j] = e;
    sum += e;
  }
  sum = BlockReduce<false>(sum, shared);  // its __syncthreads also publishes sc to the block
  const float inv = 1.0f / sum;
  if constexpr (kHalf) {
    for (int64_t j = threadIdx.x; j < n_kv; j += blockDim.x) {
      sc[j] = __half2float(__float2half_rn(sc[j] * inv));
    }
    __syncthreads();
  }
  const int64_t groups = head_dim <= blockDim.x ? blockDim.x / head_dim : 1;
  const int64_t g = threadIdx.x / head_dim;
  for (int64_t i0 = 0; i0 < head_dim; i0 += blockDim.x) {
    const int64_t i = i0 + threadIdx.x % head_dim;
    float a = 0.0f;
    if (g < groups && i < head_dim) {
      for (int64_t j = g; j < n_kv; j += groups) a += sc[j] * CacheAt(v, j * kv_dim + kv_off + i);
    }
    __syncthreads();
    acc[threadIdx.x] = a;
    __syncthreads();
    if (threadIdx.x < head_dim && i0 + threadIdx.x < head_dim) {
      float total = 0.0f;
      for (int64_t gg = 0; gg < groups; ++gg) total += acc[gg * head_dim + threadIdx.x];
      out[head * head_dim + i0 + threadIdx.x] = kHalf ? total : total * inv;
    }
  }
}

template <class T>
__global__ void StoreKvKernel(const float* k, const float* v, T* k_cache, T* v_cache,
                              int64_t kv_dim, const int32_t* pos) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= kv_dim) return;
  const int64_t row = static_cast<int64_t>(*pos) * kv_dim;
  if constexpr (std::is_same_v<T, __half>) {
    k_cache[row + i] = __float2half_rn(k[i]);
    v_cache[row + i] = __float2half_rn(v[i]);
  } else {
    k_cache[row + i] = k[i];
    v_cache[row + i] = v[i];
  }
}

__global__ void AddKernel(float* x, const float* y, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) x[i] += y[i];
}

__global__ void BiasReluKernel(float* h, const float* b, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) h[i] = fmaxf(0.0f, h[i] + b[i]);
}

// One block of 1024 threads; thread t owns the contiguous slice [t·chunk, (t+1)·chunk), so the
// list comes out ascending after an exclusive scan of the slice counts.
constexpr int kCompactThreads = 1024;

// The compaction of the k < n with fires(k): emit(k, at) for each, `at` its place in the
// ascending list; returns the list's length (to every thread).
template <class Fires, class Emit>
__device__ int Compact(int64_t n, Fires fires, Emit emit) {
  __shared__ int offsets[kCompactThreads];
  const int64_t chunk = (n + kCompactThreads - 1) / kCompactThreads;
  const int64_t begin = threadIdx.x * chunk;
  const int64_t end = min(begin + chunk, n);
  int mine = 0;
  for (int64_t k = begin; k < end; ++k) mine += fires(k);
  offsets[threadIdx.x] = mine;
  __syncthreads();
  for (int stride = 1; stride < kCompactThreads; stride *= 2) {  // inclusive Hillis-Steele scan
    const int add = threadIdx.x >= stride ? offsets[threadIdx.x - stride] : 0;
    __syncthreads();
    offsets[threadIdx.x] += add;
    __syncthreads();
  }
  int at = offsets[threadIdx.x] - mine;
  for (int64_t k = begin; k < end; ++k) {
    if (fires(k)) emit(k, at++);
  }
  return offsets[kCompactThreads - 1];
}

__global__ void ThresholdCompactKernel(const float* logits, const float* b2, const int32_t* table,
                                       int64_t n, float threshold, int32_t* idx, int32_t* count) {
  const int total = Compact(
      n, [&](int64_t k) { return logits[k] + b2[table[k]] > threshold; },
      [&](int64_t k, int at) { idx[at] = static_cast<int32_t>(k); });
  if (threadIdx.x == 0) *count = total;
}

// One block: the gate-first slots k < n with |silu(gate[k])| · scale[k] > threshold, ascending,
// and their gate values.
__global__ void GateFirstCompactKernel(const float* gate, const float* scale, int64_t n,
                                       float threshold, int32_t* idx, float* kept, int32_t* count) {
  const int total = Compact(
      n,
      [&](int64_t k) {
        const float g = gate[k];
        const float a = fabsf(g / (1.0f + expf(-g)));
        return (scale != nullptr ? a * scale[k] : a) > threshold;
      },
      [&](int64_t k, int at) {
        idx[at] = static_cast<int32_t>(k);
        kept[at] = gate[k];
      });
  if (threadIdx.x == 0) *count = total;
}

// One block: the neurons k < n with logits[k] + b2[k] > threshold, split by where they run:
// compact_of[k] >= 0 (the device's) into dev_idx as compact rows, the others into host_idx as
// neuron ids; both lists ascending, each thread's stretch of k written at its scanned offsets.
// logits null: every neuron is active (a layer without a predictor).
__global__ void SplitCompactKernel(const float* logits, const float* b2, const int32_t* compact_of,
                                   int64_t n, float threshold, int32_t* dev_idx, int32_t* dev_count,
                                   int32_t* host_idx, int32_t* host_count) {
  __shared__ int dev_off[kCompactThreads];
  __shared__ int host_off[kCompactThreads];
  const int64_t chunk = (n + kCompactThreads - 1) / kCompactThreads;
  const int64_t begin = threadIdx.x * chunk;
  const int64_t end = min(begin + chunk, n);
  int dev = 0, host = 0;
  for (int64_t k = begin; k < end; ++k) {
    if (logits == nullptr || logits[k] + b2[k] > threshold) (compact_of[k] >= 0 ? dev : host) += 1;
  }
  dev_off[threadIdx.x] = dev;
  host_off[threadIdx.x] = host;
  __syncthreads();
  for (int stride = 1; stride < kCompactThreads; stride *= 2) {  // inclusive Hillis-Steele scans
    const int add_dev = threadIdx.x >= stride ? dev_off[threadIdx.x - stride] : 0;
    const int add_host = threadIdx.x >= stride ? host_off[threadIdx.x - stride] : 0;
    __syncthreads();
    dev_off[threadIdx.x] += add_dev;
    host_off[threadIdx.x] += add_host;
    __syncthreads();
  }
  int at_dev = dev_off[threadIdx.x] - dev, at_host = host_off[threadIdx.x] - host;
  for (int64_t k = begin; k < end; ++k) {
    if (logits == nullptr || logits[k] + b2[k] > threshold) {
      if (compact_of[k] >= 0) {
        dev_idx[at_dev++] = compact_of[k];
      } else {
        host_idx[at_host++] = static_cast<int32_t>(k);
      }
    }
  }
  if (threadIdx.x == kCompactThreads - 1) {
    *dev_count = dev_off[threadIdx.x];
    *host_count = host_off[threadIdx.x];
  }
}

__global__ void IotaKernel(int32_t* idx, int64_t n, int32_t* count) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) idx[i] = static_cast<int32_t>(i);
  if (i == 0) *count = static_cast<int32_t>(n);
}

}  // namespace

void RmsNorm(const float* x, const float* w, int64_t n, float eps, float* out, cudaStream_t s) {
  RmsNormKernel<<<1, 1024, 0, s>>>(x, w, n, eps, out);
}

void Rope(float* x, int64_t n_heads, int64_t head_dim, int64_t rope_dim, const float* cos_sin,
          cudaStream_t s) {
  const int64_t items = n_heads * (rope_dim / 2);
  if (items == 0) return;
  RopeKernel<<<Blocks(items, kThreads), kThreads, 0, s>>>(x, n_heads, head_dim, rope_dim / 2,
                                                          cos_sin);
}

void GatedActivation(int act, float* gate, const float* up, const int32_t* count, int64_t n,
                     float magnitude_threshold, int32_t* fired, cudaStream_t s) {
  if (n <= 0) return;
  GatedActivationKernel<<<Blocks(n, kThreads), kThreads, 0, s>>>(act, gate, up, count, n,
                                                                 magnitude_threshold, fired);
}

void Attention(const float* q, const float* k, const float* v, int64_t n_kv, int64_t n_head,
               int64_t n_head_kv, int64_t head_dim, float* scores, float* out, cudaStream_t s) {
  if (n_head == 0 || n_kv == 0) return;
  AttentionKernel<float><<<static_cast<unsigned>(n_head), kThreads, 0, s>>>(
      q, k, v, n_kv, nullptr, n_kv, n_head, n_head / n_head_kv, head_dim, n_head_kv * head_dim,
      scores, out);
}

void AttentionAt(const float* q, const void* k, const void* v, bool half, const int32_t* pos,
                 int64_t n_ctx, int64_t n_head, int64_t n_head_kv, int64_t head_dim, float* scores,
                 float* out, cudaStream_t s) {
  if (n_head == 0) return;
  const unsigned blocks = static_cast<unsigned>(n_head);
  const int64_t group = n_head / n_head_kv, kv_dim = n_head_kv * head_dim;
  if (half) {
    AttentionKernel<__half><<<blocks, kThreads, 0, s>>>(
        q, static_cast<const __half*>(k), static_cast<const __half*>(v), 0, pos, n_ctx, n_head,
        group, head_dim, kv_dim, scores, out);
  } else {
    AttentionKernel<float>
        <<<blocks, kThreads, 0, s>>>(q, static_cast<const float*>(k), static_cast<const float*>(v),
                                     0, pos, n_ctx, n_head, group, head_dim, kv_dim, scores, out);
  }
}

void StoreKv(const float* k, const float* v, void* k_cache, void* v_cache, bool half,
             int64_t kv_dim, const int32_t* pos, cudaStream_t s) {
  if (kv_dim <= 0) return;
  if (half) {
    StoreKvKernel<__half><<<Blocks(kv_dim, kThreads), kThreads, 0, s>>>(
        k, v, static_cast<__half*>(k_cache), static_cast<__half*>(v_cache), kv_dim, pos);
  } else {
    StoreKvKernel<float><<<Blocks(kv_dim, kThreads), kThreads, 0, s>>>(
        k, v, static_cast<float*>(k_cache), static_cast<float*>(v_cache), kv_dim, pos);
  }
}

void Add(float* x, const float* y, int64_t n, cudaStream_t s) {
  if (n <= 0) return;
  AddKernel<<<Blocks(n, kThreads), kThreads, 0, s>>>(x, y, n);
}

void BiasRelu(float* h, const float* b, int64_t n, cudaStream_t s) {
  if (n <= 0) return;
  BiasReluKernel<<<Blocks(n, kThreads), kThreads, 0, s>>>(h, b, n);
}

void ThresholdCompact(const float* logits, const float* b2, const int32_t* table, int64_t n,
                      float threshold, int32_t* idx, int32_t* count, cudaStream_t s) {
  ThresholdCompactKernel<<<1, kCompactThreads, 0, s>>>(logits, b2, table, n, threshold, idx, count);
}

void GateFirstCompact(const float* gate, const float* scale, int64_t n, float threshold,
                      int32_t* idx, float* kept, int32_t* count, cudaStream_t s) {
  GateFirstCompactKernel<<<1, kCompactThreads, 0, s>>>(gate, scale, n, threshold, idx, kept, count);
}

void SplitCompact(const float* logits, const float* b2, const int32_t* compact_of, int64_t n,
                  float threshold, int32_t* dev_idx, int32_t* dev_count, int32_t* host_idx,
                  int32_t* host_count, cudaStream_t s) {
  SplitCompactKernel<<<1, kCompactThreads, 0, s>>>(logits, b2, compact_of, n, threshold, dev_idx,
                                                   dev_count, host_idx, host_count);
}

void Iota(int32_t* idx, int64_t n, int32_t* count, cudaStream_t s) {
  IotaKernel<<<Blocks(n > 0 ? n : 1, kThreads), kThreads, 0, s>>>(idx, n, count);
}

}  // namespace thermocline::cuda
