// Weight-reading kernels: activation quantization, dense and row-sparse mat-vec for every
// weight type, the axpy form of down over down_t rows, the column-sparse mat-vec of
// input-sparse layers, and dequantization for cuBLAS. One warp
// per output row; Q8_0 and Q4_0 rows are dotted block by block in int8 (dp4a) against Q8_0
// activations, exactly as engine/ops/kernels_scalar.cc does, with float accumulation; the other
// quantized types (dequant.cuh) are dequantized 8 elements at a time against F32 activations.
#include <cuda_fp16.h>

#include <cfloat>

#include "engine/cuda/cuda_kernels.h"
#include "engine/cuda/dequant.cuh"
#include "engine/gpu/axpy_splits.h"

namespace thermocline::cuda {
namespace {

constexpr int kWarp = 32;
constexpr int kRowsPerBlock = 8;  // warps per block of the mat-vec kernels

__device__ __forceinline__ float LoadHalf(const uint8_t* p) {
  return __half2float(__ushort_as_half(*reinterpret_cast<const unsigned short*>(p)));
}
__device__ __forceinline__ float LoadBf16(const uint8_t* p) {
  return __uint_as_float(static_cast<uint32_t>(*reinterpret_cast<const uint16_t*>(p)) << 16);
}
// Four bytes at a 2-byte aligned address (block payloads sit at offset 2 of 34/18-byte blocks).
__device__ __forceinline__ int Load4(const uint8_t* p) {
  const uint16_t* q = reinterpret_cast<const uint16_t*>(p);
  return static_cast<int>(static_cast<uint32_t>(q[0]) | (static_cast<uint32_t>(q[1]) << 16));
}

__device__ __forceinline__ float WarpSum(float v) {
  for (int o = kWarp / 2; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// Element c of a row, dequantized (the CPU's to_float).
template <KType T>
__device__ __forceinline__ float Element(const uint8_t* row, int64_t c) {
  if constexpr (T == KType::kF32) {
    return reinterpret_cast<const float*>(row)[c];
  } else if constexpr (T == KType::kF16) {
    return LoadHalf(row + 2 * c);
  } else if constexpr (T == KType::kBF16) {
    return LoadBf16(row + 2 * c);
  } else if constexpr (T == KType::kQ8_0) {
    const uint8_t* b = row + (c / 32) * 34;
    return static_cast<float>(static_cast<int8_t>(b[2 + c % 32])) * LoadHalf(b);
  } else if constexpr (T == KType::kQ4_0) {
    const uint8_t* b = row + (c / 32) * 18;
    const int j = static_cast<int>(c % 32);
    const int q = j < 16 ? (b[2 + j] & 0xF) : (b[2 + j - 16] >> 4);
    return static_cast<float>(q - 8) * LoadHalf(b);
  } else {
    return BlockElement<T>(row, c);
  }
}

template <KType T>
constexpr bool kFloatType = T == KType::kF32 || T == KType::kF16 || T == KType::kBF16;

// This lane's share of dot(row, x) over `cols` elements.
template <KType T>
__device__ __forceinline__ float LaneDot(const uint8_t* row, const void* xv, int64_t cols,
                                         int lane) {
  float sum = 0.0f;
  if constexpr (T == KType::kQ8_0) {
    // 8 lanes per block, 4 int8 each: a warp reads 4 blocks per step.
    const uint8_t* x = static_cast<const uint8_t*>(xv);
    const int64_t nb = cols / 32;
    const int sub = lane % 8;
    for (int64_t b = lane / 8; b < nb; b += 4) {
      const uint8_t* wb = row + b * 34;
      const uint8_t* xb = x + b * 34;
      const int dot = __dp4a(Load4(wb + 2 + 4 * sub), Load4(xb + 2 + 4 * sub), 0);
      sum += LoadHalf(wb) * LoadHalf(xb) * static_cast<float>(dot);
    }
  } else if constexpr (T == KType::kQ4_0) {
    // 4 lanes per block: lane sub holds elements 4sub..4sub+3 (low nibbles) and
    // 16+4sub..16+4sub+3 (high nibbles); a warp reads 8 blocks per step.
    const uint8_t* x = static_cast<const uint8_t*>(xv);
    const int64_t nb = cols / 32;
    const int sub = lane % 4;
    for (int64_t b = lane / 4; b < nb; b += 8) {
      const uint8_t* wb = row + b * 18;
      const uint8_t* xb = x + b * 34;
      const int q = Load4(wb + 2 + 4 * sub);
      const int lo = static_cast<int>(__vsub4(q & 0x0F0F0F0F, 0x08080808));
      const int hi = static_cast<int>(__vsub4((q >> 4) & 0x0F0F0F0F, 0x08080808));
      int dot = __dp4a(lo, Load4(xb + 2 + 4 * sub), 0);
      dot = __dp4a(hi, Load4(xb + 2 + 16 + 4 * sub), dot);
      sum += LoadHalf(wb) * LoadHalf(xb) * static_cast<float>(dot);
    }
  } else if constexpr (kFloatType<T>) {
    const float* x = static_cast<const float*>(xv);
    for (int64_t c = lane; c < cols; c += kWarp) sum += Element<T>(row, c) * x[c];
  } else {
    sum = BlockLaneDot<T>(row, static_cast<const float*>(xv), cols, lane);
  }
  return sum;
}

template <KType T>
__global__ void MatVecKernel(const uint8_t* w, size_t row_bytes, int64_t cols, const void* x,
                             const int32_t* rows, const int32_t* count, int64_t n_out, float* y) {
  const int64_t j = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / kWarp;
  if (j >= n_out || (count != nullptr && j >= *count)) return;  // whole warps leave together
  const int64_t r = rows != nullptr ? rows[j] : j;
  const float sum = WarpSum(LaneDot<T>(w + r * row_bytes, x, cols, threadIdx.x % kWarp));
  if (threadIdx.x % kWarp == 0) y[j] = sum;
}

// One warp per Q8_0 block of 32 activations.
__global__ void QuantizeQ8_0Kernel(const float* x, int64_t n_blocks, uint8_t* dst) {
  const int64_t b = static_cast<int64_t>(blockIdx.x) * (blockDim.x / kWarp) + threadIdx.x / kWarp;
  if (b >= n_blocks) return;
  const int lane = threadIdx.x % kWarp;
  const float v = x[b * 32 + lane];
  float amax = fabsf(v);
  for (int o = kWarp / 2; o > 0; o /= 2) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  // As the CPU's activations (kernels.h's from_float): 127 / amax, ties to even.
  const float d = amax / 127.0f;
  const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
  uint8_t* out = dst + b * 34;
  out[2 + lane] = static_cast<uint8_t>(static_cast<int8_t>(rintf(v * id)));
  if (lane == 0) {
    *reinterpret_cast<unsigned short*>(out) = __half_as_ushort(__float2half_rn(d));
  }
}

// Partial sums of the axpy: block (x: 256 columns, y: one slice of the active list).
template <KType T>
__global__ void AxpyKernel(const uint8_t* w, size_t row_bytes, int64_t cols, const int32_t* rows,
                           const float* act, const int32_t* count, int64_t chunk, float* partial) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t begin = blockIdx.y * chunk;
  const int64_t end = min(begin + chunk, static_cast<int64_t>(*count));
  float acc = 0.0f;
  if (c < cols) {
    for (int64_t j = begin; j < end; ++j) {
      const float a = act[j];
      if (a != 0.0f) acc += a * Element<T>(w + static_cast<int64_t>(rows[j]) * row_bytes, c);
    }
    partial[blockIdx.y * cols + c] = acc;
  }
}

__global__ void SumSlicesKernel(const float* partial, int splits, int64_t cols, float* out) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= cols) return;
  float sum = 0.0f;
  for (int s = 0; s < splits; ++s) sum += partial[s * cols + c];
  out[c] = sum;
}

template <KType T>
__global__ void DequantizeKernel(const uint8_t* w, size_t row_bytes, int64_t rows, int64_t cols,
                                 __half* out) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= rows * cols) return;
  out[i] = __float2half_rn(Element<T>(w + (i / cols) * row_bytes, i % cols));
}

