// The scalar reference of the K-quants' row-group kernels (kernels_internal.h's layouts and
// KGroupKernels): always compiled, what the SIMD versions (kquant_groups_simd.inc) are tested
// against. Per row and super-block it takes the integer lanes of ggml's x86 dot from the group's
// bytes (lane m: elements 4m .. 4m + 3 of every 32, each times its sub-block's scale, which in a
// group is chunk m of every pair or half) and the mins' products, and hands them to
// GgmlSuperFloats, the float part that the file's rows' reference shares: a row of a group gives
// the bits the row gives in the file, llama.cpp's.
#include <cstring>

#include "engine/ops/kernels.h"
#include "engine/ops/kernels_internal.h"

namespace thermocline::ops_internal {
namespace {

constexpr int kRows = kQ4GroupRows;

float Half(const uint8_t* p, int i) {
  uint16_t bits;
  std::memcpy(&bits, p + 2 * i, 2);
  return HalfToFloat(bits);
}

// Q4_K (kFifthBit false) or Q5_K: row i of the group at `group` against Q8_K blocks x.
template <bool kFifthBit>
float KGroupRowDot(int64_t nsb, const uint8_t* group, int i, const BlockQ8_K* x) {
  constexpr int64_t kRecord = kFifthBit ? kQ5KGroupSuperBytes : kQ4KGroupSuperBytes;
  constexpr int64_t kHigh = kFifthBit ? kQ5KGroupHighBytes : 0;
  GgmlSuperFloats sum{kFifthBit ? KMins::kSum : KMins::kLanes4};
  for (int64_t sb = 0; sb < nsb; ++sb) {
    const uint8_t* rec = group + sb * kRecord;
    const uint8_t* qh = rec + kQ4KGroupQuantBytes;
    const uint8_t* sc = qh + kHigh;
    const uint8_t* m = sc + 8 * kRows;
    const uint8_t* d = m + 8 * kRows;
    const int8_t* xq = x[sb].qs;
    int32_t lanes[8] = {}, pairs[8];
    for (int j = 0; j < 4; ++j) {
      for (int c = 0; c < 8; ++c) {
        const uint8_t* q = rec + ((j * 8 + c) * kRows + i) * 4;
        int32_t lo = 0, hi = 0;
        for (int k = 0; k < 4; ++k) {
          int w_lo = q[k] & 0x0F, w_hi = q[k] >> 4;
          if constexpr (kFifthBit) {
            const int bits = qh[(c * kRows + i) * 4 + k];
            w_lo |= ((bits >> (2 * j)) & 1) << 4;
            w_hi |= ((bits >> (2 * j + 1)) & 1) << 4;
          }
          lo += w_lo * xq[64 * j + 4 * c + k];
          hi += w_hi * xq[64 * j + 32 + 4 * c + k];
        }
        lanes[c] += lo * sc[(2 * j) * kRows + i] + hi * sc[(2 * j + 1) * kRows + i];
      }
      // Sub-block 2j + s of 32: its min times the activations' sums of its two halves of 16.
      for (int s = 0; s < 2; ++s) {
        pairs[2 * j + s] = m[(j * kRows + i) * 2 + s] *
                           (x[sb].bsums[4 * j + 2 * s] + x[sb].bsums[4 * j + 2 * s + 1]);
      }
    }
    sum.Add(lanes, pairs, x[sb].d * Half(d, i), -x[sb].d * Half(d, kRows + i));
  }
  return sum.Sum();
}

// Q6_K, Q2_K and Q3_K: 16 sub-blocks of 16 in 4 streams per half, as the SIMD codecs read them.
// Weights(rec, h, k, i, b, v): the 4 streams' weights of byte b of chunk k of half h, row i.
struct Q6Ref {
  static constexpr int64_t kRecord = kQ6KGroupSuperBytes, kQuant = kQ6KGroupQuantBytes;
  static constexpr int kOffset = 32;
  static constexpr bool kMins = false;
  static void Weights(const uint8_t* rec, int h, int k, int i, int b, int v[4]) {
    const uint8_t* q = rec + (h * 8 + k) * 3 * kRows * 4;
    const uint8_t bytes[3] = {q[i * 4 + b], q[(kRows + i) * 4 + b], q[(2 * kRows + i) * 4 + b]};
    Q6GroupDecode(bytes, v);
  }
  static int Scale(const uint8_t* sc, int sub, int i) {
    return static_cast<int8_t>(sc[sub * kRows + i]);
  }
  static int Min(const uint8_t*, int, int) { return 0; }
};
struct Q3Ref {
  static constexpr int64_t kRecord = kQ3KGroupSuperBytes, kQuant = kQ3KGroupQuantBytes;
  static constexpr int kOffset = 4;
  static constexpr bool kMins = false;
  static void Weights(const uint8_t* rec, int h, int k, int i, int b, int v[4]) {
    const uint8_t qs = rec[((h * 8 + k) * kRows + i) * 4 + b];
    const uint8_t hm = rec[2 * 8 * kRows * 4 + (k * kRows + i) * 4 + b];
    for (int s = 0; s < 4; ++s) v[s] = ((qs >> (2 * s)) & 3) | ((hm >> (4 * h + s)) & 1) << 2;
  }
  static int Scale(const uint8_t* sc, int sub, int i) { return sc[sub * kRows + i] - 32; }
  static int Min(const uint8_t*, int, int) { return 0; }
};
struct Q2Ref {
  static constexpr int64_t kRecord = kQ2KGroupSuperBytes, kQuant = kQ2KGroupQuantBytes;
  static constexpr int kOffset = 0;
  static constexpr bool kMins = true;
  static void Weights(const uint8_t* rec, int h, int k, int i, int b, int v[4]) {
    const uint8_t qs = rec[((h * 8 + k) * kRows + i) * 4 + b];
    for (int s = 0; s < 4; ++s) v[s] = (qs >> (2 * s)) & 3;
  }
  static int Scale(const uint8_t* sc, int sub, int i) {
    return sc[(sub / 2 * kRows + i) * 2 + sub % 2] & 0xF;
  }
  static int Min(const uint8_t* sc, int sub, int i) {
    return sc[(sub / 2 * kRows + i) * 2 + sub % 2] >> 4;
  }
};

// Row i of the group at `group` against Q8_K blocks x.
template <class Ref>
float Sub16GroupRowDot(int64_t nsb, const uint8_t* group, int i, const BlockQ8_K* x) {
  GgmlSuperFloats sum{Ref::kMins ? KMins::kLanes8 : KMins::kNone};
  for (int64_t sb = 0; sb < nsb; ++sb) {
    const uint8_t* rec = group + sb * Ref::kRecord;
    const uint8_t* sc = rec + Ref::kQuant;
    const uint8_t* d = sc + 16 * kRows;
    const int8_t* xq = x[sb].qs;
    int32_t lanes[8] = {}, pairs[8];
    for (int h = 0; h < 2; ++h) {
      for (int k = 0; k < 8; ++k) {
        for (int b = 0; b < 4; ++b) {
          int v[4];
          Ref::Weights(rec, h, k, i, b, v);
          for (int s = 0; s < 4; ++s) {
            const int sub = 8 * h + 2 * s + k / 4;
            lanes[k] +=
                (v[s] - Ref::kOffset) * Ref::Scale(sc, sub, i) * xq[128 * h + 32 * s + 4 * k + b];
          }
        }
      }
    }
    for (int j = 0; j < 8; ++j) {
      pairs[j] = Ref::Min(sc, 2 * j, i) * x[sb].bsums[2 * j] +
                 Ref::Min(sc, 2 * j + 1, i) * x[sb].bsums[2 * j + 1];
    }
    const float dmin = Ref::kMins ? -x[sb].d * Half(d, kRows + i) : 0.0f;
    sum.Add(lanes, pairs, x[sb].d * Half(d, i), dmin);
  }
  return sum.Sum();
}

template <float (*RowDot)(int64_t, const uint8_t*, int, const BlockQ8_K*)>
void MatVecScalar(int64_t n, const uint8_t* w, size_t group_bytes, int64_t rows, const uint8_t* act,
                  float* y) {
  const auto* x = reinterpret_cast<const BlockQ8_K*>(act);
  for (int64_t r = 0; r < rows; ++r) {
    y[r] = RowDot(n / kQK_K, w + r / kRows * group_bytes, static_cast<int>(r % kRows), x);
  }
}

template <float (*RowDot)(int64_t, const uint8_t*, int, const BlockQ8_K*)>
void GemmScalar(int64_t n, const uint8_t* w, int rows, const uint8_t* act, size_t act_stride,
                int64_t n_tokens, float* y, int64_t y_stride) {
  for (int64_t t = 0; t < n_tokens; ++t) {
    MatVecScalar<RowDot>(n, w, 0, rows, act + t * act_stride, y + t * y_stride);
  }
}

}  // namespace

KGroupKernels ScalarQ2KGroupKernels() {
  return {MatVecScalar<Sub16GroupRowDot<Q2Ref>>, GemmScalar<Sub16GroupRowDot<Q2Ref>>};
}
KGroupKernels ScalarQ3KGroupKernels() {
  return {MatVecScalar<Sub16GroupRowDot<Q3Ref>>, GemmScalar<Sub16GroupRowDot<Q3Ref>>};
}
KGroupKernels ScalarQ4KGroupKernels() {
  return {MatVecScalar<KGroupRowDot<false>>, GemmScalar<KGroupRowDot<false>>};
}
KGroupKernels ScalarQ5KGroupKernels() {
  return {MatVecScalar<KGroupRowDot<true>>, GemmScalar<KGroupRowDot<true>>};
}
KGroupKernels ScalarQ6KGroupKernels() {
  return {MatVecScalar<Sub16GroupRowDot<Q6Ref>>, GemmScalar<Sub16GroupRowDot<Q6Ref>>};
}

}  // namespace thermocline::ops_internal
