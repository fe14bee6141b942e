// The scalar reference kernels: plain C++, always compiled, the ground truth the SIMD kernels
// are tested against (tests/unit/kernels_test.cc). Quantizers follow ggml's *_ref functions
// bit for bit; dot products accumulate in double (as ggml's scalar f16 dot does), which makes
// them a near-exact yardstick. Keep this file simple enough to trust at a glance; speed lives in
// kernels_simd.inc.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include "engine/ops/kernels.h"
#include "engine/ops/kernels_internal.h"

namespace thermocline {

float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  const uint32_t exponent = (h >> 10) & 0x1F;
  uint32_t mantissa = h & 0x3FF;
  uint32_t bits;
  if (exponent == 0x1F) {  // inf / NaN: quieted, payload kept (as vcvtph2ps does)
    if (mantissa != 0) mantissa |= 0x200;
    bits = sign | 0x7F800000 | (mantissa << 13);
  } else if (exponent != 0) {  // normal
    bits = sign | ((exponent + 112) << 23) | (mantissa << 13);
  } else if (mantissa == 0) {  // zero
    bits = sign;
  } else {  // subnormal: normalise
    int e = 113;
    while ((mantissa & 0x400) == 0) {
      mantissa <<= 1;
      --e;
    }
    bits = sign | (static_cast<uint32_t>(e) << 23) | ((mantissa & 0x3FF) << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Round to nearest even, like the F16C instruction vcvtps2ph: overflow to inf, subnormals
// rounded, NaN quieted with its payload's top bits kept.
uint16_t FloatToHalf(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000);
  x &= 0x7FFFFFFF;
  if (x >= 0x7F800000) {  // inf / NaN
    if (x == 0x7F800000) return sign | 0x7C00;
    return static_cast<uint16_t>(sign | 0x7E00 | ((x >> 13) & 0x3FF));
  }
  if (x >= 0x477FF000) return sign | 0x7C00;  // >= 65520 rounds to inf
  if (x < 0x38800000) {                       // below 2^-14: a half subnormal (or zero)
    if (x <= 0x33000000) return sign;         // <= 2^-25 rounds to zero
    const uint32_t mantissa = (x & 0x7FFFFF) | 0x800000;
    const int shift = 126 - static_cast<int>(x >> 23);  // 14 .. 24
    uint32_t q = mantissa >> shift;
    const uint32_t rem = mantissa & ((1u << shift) - 1);
    const uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (q & 1))) ++q;
    return static_cast<uint16_t>(sign | q);
  }
  uint32_t h = (x >> 13) - (112u << 10);  // rebias the exponent
  const uint32_t rem = x & 0x1FFF;
  if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) ++h;  // a carry into the exponent is right
  return static_cast<uint16_t>(sign | h);
}

// ggml_compute_fp32_to_bf16.
uint16_t FloatToBf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7FFFFFFF) > 0x7F800000) return static_cast<uint16_t>((u >> 16) | 64);  // quiet NaN
  return static_cast<uint16_t>((u + (0x7FFF + ((u >> 16) & 1))) >> 16);
}