__global__ void F32ToF16Kernel(const float* x, int64_t n, __half* out) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = __float2half_rn(x[i]);
}

// The column-sparse mat-vec (ColumnMatVec). Every warp reads one block of 32 inputs at a time:
// lane k holds input 32 b + k, the warp's ballot the block's kept entries, and the kept rows are
// walked in order, each thread reading its word (integer forms) or element (kRows) of each.
__device__ __forceinline__ bool Kept(float x, float threshold) {
  return fabsf(x) > threshold && x != 0.0f;
}

// Kept rows read per step: their loads are issued before any is used, so that a warp keeps this
// many reads in flight rather than waiting out each one's latency.
constexpr int kRowsInFlight = 4;
// The next kRowsInFlight set bits of `rest` (a warp-uniform mask), ascending, -1 past its last;
// clears them.
__device__ __forceinline__ void TakeRows(unsigned& rest, int (&row)[kRowsInFlight]) {
  for (int j = 0; j < kRowsInFlight; ++j) {
    row[j] = rest != 0 ? __ffs(static_cast<int>(rest)) - 1 : -1;
    rest &= rest - 1;
  }
}

// Integer forms: thread t of tile blockIdx.x reads word w = 128 blockIdx.x + t of every kept row:
// 4 outputs (8-bit) or 8 (4-bit), consecutive within each nibble (column_layout.h's
// OutputOfByte), and keeps their float sums over the blocks of its range blockIdx.y.
template <bool kInt4, bool kMin>
__global__ void ColumnIntKernel(const uint8_t* values, size_t row_bytes, const uint16_t* scales,
                                const uint16_t* mins, int64_t out_pad, int32_t offset, int64_t in,
                                int64_t out, const float* x, float threshold,
                                int64_t blocks_per_split, float* partial) {
  constexpr int kOut = kInt4 ? 8 : 4;
  const int64_t word = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const bool valid = word * 4 < static_cast<int64_t>(row_bytes);
  const int lane = threadIdx.x % kWarp;
  // Word w' of its line holds bytes 4w'..4w'+3: outputs base + k (and base + 16 + k, high nibbles).
  const int64_t line = word / 16;
  const int byte = static_cast<int>(word % 16) * 4;
  const int64_t base =
      kInt4 ? line * 128 + gpu::OutputOfByte4(byte, false) : line * 64 + gpu::OutputOfByte8(byte);
  auto output = [&](int k) { return base + (k < 4 ? k : 16 + k - 4); };
  float sum[kOut];
  for (int k = 0; k < kOut; ++k) sum[k] = 0.0f;
  const int64_t b0 = static_cast<int64_t>(blockIdx.y) * blocks_per_split;
  const int64_t b1 = min(b0 + blocks_per_split, in / 32);
  for (int64_t b = b0; b < b1; ++b) {
    const float xv = x[b * 32 + lane];
    const bool keep = Kept(xv, threshold);
    const unsigned kept = __ballot_sync(0xffffffffu, keep);
    if (kept == 0) continue;
    // The kept entries as int8, as the CPU's ColumnInput quantizes them.
    float amax = keep ? fabsf(xv) : 0.0f;
    for (int o = kWarp / 2; o > 0; o /= 2) {
      amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    }
    const float d = amax / 127.0f;
    const float id = d >= FLT_MIN ? 1.0f / d : 0.0f;  // as ColumnInput: tiny blocks count as zero
    const int q = keep ? static_cast<int>(rintf(xv * id)) : 0;
    int qsum = q;
    for (int o = kWarp / 2; o > 0; o /= 2) qsum += __shfl_xor_sync(0xffffffffu, qsum, o);
    int acc[kOut];
    for (int k = 0; k < kOut; ++k) acc[k] = 0;
    for (unsigned rest = kept; rest != 0;) {  // warp-uniform
      int row[kRowsInFlight];
      TakeRows(rest, row);
      uint32_t u[kRowsInFlight];
      for (int j = 0; j < kRowsInFlight; ++j) {
        u[j] = valid && row[j] >= 0 ? *reinterpret_cast<const uint32_t*>(
                                          values + (b * 32 + row[j]) * row_bytes + word * 4)
                                    : 0u;
      }
      for (int j = 0; j < kRowsInFlight; ++j) {
        const int qi = __shfl_sync(0xffffffffu, q, row[j] >= 0 ? row[j] : 0);
        if (row[j] < 0) break;  // warp-uniform
        for (int k = 0; k < 4; ++k) {
          if constexpr (kInt4) {
            acc[k] += qi * static_cast<int>((u[j] >> (8 * k)) & 0xF);
            acc[4 + k] += qi * static_cast<int>((u[j] >> (8 * k + 4)) & 0xF);
          } else {
            acc[k] += qi * static_cast<int>((u[j] >> (8 * k)) & 0xFF);
          }
        }
      }
    }
    if (!valid) continue;
    const uint16_t* sc = scales + b * out_pad;
    for (int k = 0; k < kOut; ++k) {
      const int64_t o = output(k);
      const float a = static_cast<float>(acc[k] - offset * qsum);
      sum[k] = fmaf(__half2float(__ushort_as_half(sc[o])), a * d, sum[k]);
      if constexpr (kMin) {
        sum[k] = fmaf(-__half2float(__ushort_as_half(mins[b * out_pad + o])),
                      d * static_cast<float>(qsum), sum[k]);
      }
    }
  }
  if (!valid) return;
  for (int k = 0; k < kOut; ++k) {
    if (const int64_t o = output(k); o < out) partial[blockIdx.y * out + o] = sum[k];
  }
}

