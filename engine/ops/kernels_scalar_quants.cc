// The scalar reference kernels of the weight types beyond Q8_0 / Q4_0 (Q4_1, Q5_0, Q5_1,
// IQ4_NL, Q2_K..Q6_K, IQ4_XS), all written once over the integer decoding of a block
// (quants_ref.h's DecodedBlock): dequantization in ggml's float order, dots with exact integer
// sums per group scaled in double (the yardstick of the SIMD kernels), the axpy of dequantized
// rows. Kept plain; speed lives in kernels_simd.inc.
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
struct Q8_1Act {
  static constexpr int kBlock = kQK8_0;
  static float Scale(const void* x, int64_t e) {
    return HalfToFloat(static_cast<const BlockQ8_1*>(x)[e / kQK8_0].d);
  }
  static int Quant(const void* x, int64_t e) {
    return static_cast<const BlockQ8_1*>(x)[e / kQK8_0].qs[e % kQK8_0];
  }
  static double Sum(const void* x, int64_t e, int64_t) {
    return HalfToFloat(static_cast<const BlockQ8_1*>(x)[e / kQK8_0].s);
  }
};
struct Q8_KAct {
  static constexpr int kBlock = kQK_K;
  static float Scale(const void* x, int64_t e) {
    return static_cast<const BlockQ8_K*>(x)[e / kQK_K].d;
  }
  static int Quant(const void* x, int64_t e) {
    return static_cast<const BlockQ8_K*>(x)[e / kQK_K].qs[e % kQK_K];
  }
  static double Sum(const void* x, int64_t e, int64_t qsum) { return Scale(x, e) * double(qsum); }
};

// Σ over groups of d_x * d * sc * Σ q q_x - dm * mn * Σ x (Act::Sum: d_x * Σ q_x, or Q8_1's
// s), each group's sums exact integers (a group lies within one activation block), accumulated
// in double.
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

}  // namespace

std::vector<IsaTypeKernels> ScalarQuantTypes() {
  using T = GgmlType;
  return {
      Entry<DecodeQ4_1, 32, Q8_1Act>(T::kQ4_1, T::kQ8_1, QuantizeQ4_1),
      Entry<DecodeQ5_0, 32, Q8_0Act>(T::kQ5_0, T::kQ8_0, QuantizeQ5_0),
      Entry<DecodeQ5_1, 32, Q8_1Act>(T::kQ5_1, T::kQ8_1, QuantizeQ5_1),
      Entry<DecodeIQ4_NL, 32, Q8_0Act>(T::kIQ4_NL, T::kQ8_0, QuantizeIQ4_NL),
      Entry<DecodeQ2_K, kQK_K, Q8_KAct>(T::kQ2_K, T::kQ8_K, QuantizeQ2_K),
      Entry<DecodeQ3_K, kQK_K, Q8_KAct>(T::kQ3_K, T::kQ8_K, QuantizeQ3_K),
      Entry<DecodeQ4_K, kQK_K, Q8_KAct>(T::kQ4_K, T::kQ8_K, QuantizeQ4_K),
      Entry<DecodeQ5_K, kQK_K, Q8_KAct>(T::kQ5_K, T::kQ8_K, QuantizeQ5_K),
      Entry<DecodeQ6_K, kQK_K, Q8_KAct>(T::kQ6_K, T::kQ8_K, QuantizeQ6_K),
      Entry<DecodeIQ4_XS, kQK_K, Q8_KAct>(T::kIQ4_XS, T::kQ8_K, QuantizeIQ4_XS),
      // Activations only: the Q8_K conversions, no dot.
      {T::kQ8_K, {T::kF32, DequantizeQ8_K, QuantizeQ8_K, nullptr, nullptr}, {}, {}, nullptr},
  };
}

}  // namespace thermocline::ops_internal