namespace ops_internal {

// ggml's quantize_row_q4_0_ref.
void QuantizeQ4_0Reference(const float* src, void* dst, int64_t n) {
  BlockQ4_0* y = static_cast<BlockQ4_0*>(dst);
  for (int64_t i = 0; i < n / kQK4_0; ++i) {
    const float* x = src + i * kQK4_0;
    float amax = 0.0f;
    float max = 0.0f;  // the signed value of the element of largest magnitude
    for (int j = 0; j < kQK4_0; ++j) {
      if (amax < std::fabs(x[j])) {
        amax = std::fabs(x[j]);
        max = x[j];
      }
    }
    const float d = max / -8;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[i].d = FloatToHalf(d);
    for (int j = 0; j < kQK4_0 / 2; ++j) {
      const int q0 = std::min(15, static_cast<int>(static_cast<int8_t>(x[j] * id + 8.5f)));
      const int q1 =
          std::min(15, static_cast<int>(static_cast<int8_t>(x[j + kQK4_0 / 2] * id + 8.5f)));
      y[i].qs[j] = static_cast<uint8_t>(q0 | (q1 << 4));
    }
  }
}

namespace {

// ---- F32, F16, BF16: x is F32 -------------------------------------------------------------

float LoadF32(const void* p, int64_t i) { return static_cast<const float*>(p)[i]; }
float LoadF16(const void* p, int64_t i) { return HalfToFloat(static_cast<const uint16_t*>(p)[i]); }
float LoadBf16(const void* p, int64_t i) { return Bf16ToFloat(static_cast<const uint16_t*>(p)[i]); }

template <float (*kLoad)(const void*, int64_t)>
void FloatToF32(const void* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = kLoad(src, i);
}

void F32FromFloat(const float* src, void* dst, int64_t n) {
  std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
}
void F16FromFloat(const float* src, void* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) static_cast<uint16_t*>(dst)[i] = FloatToHalf(src[i]);
}
void Bf16FromFloat(const float* src, void* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) static_cast<uint16_t*>(dst)[i] = FloatToBf16(src[i]);
}

template <float (*kLoad)(const void*, int64_t)>
float FloatVecDot(int64_t n, const void* w, const void* x) {
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += double{kLoad(w, i)} * static_cast<const float*>(x)[i];
  return static_cast<float>(sum);
}

// ---- Q8_0 and Q4_0: x is Q8_0 -------------------------------------------------------------

void Q8_0ToFloat(const void* src, float* dst, int64_t n) {
  const BlockQ8_0* b = static_cast<const BlockQ8_0*>(src);
  for (int64_t i = 0; i < n / kQK8_0; ++i) {
    const float d = HalfToFloat(b[i].d);
    for (int j = 0; j < kQK8_0; ++j) dst[i * kQK8_0 + j] = b[i].qs[j] * d;
  }
}

void Q4_0ToFloat(const void* src, float* dst, int64_t n) {
  const BlockQ4_0* b = static_cast<const BlockQ4_0*>(src);
  for (int64_t i = 0; i < n / kQK4_0; ++i) {
    const float d = HalfToFloat(b[i].d);
    for (int j = 0; j < kQK4_0 / 2; ++j) {
      dst[i * kQK4_0 + j] = ((b[i].qs[j] & 0xF) - 8) * d;
      dst[i * kQK4_0 + j + kQK4_0 / 2] = ((b[i].qs[j] >> 4) - 8) * d;
    }
  }
}

// One Q8_0 block into qs; returns the unrounded scale amax / 127. Weights (kActivation false)
// as ggml's quantize_row_q8_0_ref: x · (1 / d) rounded half away from zero. Activations as
// ggml's x86 quantize_row_q8_0 (kernels.h's from_float): x · (127 / amax), ties to even.
template <bool kActivation>
float QuantizeQ8Block(const float* x, int8_t* qs) {
  float amax = 0.0f;
  for (int j = 0; j < kQK8_0; ++j) amax = std::max(amax, std::fabs(x[j]));
  const float d = amax / 127;
  if constexpr (kActivation) {
    const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
    for (int j = 0; j < kQK8_0; ++j) qs[j] = static_cast<int8_t>(std::nearbyint(x[j] * id));
  } else {
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    for (int j = 0; j < kQK8_0; ++j) qs[j] = static_cast<int8_t>(std::roundf(x[j] * id));
  }
  return d;
}

template <bool kActivation>
void Q8_0FromFloat(const float* src, void* dst, int64_t n) {
  BlockQ8_0* y = static_cast<BlockQ8_0*>(dst);
  for (int64_t i = 0; i < n / kQK8_0; ++i) {
    y[i].d = FloatToHalf(QuantizeQ8Block<kActivation>(src + i * kQK8_0, y[i].qs));
  }
}