// kRows: thread t of tile blockIdx.x sums output 128 blockIdx.x + t over its range's kept rows.
template <KType T>
__global__ void ColumnRowsKernel(const uint8_t* w, size_t row_bytes, int64_t in, int64_t out,
                                 const float* x, float threshold, int64_t blocks_per_split,
                                 float* partial) {
  const int64_t o = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int lane = threadIdx.x % kWarp;
  const int64_t b0 = static_cast<int64_t>(blockIdx.y) * blocks_per_split;
  const int64_t b1 = min(b0 + blocks_per_split, (in + 31) / 32);
  float sum = 0.0f;
  for (int64_t b = b0; b < b1; ++b) {
    const float xv = b * 32 + lane < in ? x[b * 32 + lane] : 0.0f;
    const unsigned kept = __ballot_sync(0xffffffffu, Kept(xv, threshold));
    for (unsigned rest = kept; rest != 0;) {  // warp-uniform; products in row order
      int row[kRowsInFlight];
      TakeRows(rest, row);
      float v[kRowsInFlight];
      for (int j = 0; j < kRowsInFlight; ++j) {
        v[j] = o < out && row[j] >= 0 ? Element<T>(w + (b * 32 + row[j]) * row_bytes, o) : 0.0f;
      }
      for (int j = 0; j < kRowsInFlight; ++j) {
        const float xi = __shfl_sync(0xffffffffu, xv, row[j] >= 0 ? row[j] : 0);
        if (row[j] < 0) break;  // warp-uniform
        sum += xi * v[j];
      }
    }
  }
  if (o < out) partial[blockIdx.y * out + o] = sum;
}

