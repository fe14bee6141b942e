// Device dequantization of every weight type in ggml's block layouts (engine/ops/ggml_types.h
// describes them; engine/ops/quants_ref.h's DecodedBlock is the CPU's form of the same): a
// type's Block<T> gives the bytes of a block, and for element j of a block the group's scale
// and bias and the element's integer, value = scale * q - bias (the CPU's d * sc, dm * mn).
// Included by matvec.cu only.
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

#include "engine/cuda/cuda_kernels.h"

namespace thermocline::cuda {

__device__ __forceinline__ float HalfAt(const uint8_t* p) {
  return __half2float(__ushort_as_half(*reinterpret_cast<const unsigned short*>(p)));
}
// Bit j of the 32-bit little-endian mask at p (any alignment).
__device__ __forceinline__ int BitAt(const uint8_t* p, int j) { return (p[j / 8] >> (j % 8)) & 1; }
// Quant j (< 32) of 16 nibble bytes: low nibble of qs[j], high of qs[j - 16].
__device__ __forceinline__ int NibbleAt(const uint8_t* qs, int j) {
  return j < 16 ? qs[j] & 0xF : qs[j - 16] >> 4;
}

// IQ4's 16 levels {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113} as
// int8 bytes in four words, picked with byte permutes: a table in constant memory serializes a
// warp whose lanes read different entries (IQ4 mat-vecs ran at ~150 GB/s that way).
__device__ __forceinline__ int Iq4Value(int q) {
  const uint32_t lo = __byte_perm(0xBFAD9881u, 0xF6EADDCFu, q & 7);  // levels 0..7
  const uint32_t hi = __byte_perm(0x26190D01u, 0x71594535u, q & 7);  // levels 8..15
  return static_cast<int8_t>(((q & 8) ? hi : lo) & 0xFF);
}

// The 6-bit scale and min of group g of a Q4_K / Q5_K block's 12 scale bytes.
__device__ __forceinline__ void ScaleMinK4(const uint8_t* q, int g, int* sc, int* m) {
  if (g < 4) {
    *sc = q[g] & 63;
    *m = q[g + 4] & 63;
  } else {
    *sc = (q[g + 4] & 0xF) | ((q[g - 4] >> 6) << 4);
    *m = (q[g + 4] >> 4) | ((q[g] >> 6) << 4);
  }
}

struct ScaleBias {
  float scale, bias;
};

template <KType T>
struct Block;

template <>
struct Block<KType::kQ4_1> {
  static constexpr int kElems = 32, kBytes = 20;
  __device__ static ScaleBias Group(const uint8_t* b, int) { return {HalfAt(b), -HalfAt(b + 2)}; }
  __device__ static int Quant(const uint8_t* b, int j) { return NibbleAt(b + 4, j); }
};
template <>
struct Block<KType::kQ5_0> {
  static constexpr int kElems = 32, kBytes = 22;
  __device__ static ScaleBias Group(const uint8_t* b, int) { return {HalfAt(b), 0.0f}; }
  __device__ static int Quant(const uint8_t* b, int j) {
    return (NibbleAt(b + 6, j) | (BitAt(b + 2, j) << 4)) - 16;
  }
};
template <>
struct Block<KType::kQ5_1> {
  static constexpr int kElems = 32, kBytes = 24;
  __device__ static ScaleBias Group(const uint8_t* b, int) { return {HalfAt(b), -HalfAt(b + 2)}; }
  __device__ static int Quant(const uint8_t* b, int j) {
    return NibbleAt(b + 8, j) | (BitAt(b + 4, j) << 4);
  }
};
template <>
struct Block<KType::kIQ4_NL> {
  static constexpr int kElems = 32, kBytes = 18;
  __device__ static ScaleBias Group(const uint8_t* b, int) { return {HalfAt(b), 0.0f}; }
  __device__ static int Quant(const uint8_t* b, int j) { return Iq4Value(NibbleAt(b + 2, j)); }
};
// scales[16] qs[64] d dmin
template <>
struct Block<KType::kQ2_K> {
  static constexpr int kElems = 256, kBytes = 84;
  __device__ static ScaleBias Group(const uint8_t* b, int j) {
    const int sc = b[j / 16];
    return {HalfAt(b + 80) * (sc & 0xF), HalfAt(b + 82) * (sc >> 4)};
  }
  __device__ static int Quant(const uint8_t* b, int j) {
    const int g = j / 32;
    return (b[16 + 32 * (g / 4) + j % 32] >> (2 * (g % 4))) & 3;
  }
};
// hmask[32] qs[64] scales[12] d
template <>
struct Block<KType::kQ3_K> {
  static constexpr int kElems = 256, kBytes = 110;
  __device__ static ScaleBias Group(const uint8_t* b, int j) {
    const uint8_t* sc = b + 96;
    const int g = j / 16;
    const int low = g < 8 ? sc[g] & 0xF : sc[g - 8] >> 4;
    const int high = (sc[8 + g % 4] >> (2 * (g / 4))) & 3;
    return {HalfAt(b + 108) * ((low | (high << 4)) - 32), 0.0f};
  }
  __device__ static int Quant(const uint8_t* b, int j) {
    const int g = j / 32, l = j % 32;
    const int low = (b[32 + 32 * (g / 4) + l] >> (2 * (g % 4))) & 3;
    return low - (((b[l] >> g) & 1) != 0 ? 0 : 4);
  }
};
// d dmin scales[12] qs[128]
template <>
struct Block<KType::kQ4_K> {
  static constexpr int kElems = 256, kBytes = 144;
  __device__ static ScaleBias Group(const uint8_t* b, int j) {
    int sc, m;
    ScaleMinK4(b + 4, j / 32, &sc, &m);
    return {HalfAt(b) * sc, HalfAt(b + 2) * m};
  }
  __device__ static int Quant(const uint8_t* b, int j) {
    return (b[16 + 32 * (j / 64) + j % 32] >> (4 * ((j / 32) % 2))) & 0xF;
  }
};
// d dmin scales[12] qh[32] qs[128]
template <>
struct Block<KType::kQ5_K> {
  static constexpr int kElems = 256, kBytes = 176;
  __device__ static ScaleBias Group(const uint8_t* b, int j) {
    int sc, m;
    ScaleMinK4(b + 4, j / 32, &sc, &m);
    return {HalfAt(b) * sc, HalfAt(b + 2) * m};
  }
  __device__ static int Quant(const uint8_t* b, int j) {
    const int g = j / 32;
    const int low = (b[48 + 32 * (j / 64) + j % 32] >> (4 * (g % 2))) & 0xF;
    return low | (((b[16 + j % 32] >> g) & 1) << 4);
  }
};
// ql[128] qh[64] scales[16] (int8) d
template <>
struct Block<KType::kQ6_K> {
  static constexpr int kElems = 256, kBytes = 210;
  __device__ static ScaleBias Group(const uint8_t* b, int j) {
    return {HalfAt(b + 208) * static_cast<int8_t>(b[192 + j / 16]), 0.0f};
  }
  __device__ static int Quant(const uint8_t* b, int j) {
    const int h = j / 128, s = (j % 128) / 32, l = j % 32;
    const int low = (b[64 * h + 32 * (s & 1) + l] >> (s < 2 ? 0 : 4)) & 0xF;
    const int high = (b[128 + 32 * h + l] >> (2 * s)) & 3;
    return (low | (high << 4)) - 32;
  }
};
// d scales_h scales_l[4] qs[128]
template <>
struct Block<KType::kIQ4_XS> {
  static constexpr int kElems = 256, kBytes = 136;
  __device__ static ScaleBias Group(const uint8_t* b, int j) {
    const int ib = j / 32;
    const int scales_h = b[2] | (b[3] << 8);
    const int ls = ((b[4 + ib / 2] >> (4 * (ib % 2))) & 0xF) | (((scales_h >> (2 * ib)) & 3) << 4);
    return {HalfAt(b) * (ls - 32), 0.0f};
  }
  __device__ static int Quant(const uint8_t* b, int j) {
    return Iq4Value(NibbleAt(b + 8 + 16 * (j / 32), j % 32));
  }
};

// Element c of a row of blocks of type T.
template <KType T>
__device__ __forceinline__ float BlockElement(const uint8_t* row, int64_t c) {
  using B = Block<T>;
  const uint8_t* b = row + (c / B::kElems) * B::kBytes;
  const int j = static_cast<int>(c % B::kElems);
  const ScaleBias g = B::Group(b, j);
  return g.scale * static_cast<float>(B::Quant(b, j)) - g.bias;
}

// This lane's share of dot(row, x) with x in F32: 8 consecutive elements per lane and step (one
// group's scale for all 8: groups are 16 or 32 elements), a warp reading 256 elements (whole
// blocks, contiguous) per step. cols: a multiple of 32.
template <KType T>
__device__ __forceinline__ float BlockLaneDot(const uint8_t* row, const float* x, int64_t cols,
                                              int lane) {
  using B = Block<T>;
  float sum = 0.0f;
  for (int64_t c0 = 8 * lane; c0 < cols; c0 += 256) {
    const uint8_t* b = row + (c0 / B::kElems) * B::kBytes;
    const int j0 = static_cast<int>(c0 % B::kElems);
    const ScaleBias g = B::Group(b, j0);
    const float4 x0 = *reinterpret_cast<const float4*>(x + c0);
    const float4 x1 = *reinterpret_cast<const float4*>(x + c0 + 4);
    const float xs[8] = {x0.x, x0.y, x0.z, x0.w, x1.x, x1.y, x1.z, x1.w};
    float dot = 0.0f, xsum = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      dot += static_cast<float>(B::Quant(b, j0 + i)) * xs[i];
      xsum += xs[i];
    }
    sum += g.scale * dot - g.bias * xsum;
  }
  return sum;
}

}  // namespace thermocline::cuda