// Q8_1 holds activations only: Q8_0's activation block plus s = half(sum(qs) * d), as ggml's.
void Q8_1FromFloat(const float* src, void* dst, int64_t n) {
  BlockQ8_1* y = static_cast<BlockQ8_1*>(dst);
  for (int64_t i = 0; i < n / kQK8_0; ++i) {
    const float d = QuantizeQ8Block<true>(src + i * kQK8_0, y[i].qs);
    int sum = 0;
    for (int j = 0; j < kQK8_0; ++j) sum += y[i].qs[j];
    y[i].d = FloatToHalf(d);
    y[i].s = FloatToHalf(static_cast<float>(sum) * d);
  }
}

void Q8_1ToFloat(const void* src, float* dst, int64_t n) {
  const BlockQ8_1* b = static_cast<const BlockQ8_1*>(src);
  for (int64_t i = 0; i < n / kQK8_0; ++i) {
    const float d = HalfToFloat(b[i].d);
    for (int j = 0; j < kQK8_0; ++j) dst[i * kQK8_0 + j] = b[i].qs[j] * d;
  }
}

// Weight element j of block b as an integer.
int Q8_0Weight(const void* w, int64_t b, int j) {
  return static_cast<const BlockQ8_0*>(w)[b].qs[j];
}
int Q4_0Weight(const void* w, int64_t b, int j) {
  const uint8_t q = static_cast<const BlockQ4_0*>(w)[b].qs[j % 16];
  return (j < 16 ? q & 0xF : q >> 4) - 8;
}
template <class Block>
float WeightScale(const void* w, int64_t b) {
  return HalfToFloat(static_cast<const Block*>(w)[b].d);
}

// As ggml: an exact integer dot per block, scaled by d_w * d_x.
template <int (*kWeight)(const void*, int64_t, int), class Block>
float QuantVecDot(int64_t n, const void* w, const void* x) {
  const BlockQ8_0* xb = static_cast<const BlockQ8_0*>(x);
  double sum = 0.0;
  for (int64_t b = 0; b < n / kQK8_0; ++b) {
    int dot = 0;
    for (int j = 0; j < kQK8_0; ++j) dot += kWeight(w, b, j) * xb[b].qs[j];
    sum += double{WeightScale<Block>(w, b)} * HalfToFloat(xb[b].d) * dot;
  }
  return static_cast<float>(sum);
}

// vec_dot_multi as k separate dots: the reference semantics.
template <float (*kDot)(int64_t, const void*, const void*)>
void VecDotMulti(int64_t n, const void* w, const void* x, int64_t x_stride, int k, float* out) {
  for (int j = 0; j < k; ++j) out[j] = kDot(n, w, static_cast<const uint8_t*>(x) + j * x_stride);
}

template <float (*kLoad)(const void*, int64_t)>
TypeKernels FloatKernels(void (*from_float)(const float*, void*, int64_t)) {
  return {GgmlType::kF32, FloatToF32<kLoad>, from_float, FloatVecDot<kLoad>,
          VecDotMulti<FloatVecDot<kLoad>>};
}

template <int (*kWeight)(const void*, int64_t, int), class Block>
TypeKernels QuantKernels(void (*to_float)(const void*, float*, int64_t),
                         void (*from_float)(const float*, void*, int64_t),
                         void (*from_float_ref)(const float*, void*, int64_t) = nullptr) {
  return {GgmlType::kQ8_0,
          to_float,
          from_float,
          QuantVecDot<kWeight, Block>,
          VecDotMulti<QuantVecDot<kWeight, Block>>,
          from_float_ref};
}

}  // namespace

// Rows of floats at one stride (kernels.h's HalfRows is the F16 cache's).
struct FloatRows {
  const float* data;
  int64_t stride;
  const float* Row(int64_t j) const { return data + j * stride; }
};