unsigned Blocks(int64_t n, int per_block) {
  return static_cast<unsigned>((n + per_block - 1) / per_block);
}

// Calls f with the KType as a compile-time constant: the one type switch of this file (the
// weight-type table's device column, type_table.cc, decides which types get here).
template <class F>
void Dispatch(KType t, F&& f) {
  switch (t) {
    case KType::kF32:
      f(std::integral_constant<KType, KType::kF32>());
      break;
    case KType::kF16:
      f(std::integral_constant<KType, KType::kF16>());
      break;
    case KType::kBF16:
      f(std::integral_constant<KType, KType::kBF16>());
      break;
    case KType::kQ8_0:
      f(std::integral_constant<KType, KType::kQ8_0>());
      break;
    case KType::kQ4_0:
      f(std::integral_constant<KType, KType::kQ4_0>());
      break;
    case KType::kQ4_1:
      f(std::integral_constant<KType, KType::kQ4_1>());
      break;
    case KType::kQ5_0:
      f(std::integral_constant<KType, KType::kQ5_0>());
      break;
    case KType::kQ5_1:
      f(std::integral_constant<KType, KType::kQ5_1>());
      break;
    case KType::kIQ4_NL:
      f(std::integral_constant<KType, KType::kIQ4_NL>());
      break;
    case KType::kQ2_K:
      f(std::integral_constant<KType, KType::kQ2_K>());
      break;
    case KType::kQ3_K:
      f(std::integral_constant<KType, KType::kQ3_K>());
      break;
    case KType::kQ4_K:
      f(std::integral_constant<KType, KType::kQ4_K>());
      break;
    case KType::kQ5_K:
      f(std::integral_constant<KType, KType::kQ5_K>());
      break;
    case KType::kQ6_K:
      f(std::integral_constant<KType, KType::kQ6_K>());
      break;
    case KType::kIQ4_XS:
      f(std::integral_constant<KType, KType::kIQ4_XS>());
      break;
    case KType::kNone:
      break;
  }
}

}  // namespace

