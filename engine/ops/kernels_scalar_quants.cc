// The scalar reference kernels of the weight types beyond Q8_0 / Q4_0 (Q4_1, Q5_0, Q5_1,
// IQ4_NL, Q2_K..Q6_K, IQ4_XS), all written once over the integer decoding of a block
// (quants_ref.h's DecodedBlock): dequantization in ggml's float order; dots of the 32-element
// types with exact integer sums per group scaled in double (the yardstick of the SIMD
// kernels), of the super-block types in ggml's own float order (which the SIMD kernels
// reproduce bit for bit); the axpy of dequantized rows. Kept plain; speed lives in
// kernels_simd.inc.
#include <cmath>
#include <cstring>
#include <vector>

#include "engine/ops/kernels.h"
#include "engine/ops/kernels_internal.h"
#include "engine/ops/quants_ref.h"

namespace thermocline::ops_internal {
namespace {

template <DecodeFn kDecode, int kBlock>
void DecodedToFloat(const void* src, float* dst, int64_t n) {
  DecodedBlock b;
  for (int64_t i = 0; i < n / kBlock; ++i) {
    kDecode(src, i, &b);
    for (int e = 0; e < kBlock; ++e) {
      const int g = e / b.group;
      dst[i * kBlock + e] = b.d * b.sc[g] * b.q[e] - b.dm * b.mn[g];
    }
  }
}

// Activations as integers: x[e] = d(e) * q[e] over the activation format's blocks. Sum: the
// sum of a group's x that a min multiplies, d times the integer sum (Q8_1: its rounded s).
struct Q8_0Act {
  static constexpr int kBlock = kQK8_0;
  static float Scale(const void* x, int64_t e) {
    return HalfToFloat(static_cast<const BlockQ8_0*>(x)[e / kQK8_0].d);
  }
  static int Quant(const void* x, int64_t e) {
    return static_cast<const BlockQ8_0*>(x)[e / kQK8_0].qs[e % kQK8_0];
  }
  static double Sum(const void* x, int64_t e, int64_t qsum) { return Scale(x, e) * double(qsum); }
};

// Σ over groups of d_x * d * sc * Σ q q_x - dm * mn * Σ x (Act::Sum: d_x * Σ q_x), each group's
// sums exact integers (a group lies within one activation block), accumulated in double.
template <DecodeFn kDecode, int kBlock, class Act>
float DecodedVecDot(int64_t n, const void* w, const void* x) {
  static_assert(kBlock % Act::kBlock == 0 || Act::kBlock % kBlock == 0);
  DecodedBlock b;
  double sum = 0.0;
  for (int64_t i = 0; i < n / kBlock; ++i) {
    kDecode(w, i, &b);
    for (int g = 0; g < kBlock / b.group; ++g) {
      int64_t dot = 0, xsum = 0;
      for (int j = 0; j < b.group; ++j) {
        const int64_t e = i * kBlock + g * b.group + j;
        const int q = Act::Quant(x, e);
        dot += int64_t{b.q[g * b.group + j]} * q;
        xsum += q;
      }
      const double dx = Act::Scale(x, i * kBlock + g * b.group);
      sum += dx * double{b.d} * b.sc[g] * dot -
             double{b.dm} * b.mn[g] * Act::Sum(x, i * kBlock + g * b.group, xsum);
    }
  }
  return static_cast<float>(sum);
}

// The super-block types over Q8_K exactly as ggml's x86 kernels compute them (KMins,
// kquant_simd.inc's GgmlSuperAcc): per block the integer lanes L[m] over elements 4m .. 4m + 3
// of every 32, acc[m] = fma(d_x d, L[m], acc[m]) with the mins as kMins says, then
// hsum_float_8. Plain float operations in that order, so every ISA's dot equals this one.
template <DecodeFn kDecode, KMins kMins>
float GgmlSuperVecDot(int64_t n, const void* w, const void* x) {
  const auto* xb = static_cast<const BlockQ8_K*>(x);
  DecodedBlock b;
  GgmlSuperFloats sum{kMins};
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    kDecode(w, i, &b);
    const BlockQ8_K& y = xb[i];
    int32_t lanes[8] = {};
    for (int e = 0; e < kQK_K; ++e) lanes[(e % 32) / 4] += b.sc[e / b.group] * b.q[e] * y.qs[e];
    // The mins per 16 elements, as the int16 pairs ggml multiplies the bsums with.
    int32_t pairs[8];
    for (int j = 0; j < 8; ++j) {
      pairs[j] = b.mn[2 * j * 16 / b.group] * y.bsums[2 * j] +
                 b.mn[(2 * j + 1) * 16 / b.group] * y.bsums[2 * j + 1];
    }
    sum.Add(lanes, pairs, y.d * b.d, -y.d * b.dm);
  }
  return sum.Sum();
}

// Q4_1 and Q5_1 over Q8_1 exactly as ggml's x86 kernels compute them (kernels_simd.inc's
// GgmlMinDot): per block the integer lanes over 4 consecutive elements, acc[m] = fma(L[m],
// d d_x, acc[m]), mins = fma(m, s_x, mins); then hsum_float_8 + mins.
template <DecodeFn kDecode>
float GgmlMinVecDot(int64_t n, const void* w, const void* x) {
  const auto* xb = static_cast<const BlockQ8_1*>(x);
  DecodedBlock b;
  float acc[8] = {}, mins = 0.0f;
  for (int64_t i = 0; i < n / kQK8_0; ++i) {
    kDecode(w, i, &b);
    const BlockQ8_1& y = xb[i];
    const float d = b.d * HalfToFloat(y.d);
    for (int m = 0; m < 8; ++m) {
      int32_t lane = 0;
      for (int e = 4 * m; e < 4 * m + 4; ++e) lane += b.q[e] * y.qs[e];
      acc[m] = std::fma(static_cast<float>(lane), d, acc[m]);
    }
    mins = std::fma(b.dm, HalfToFloat(y.s), mins);  // DecodedBlock's dm: the min m
  }
  return ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7])) + mins;
}