// The reference: a double dot per position, the cap, softmax as cpu_ops.h's Softmax, then the
// values summed position by position. Rows: FloatRows, or HalfRows for an F16 cache, whose q and
// softmax weights are rounded to half (kernels.h's AttendHeadF16).
template <class Rows>
void AttendScalar(int64_t n_kv, int64_t k_dim, int64_t v_dim, const float* q, const Rows& k,
                  const Rows& v, float scale, float softcap, float* scores, float* out) {
  constexpr bool kHalf = std::is_same_v<Rows, HalfRows>;
  auto at = [](const auto* p, int64_t i) {
    if constexpr (kHalf) {
      return HalfToFloat(p[i]);
    } else {
      return p[i];
    }
  };
  auto operand = [](float x) { return kHalf ? HalfToFloat(FloatToHalf(x)) : x; };
  float max = -INFINITY;
  for (int64_t j = 0; j < n_kv; ++j) {
    double s = 0.0;
    for (int64_t i = 0; i < k_dim; ++i) s += double{operand(q[i])} * at(k.Row(j), i);
    scores[j] = static_cast<float>(s) * scale;
    if (softcap > 0) scores[j] = softcap * std::tanh(scores[j] / softcap);
    max = std::max(max, scores[j]);
  }
  double sum = 0.0;
  for (int64_t j = 0; j < n_kv; ++j) {
    scores[j] = std::exp(scores[j] - max);
    sum += scores[j];
  }
  const float inv = static_cast<float>(1.0 / sum);
  for (int64_t i = 0; i < v_dim; ++i) out[i] = 0.0f;
  for (int64_t j = 0; j < n_kv; ++j) {
    const float p = operand(scores[j] * inv);
    for (int64_t i = 0; i < v_dim; ++i) out[i] += p * at(v.Row(j), i);
  }
}

void AttendScalarF32(int64_t n_kv, int64_t k_dim, int64_t v_dim, const float* q, const float* k,
                     int64_t k_stride, const float* v, int64_t v_stride, float scale, float softcap,
                     float* scores, float* out) {
  AttendScalar(n_kv, k_dim, v_dim, q, FloatRows{k, k_stride}, FloatRows{v, v_stride}, scale,
               softcap, scores, out);
}

// ---- ggml's float operators, bit for bit (kernels_simd.inc's ExpGgml, SiluMul, AttendF16Ggml) --

namespace {

float ExpGgml(float x) {
  const float z = std::fma(x, 0x1.715476p+0f, 0x1.8p23f);
  const float n = z - 0x1.8p23f;
  const float b = std::fma(-n, 0x1.7f7d1cp-20f, std::fma(-n, 0x1.62e4p-1f, x));
  const float u = b * b;
  const float j = std::fma(std::fma(std::fma(0x1.0e4020p-7f, b, 0x1.573e2ep-5f), u,
                                    std::fma(0x1.555e66p-3f, b, 0x1.fffdb6p-2f)),
                           u, std::fma(0x1.ffffecp-1f, b, 1.0f));
  const float nc = std::min(std::max(n, -192.0f), 192.0f);
  const int n1 = static_cast<int>(nc * 0.5f);
  const int n2 = static_cast<int>(nc - static_cast<float>(n1));
  auto pow2 = [](int e) { return std::bit_cast<float>(static_cast<uint32_t>(e + 127) << 23); };
  return j * pow2(n1) * pow2(n2);
}

// _mm512_reduce_add_ps's tree.
float Reduce16(const float* a) {
  float t[8];
  for (int i = 0; i < 8; ++i) t[i] = a[i + 8] + a[i];
  for (int i = 0; i < 4; ++i) t[i] = t[i + 4] + t[i];
  return (t[0] + t[2]) + (t[1] + t[3]);
}

// ggml_vec_dot_f16 and tinyBLAS's dot (kernels_simd.inc's VecDotF16Ggml, GemmDotF16Ggml), over
// n halves x(i) and floats y[i], as ggml computes them on a row of `padded` elements whose last
// padded - n are zeros.
template <class X>
float VecDotF16Ggml(int64_t n, int64_t padded, X x, const float* y) {
  const int64_t whole = padded / 64 * 64;
  float acc[64] = {};
  for (int64_t i = 0; i < std::min(whole, n); ++i) {
    acc[i % 64] = std::fma(HalfToFloat(x(i)), y[i], acc[i % 64]);
  }
  double sum = 0.0;
  if (whole > 0) {
    float lanes[16];
    for (int l = 0; l < 16; ++l) lanes[l] = (acc[l] + acc[32 + l]) + (acc[16 + l] + acc[48 + l]);
    sum = Reduce16(lanes);
  }
  for (int64_t i = whole; i < n; ++i) sum += static_cast<double>(HalfToFloat(x(i)) * y[i]);
  return static_cast<float>(sum);
}

template <class X>
float GemmDotF16Ggml(int64_t n, X x, const float* y) {
  float lanes[16] = {};
  for (int64_t i = 0; i < n; ++i) lanes[i % 16] = std::fma(HalfToFloat(x(i)), y[i], lanes[i % 16]);
  return Reduce16(lanes);
}

}  // namespace