void QuantizeQ8_0(const float* x, int64_t n, void* dst, cudaStream_t s) {
  const int64_t nb = n / 32;
  if (nb == 0) return;
  QuantizeQ8_0Kernel<<<Blocks(nb, 8), 256, 0, s>>>(x, nb, static_cast<uint8_t*>(dst));
}

void MatVec(const DevMatrix& w, const void* x, const int32_t* rows, const int32_t* count,
            int64_t n_out, float* y, cudaStream_t s) {
  if (n_out <= 0) return;
  Dispatch(w.type, [&](auto t) {
    MatVecKernel<decltype(t)::value><<<Blocks(n_out, kRowsPerBlock), kRowsPerBlock * kWarp, 0, s>>>(
        w.data, w.row_bytes, w.cols, x, rows, count, n_out, y);
  });
}

int AxpySplits(int64_t max_active) { return gpu::AxpyPartialSplits(max_active); }

void SparseAxpy(const DevMatrix& w_t, const int32_t* rows, const float* act, const int32_t* count,
                int64_t max_active, float* partial, float* out, cudaStream_t s) {
  const int splits = AxpySplits(max_active);
  const int64_t chunk = (max_active + splits - 1) / splits;
  const dim3 grid(Blocks(w_t.cols, 256), splits);
  Dispatch(w_t.type, [&](auto t) {
    AxpyKernel<decltype(t)::value><<<grid, 256, 0, s>>>(w_t.data, w_t.row_bytes, w_t.cols, rows,
                                                        act, count, chunk < 1 ? 1 : chunk, partial);
  });
  SumSlicesKernel<<<Blocks(w_t.cols, 256), 256, 0, s>>>(partial, splits, w_t.cols, out);
}

void ColumnMatVec(const DevColumn& c, const float* x, float threshold, float* partial, float* y,
                  cudaStream_t s) {
  using F = gpu::ColumnLayout::Form;
  if (c.out <= 0 || c.form == F::kNone) return;
  const dim3 grid(static_cast<unsigned>(c.grid.tiles), static_cast<unsigned>(c.grid.splits));
  const int64_t bps = c.grid.blocks_per_split;
  if (c.form == F::kRows) {
    Dispatch(c.rows.type, [&](auto t) {
      ColumnRowsKernel<decltype(t)::value><<<grid, gpu::kColumnThreads, 0, s>>>(
          c.rows.data, c.rows.row_bytes, c.in, c.out, x, threshold, bps, partial);
    });
  } else {
    auto launch = [&](auto kernel) {
      kernel<<<grid, gpu::kColumnThreads, 0, s>>>(c.values, c.row_bytes, c.scales, c.mins,
                                                  c.out_pad, c.offset, c.in, c.out, x, threshold,
                                                  bps, partial);
    };
    const bool int4 = c.form == F::kInt4, min = c.mins != nullptr;
    if (int4) {
      min ? launch(ColumnIntKernel<true, true>) : launch(ColumnIntKernel<true, false>);
    } else {
      min ? launch(ColumnIntKernel<false, true>) : launch(ColumnIntKernel<false, false>);
    }
  }
  SumSlicesKernel<<<Blocks(c.out, 256), 256, 0, s>>>(partial, static_cast<int>(c.grid.splits),
                                                     c.out, y);
}

void DequantizeToF16(const DevMatrix& w, void* out, cudaStream_t s) {
  const int64_t n = w.rows * w.cols;
  if (n == 0) return;
  Dispatch(w.type, [&](auto t) {
    DequantizeKernel<decltype(t)::value><<<Blocks(n, 256), 256, 0, s>>>(
        w.data, w.row_bytes, w.rows, w.cols, static_cast<__half*>(out));
  });
}

void F32ToF16(const float* x, int64_t n, void* out, cudaStream_t s) {
  if (n == 0) return;
  F32ToF16Kernel<<<Blocks(n, 256), 256, 0, s>>>(x, n, static_cast<__half*>(out));
}

}  // namespace thermocline::cuda