template <float (*kDot)(int64_t, const void*, const void*)>
void VecDotMulti(int64_t n, const void* w, const void* x, int64_t x_stride, int k, float* out) {
  for (int j = 0; j < k; ++j) out[j] = kDot(n, w, static_cast<const uint8_t*>(x) + j * x_stride);
}

// acc += Σ_r a[r] · row r dequantized, a block at a time (float, as the other scalar axpys).
template <DecodeFn kDecode, int kBlock>
void DecodedAxpy(int64_t n, int k, const float* a, const uint8_t* const* rows, float* acc) {
  DecodedBlock b;
  for (int64_t i = 0; i < n / kBlock; ++i) {
    for (int r = 0; r < k; ++r) {
      kDecode(rows[r], i, &b);
      for (int e = 0; e < kBlock; ++e) {
        const int g = e / b.group;
        acc[i * kBlock + e] += a[r] * (b.d * b.sc[g] * b.q[e] - b.dm * b.mn[g]);
      }
    }
  }
}

template <DecodeFn kDecode, int kBlock, class Act>
IsaTypeKernels Entry(GgmlType type, GgmlType act, void (*quantize)(const float*, void*, int64_t)) {
  return {type,
          {act, DecodedToFloat<kDecode, kBlock>, quantize, DecodedVecDot<kDecode, kBlock, Act>,
           VecDotMulti<DecodedVecDot<kDecode, kBlock, Act>>},
          {},
          {},
          DecodedAxpy<kDecode, kBlock>};
}

template <DecodeFn kDecode>
IsaTypeKernels MinEntry(GgmlType type, void (*quantize)(const float*, void*, int64_t)) {
  constexpr auto kDot = GgmlMinVecDot<kDecode>;
  return {type,
          {GgmlType::kQ8_1, DecodedToFloat<kDecode, 32>, quantize, kDot, VecDotMulti<kDot>},
          {},
          {},
          DecodedAxpy<kDecode, 32>};
}

template <DecodeFn kDecode, KMins kMins>
IsaTypeKernels SuperEntry(GgmlType type, void (*quantize)(const float*, void*, int64_t)) {
  constexpr auto kDot = GgmlSuperVecDot<kDecode, kMins>;
  return {type,
          {GgmlType::kQ8_K, DecodedToFloat<kDecode, kQK_K>, quantize, kDot, VecDotMulti<kDot>},
          {},
          {},
          DecodedAxpy<kDecode, kQK_K>};
}

}  // namespace

void GgmlSuperFloats::Add(const int32_t lanes[8], const int32_t pairs[8], float d, float dmin) {
  if (kind == KMins::kLanes8) {
    for (int m = 0; m < 8; ++m) acc[m] = std::fma(dmin, static_cast<float>(pairs[m]), acc[m]);
  } else if (kind == KMins::kLanes4) {
    for (int m = 0; m < 4; ++m) {
      mins4[m] = std::fma(dmin, static_cast<float>(pairs[2 * m] + pairs[2 * m + 1]), mins4[m]);
    }
  } else if (kind == KMins::kSum) {
    int32_t total = 0;
    for (int m = 0; m < 8; ++m) total += pairs[m];
    mins = std::fma(dmin, static_cast<float>(total), mins);
  }
  for (int m = 0; m < 8; ++m) acc[m] = std::fma(d, static_cast<float>(lanes[m]), acc[m]);
}

float GgmlSuperFloats::Sum() const {
  float r = ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
  if (kind == KMins::kLanes4) r += (mins4[0] + mins4[2]) + (mins4[1] + mins4[3]);
  if (kind == KMins::kSum) r += mins;
  return r;
}

std::vector<IsaTypeKernels> ScalarQuantTypes() {
  using T = GgmlType;
  return {
      MinEntry<DecodeQ4_1>(T::kQ4_1, QuantizeQ4_1),
      Entry<DecodeQ5_0, 32, Q8_0Act>(T::kQ5_0, T::kQ8_0, QuantizeQ5_0),
      MinEntry<DecodeQ5_1>(T::kQ5_1, QuantizeQ5_1),
      Entry<DecodeIQ4_NL, 32, Q8_0Act>(T::kIQ4_NL, T::kQ8_0, QuantizeIQ4_NL),
      SuperEntry<DecodeQ2_K, KMins::kLanes8>(T::kQ2_K, QuantizeQ2_K),
      SuperEntry<DecodeQ3_K, KMins::kNone>(T::kQ3_K, QuantizeQ3_K),
      SuperEntry<DecodeQ4_K, KMins::kLanes4>(T::kQ4_K, QuantizeQ4_K),
      SuperEntry<DecodeQ5_K, KMins::kSum>(T::kQ5_K, QuantizeQ5_K),
      SuperEntry<DecodeQ6_K, KMins::kNone>(T::kQ6_K, QuantizeQ6_K),
      SuperEntry<DecodeIQ4_XS, KMins::kNone>(T::kIQ4_XS, QuantizeIQ4_XS),
      // Activations only: the Q8_K conversions, no dot.
      {T::kQ8_K, {T::kF32, DequantizeQ8_K, QuantizeQ8_K, nullptr, nullptr}, {}, {}, nullptr},
  };
}

}  // namespace thermocline::ops_internal