void SiluMulScalar(float* gate, const float* up, int64_t n) {
  const int64_t whole = n / 16 * 16;
  for (int64_t i = 0; i < n; ++i) {
    const float x = gate[i];
    const float e = i < whole ? ExpGgml(0.0f - x) : std::exp(-x);
    gate[i] = x / (1.0f + e) * up[i];
  }
}

namespace {

void AttendHeadScalarF16Ggml(int64_t n_kv, int64_t k_dim, int64_t v_dim, const float* q,
                             const HalfRows& k, const HalfRows& v, float scale, float softcap,
                             bool batched, float* scores, float* out) {
  constexpr int64_t kMaxDim = 256;  // as kernels_simd.inc's kMaxGgmlHeadDim
  if (k_dim > kMaxDim || v_dim > kMaxDim) {
    AttendScalar(n_kv, k_dim, v_dim, q, k, v, scale, softcap, scores, out);
    return;
  }
  float qh[kMaxDim];
  for (int64_t c = 0; c < k_dim; ++c) qh[c] = HalfToFloat(FloatToHalf(q[c]));
  float max = -INFINITY;
  for (int64_t j = 0; j < n_kv; ++j) {
    const uint16_t* row = k.Row(j);
    auto x = [row](int64_t i) { return row[i]; };
    float s = (batched && k_dim % 16 == 0 ? GemmDotF16Ggml(k_dim, x, qh)
                                          : VecDotF16Ggml(k_dim, k_dim, x, qh)) *
              scale;
    if (softcap > 0) s = softcap * std::tanh(s * (1.0f / softcap));
    scores[j] = s;
    max = std::max(max, s);
  }
  double sum = 0.0;
  for (int64_t j0 = 0; j0 < n_kv; j0 += 16) {
    float e[16] = {};
    for (int64_t l = 0; l < 16 && j0 + l < n_kv; ++l) {
      e[l] = ExpGgml(scores[j0 + l] - max);
      scores[j0 + l] = e[l];
    }
    sum += static_cast<double>(Reduce16(e));
  }
  const float inv = static_cast<float>(1.0 / sum);
  for (int64_t j = 0; j < n_kv; ++j) scores[j] = HalfToFloat(FloatToHalf(scores[j] * inv));
  // ggml's rows of kq hold the positions padded with masked ones (weight 0) to a multiple of 32.
  const int64_t n_pad = n_kv <= 32 ? 32 : (n_kv + 31) / 32 * 32;
  for (int64_t c = 0; c < v_dim; ++c) {
    auto x = [&v, c](int64_t j) { return v.Row(j)[c]; };
    out[c] = batched ? GemmDotF16Ggml(n_kv, x, scores) : VecDotF16Ggml(n_kv, n_pad, x, scores);
  }
}

}  // namespace

// Head by head: the reference of the kernels that take the heads together.
void AttendScalarF16Ggml(int64_t n_kv, int64_t k_dim, int64_t v_dim, int n_heads, const float* q,
                         int64_t q_stride, const HalfRows& k, const HalfRows& v, float scale,
                         float softcap, bool batched, float* scores, float* out,
                         int64_t out_stride) {
  for (int h = 0; h < n_heads; ++h) {
    AttendHeadScalarF16Ggml(n_kv, k_dim, v_dim, q + h * q_stride, k, v, scale, softcap, batched,
                            scores + h * n_kv, out + h * out_stride);
  }
}

namespace {

// ---- The axpy of the sparse down projection: element by element, in float ------------------

float F32At(const uint8_t* row, int64_t i) {
  float v;
  std::memcpy(&v, row + 4 * i, 4);
  return v;
}
float F16At(const uint8_t* row, int64_t i) {
  uint16_t h;
  std::memcpy(&h, row + 2 * i, 2);
  return HalfToFloat(h);
}
float Bf16At(const uint8_t* row, int64_t i) {
  uint16_t h;
  std::memcpy(&h, row + 2 * i, 2);
  return Bf16ToFloat(h);
}
float Q8_0At(const uint8_t* row, int64_t i) {
  const BlockQ8_0& b = reinterpret_cast<const BlockQ8_0*>(row)[i / kQK8_0];
  return HalfToFloat(b.d) * b.qs[i % kQK8_0];
}
float Q4_0At(const uint8_t* row, int64_t i) {
  const BlockQ4_0& b = reinterpret_cast<const BlockQ4_0*>(row)[i / kQK4_0];
  const int j = static_cast<int>(i % kQK4_0);
  const int q = j < kQK4_0 / 2 ? (b.qs[j] & 0x0F) : (b.qs[j - kQK4_0 / 2] >> 4);
  return HalfToFloat(b.d) * static_cast<float>(q - 8);
}

template <float (*At)(const uint8_t*, int64_t)>
void ScalarAxpy(int64_t n, int k, const float* a, const uint8_t* const* rows, float* acc) {
  for (int64_t i = 0; i < n; ++i) {
    float s = acc[i];
    for (int r = 0; r < k; ++r) s += a[r] * At(rows[r], i);
    acc[i] = s;
  }
}

std::vector<IsaTypeKernels> ScalarTypes() {
  using T = GgmlType;
  std::vector<IsaTypeKernels> types = {
      {T::kF32, FloatKernels<LoadF32>(F32FromFloat), {}, {}, ScalarAxpy<F32At>},
      {T::kF16, FloatKernels<LoadF16>(F16FromFloat), {}, {}, ScalarAxpy<F16At>},
      {T::kBF16, FloatKernels<LoadBf16>(Bf16FromFloat), {}, {}, ScalarAxpy<Bf16At>},
      {T::kQ8_0,
       QuantKernels<Q8_0Weight, BlockQ8_0>(Q8_0ToFloat, Q8_0FromFloat<true>, Q8_0FromFloat<false>),
       {},
       {},
       ScalarAxpy<Q8_0At>},
      {T::kQ4_0,
       QuantKernels<Q4_0Weight, BlockQ4_0>(Q4_0ToFloat, QuantizeQ4_0Reference),
       {},
       {},
       ScalarAxpy<Q4_0At>},
  };
  for (const IsaTypeKernels& k : ScalarQuantTypes()) types.push_back(k);
  // Activations only: the Q8_1 conversions, no dot.
  types.push_back(
      {T::kQ8_1, {T::kF32, Q8_1ToFloat, Q8_1FromFloat, nullptr, nullptr}, {}, {}, nullptr});
  return types;
}

}  // namespace

const IsaKernels& ScalarKernels() {
  static const std::vector<IsaTypeKernels> types = ScalarTypes();
  static const IsaKernels kernels = {types.data(),
                                     static_cast<int>(types.size()),
                                     AttendScalarF32,
                                     AttendScalarF16Ggml,
                                     SiluMulScalar,
                                     ScalarQ4GroupKernels(),
                                     ScalarQ2KGroupKernels(),
                                     ScalarQ3KGroupKernels(),
                                     ScalarQ4KGroupKernels(),
                                     ScalarQ5KGroupKernels(),
                                     ScalarQ6KGroupKernels()};
  return kernels;
}

}  // namespace ops_internal
}  // namespace thermocline
