// The vector API of vec_avx2.h for AVX-512 (F, BW, VL, DQ): 16 floats per F, two 32-byte int8
// blocks per I. With THERMOCLINE_VNNI defined (kernels_vnni_avx512.cc, which enables the
// instructions), int8 dots use vpdpbusd. Include only from those two files.
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "engine/ops/ggml_types.h"

// GCC 12 warns about its own _mm512_undefined_* inside the intrinsics (GCC bug 105593).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#ifdef THERMOCLINE_VNNI
#define THERMOCLINE_VEC_NS vec_avx512_vnni
#else
#define THERMOCLINE_VEC_NS vec_avx512
#endif

namespace thermocline::THERMOCLINE_VEC_NS {

constexpr int kLanes = 16;
constexpr int kBlocks = 2;
#ifdef THERMOCLINE_VNNI
constexpr bool kVnni = true;
#else
constexpr bool kVnni = false;
#endif
using F = __m512;
using I = __m512i;

// ---- Floats ----
inline F Zero() { return _mm512_setzero_ps(); }
inline F Set1(float v) { return _mm512_set1_ps(v); }
inline F Load(const float* p) { return _mm512_loadu_ps(p); }
inline void Store(float* p, F v) { _mm512_storeu_ps(p, v); }
inline F LoadHalf(const uint16_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
inline void StoreHalf(uint16_t* p, F v) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p),
                      _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
inline F LoadBf16(const uint16_t* p) {
  const __m512i u = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return _mm512_castsi512_ps(_mm512_slli_epi32(u, 16));
}
// Round to nearest even; NaN -> (bits >> 16) | 64, as FloatToBf16.
inline void StoreBf16(uint16_t* p, F v) {
  const __m512i u = _mm512_castps_si512(v);
  const __m512i hi = _mm512_srli_epi32(u, 16);
  const __m512i odd = _mm512_and_si512(hi, _mm512_set1_epi32(1));
  const __m512i rounded =
      _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(_mm512_set1_epi32(0x7FFF), odd)), 16);
  const __mmask16 is_nan = _mm512_cmpgt_epi32_mask(
      _mm512_and_si512(u, _mm512_set1_epi32(0x7FFFFFFF)), _mm512_set1_epi32(0x7F800000));
  const __m512i r = _mm512_mask_or_epi32(rounded, is_nan, hi, _mm512_set1_epi32(64));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(r));
}
inline F LoadI8(const int8_t* p) {
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b));
}
inline void StoreI8(int8_t* p, F v) {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(v)));
}
inline F Add(F a, F b) { return _mm512_add_ps(a, b); }
inline F Sub(F a, F b) { return _mm512_sub_ps(a, b); }
inline F Mul(F a, F b) { return _mm512_mul_ps(a, b); }
inline F Fma(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
inline F Max(F a, F b) { return _mm512_max_ps(a, b); }
inline F Min(F a, F b) { return _mm512_min_ps(a, b); }
inline F Div(F a, F b) { return _mm512_div_ps(a, b); }
inline F Abs(F v) { return _mm512_abs_ps(v); }
inline F RoundHalfAway(F v) {
  const F t = _mm512_roundscale_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
  const __mmask16 up =
      _mm512_cmp_ps_mask(Abs(_mm512_sub_ps(v, t)), _mm512_set1_ps(0.5f), _CMP_GE_OQ);
  const F one = _mm512_or_ps(_mm512_and_ps(v, _mm512_set1_ps(-0.0f)), _mm512_set1_ps(1.0f));
  return _mm512_mask_add_ps(t, up, t, one);
}
inline float ReduceAdd(F v) { return _mm512_reduce_add_ps(v); }
// out[p] = ReduceAdd(v[p]) bit for bit, for kLanes vectors at once: the same tree of sums
// (_mm512_reduce_add_ps: lane i + lane i + 8, then i + 4, i + 2, i + 1), taken across the
// vectors by shuffles instead of one vector at a time.
inline void ReduceAddEach(const F* v, float* out) {
  F s1[8], s2[4], s3[2];
  for (int k = 0; k < 8; ++k) {  // [a.lo256 | b.lo256] + [a.hi256 | b.hi256]
    s1[k] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * k], v[2 * k + 1], 0x44),
                          _mm512_shuffle_f32x4(v[2 * k], v[2 * k + 1], 0xEE));
  }
  for (int k = 0; k < 4; ++k) {  // 128-bit chunk c: vector 4k + c's lanes i + (i + 4)
    s2[k] = _mm512_add_ps(_mm512_shuffle_f32x4(s1[2 * k], s1[2 * k + 1], 0x88),
                          _mm512_shuffle_f32x4(s1[2 * k], s1[2 * k + 1], 0xDD));
  }
  for (int k = 0; k < 2; ++k) {  // chunk c: vectors 8k + c and 8k + 4 + c, lanes i + (i + 2)
    s3[k] = _mm512_add_ps(_mm512_shuffle_ps(s2[2 * k], s2[2 * k + 1], 0x44),
                          _mm512_shuffle_ps(s2[2 * k], s2[2 * k + 1], 0xEE));
  }
  // Lane 4c + m: vector c + 4m's sum; permuted back to lane p: vector p.
  const F r =
      _mm512_add_ps(_mm512_shuffle_ps(s3[0], s3[1], 0x88), _mm512_shuffle_ps(s3[0], s3[1], 0xDD));
  const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  _mm512_storeu_ps(out, _mm512_permutexvar_ps(order, r));
}
inline float ReduceMax(F v) { return _mm512_reduce_max_ps(v); }
// acc[0, kLanes) += v's lanes, each widened to double (exact) and added in double.
inline void AddToDoubles(double* acc, F v) {
  _mm512_storeu_pd(acc,
                   _mm512_add_pd(_mm512_loadu_pd(acc), _mm512_cvtps_pd(_mm512_castps512_ps256(v))));
  _mm512_storeu_pd(acc + 8, _mm512_add_pd(_mm512_loadu_pd(acc + 8),
                                          _mm512_cvtps_pd(_mm512_extractf32x8_ps(v, 1))));
}
inline float HalfToFloat(uint16_t h) { return _cvtsh_ss(h); }
inline uint16_t FloatToHalf(float f) {
  return static_cast<uint16_t>(_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

// ---- Int8 blocks (nblk <= kBlocks blocks per I; the rest zero) ----
// Q4_0 quants as unsigned 0..15 in element order: 128-bit lanes [lo0 hi0 lo1 hi1].
inline I LoadNibbles(const uint8_t* qs, int64_t block_bytes, int nblk);
inline I LoadQ4(const BlockQ4_0* b, int nblk) {
  return LoadNibbles(b[0].qs, sizeof(BlockQ4_0), nblk);
}
inline I LoadQ8(const BlockQ8_0* b, int nblk) {
  const __m256i lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b[0].qs));
  if (nblk == 1) return _mm512_zextsi256_si512(lo);
  return _mm512_inserti64x4(_mm512_castsi256_si512(lo),
                            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b[1].qs)), 1);
}
inline I LoadBytes(const void* p) { return _mm512_loadu_si512(p); }
inline void StoreBytes(void* p, I v) { _mm512_storeu_si512(p, v); }
inline I SubI8(I v, int8_t c) { return _mm512_sub_epi8(v, _mm512_set1_epi8(c)); }
template <class Block>
inline F LoadScales(const Block* b, int nblk) {
  const __m128i d0 = _mm_set1_epi16(static_cast<int16_t>(b[0].d));
  const __m128i d1 = nblk > 1 ? _mm_set1_epi16(static_cast<int16_t>(b[1].d)) : _mm_setzero_si128();
  return _mm512_cvtph_ps(_mm256_set_m128i(d1, d0));
}
inline I DotU8S8(I u, I s) {
#ifdef THERMOCLINE_VNNI
  return _mm512_dpbusd_epi32(_mm512_setzero_si512(), u, s);
#else
  return _mm512_madd_epi16(_mm512_maddubs_epi16(u, s), _mm512_set1_epi16(1));
#endif
}
// Two signed operands: |x| times w with x's sign (AVX-512 has no vpsignb).
inline I DotS8S8(I w, I x) {
  const __mmask64 negative = _mm512_movepi8_mask(x);
  const __m512i signed_w = _mm512_mask_sub_epi8(w, negative, _mm512_setzero_si512(), w);
  return DotU8S8(_mm512_abs_epi8(x), signed_w);
}
// Flips the top bit: w + 128 as unsigned (for VNNI's unsigned x signed products).
inline I FlipSign(I v) { return _mm512_xor_si512(v, _mm512_set1_epi8(static_cast<char>(0x80))); }
inline F ToFloat(I v) { return _mm512_cvtepi32_ps(v); }
// Float to int32 lanes, rounded to nearest even.
inline I ToIntRound(F v) { return _mm512_cvtps_epi32(v); }
// Float to int32 lanes, truncated toward zero (a C++ float-to-int cast).
inline I ToIntTrunc(F v) { return _mm512_cvttps_epi32(v); }
// v, kept apart: the product that made it is not fused into a later add (GCC contracts
// a * b + c into an FMA otherwise) where a reference rounds the product first.
inline F Unfused(F v) {
  __asm__("" : "+v"(v));
  return v;
}

// ---- Int32 / int16 lanes (the tile kernels: one weight row per int32 lane) ----
inline I ZeroI() { return _mm512_setzero_si512(); }
inline I Set1I32(int32_t v) { return _mm512_set1_epi32(v); }
inline I Broadcast32(const void* p) {  // 4 bytes into every int32 lane (an embedded broadcast)
  int32_t v;
  __builtin_memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}
inline I AddI32(I a, I b) { return _mm512_add_epi32(a, b); }
inline I AddI16(I a, I b) { return _mm512_add_epi16(a, b); }
inline I MulPairsU8S8(I u, I s) { return _mm512_maddubs_epi16(u, s); }
inline I WidenPairsI16(I v) { return _mm512_madd_epi16(v, _mm512_set1_epi16(1)); }
inline I DotAccU8S8(I acc, I u, I s) {
#ifdef THERMOCLINE_VNNI
  return _mm512_dpbusd_epi32(acc, u, s);
#else
  return AddI32(acc, DotU8S8(u, s));
#endif
}
// out[j] lane r = dword j of the 16 bytes at p + r * stride, for kLanes rows (a transpose).
inline void LoadTranspose4(const uint8_t* p, int64_t stride, I out[4]) {
  I z[4];
  for (int k = 0; k < 4; ++k) {  // 128-bit lane L of z[k] = row 4L + k
    const auto row = [&](int r) {
      return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + r * stride));
    };
    z[k] = _mm512_castsi128_si512(row(k));
    z[k] = _mm512_inserti32x4(z[k], row(4 + k), 1);
    z[k] = _mm512_inserti32x4(z[k], row(8 + k), 2);
    z[k] = _mm512_inserti32x4(z[k], row(12 + k), 3);
  }
  const __m512i t0 = _mm512_unpacklo_epi32(z[0], z[1]), t1 = _mm512_unpackhi_epi32(z[0], z[1]);
  const __m512i t2 = _mm512_unpacklo_epi32(z[2], z[3]), t3 = _mm512_unpackhi_epi32(z[2], z[3]);
  out[0] = _mm512_unpacklo_epi64(t0, t2);
  out[1] = _mm512_unpackhi_epi64(t0, t2);
  out[2] = _mm512_unpacklo_epi64(t1, t3);
  out[3] = _mm512_unpackhi_epi64(t1, t3);
}
inline I AndI(I a, int32_t mask) { return _mm512_and_si512(a, _mm512_set1_epi32(mask)); }
// kLanes bytes at p, zero-extended into int32 lanes.
inline I LoadU8AsI32(const uint8_t* p) {
  return _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
// kLanes bytes at p, sign-extended into int32 lanes.
inline I LoadS8AsI32(const uint8_t* p) {
  return _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
// 2 kLanes bytes at p, zero-extended into int16 lanes.
inline I LoadU8AsI16(const uint8_t* p) {
  return _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
inline I MulI32(I a, I b) { return _mm512_mullo_epi32(a, b); }
inline I ShiftRightI32(I a, int bits) { return _mm512_srli_epi32(a, bits); }
inline I ShiftLeftI32(I a, int bits) { return _mm512_slli_epi32(a, bits); }
inline F AsFloat(I v) { return _mm512_castsi512_ps(v); }
inline F HalfLowToFloat(I v) { return _mm512_cvtph_ps(_mm512_cvtepi32_epi16(v)); }

// ---- Decoding the other quantized types (kBlocks groups of 32 int8 per I) ----
inline I LoadGroups(const uint8_t* p, int64_t step) {
  const __m256i lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  if (step == 0) return _mm512_broadcast_i64x4(lo);
  return _mm512_inserti64x4(_mm512_castsi256_si512(lo),
                            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + step)), 1);
}
inline I SrlGroups(I v, int s0, int s1) {
  const __m512i shifts = _mm512_inserti64x4(_mm512_set1_epi16(static_cast<int16_t>(s0)),
                                            _mm256_set1_epi16(static_cast<int16_t>(s1)), 1);
  return _mm512_srlv_epi16(v, shifts);
}
inline I SllI16(I v, int s) { return _mm512_sll_epi16(v, _mm_cvtsi32_si128(s)); }
inline I AndBytes(I v, int m) {
  return _mm512_and_si512(v, _mm512_set1_epi8(static_cast<char>(m)));
}
inline I OrI(I a, I b) { return _mm512_or_si512(a, b); }
// Two blocks' 16 quant bytes as 128-bit lanes [a a b b], each lane's second copy shifted to its
// high nibbles. Plain loads and one permute: a masked broadcast from memory here (the obvious
// way to build [a a 0 0] then fill [. . b b]) ran Zen 5's IQ4_XS decode at a third of AVX2's
// speed (8.7 vs 25.8 tokens/s on the 1.1B shape, one thread).
inline I LoadNibbles(const uint8_t* qs, int64_t block_bytes, int nblk) {
  const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m128i b = nblk > 1 ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs + block_bytes))
                             : _mm_setzero_si128();
  const __m512i ab =
      _mm512_castsi256_si512(_mm256_inserti128_si256(_mm256_castsi128_si256(a), b, 1));
  const __m512i q = _mm512_permutexvar_epi64(_mm512_setr_epi64(0, 1, 0, 1, 2, 3, 2, 3), ab);
  const __m512i shift = _mm512_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4, 0, 0, 0, 0, 4, 4, 4, 4);
  return _mm512_and_si512(_mm512_srlv_epi32(q, shift), _mm512_set1_epi8(0x0F));
}
inline I LoadBitBytes(const uint8_t* p, int64_t block_bytes, int nblk) {
  uint32_t lo, hi = 0;
  __builtin_memcpy(&lo, p, 4);
  if (nblk > 1) __builtin_memcpy(&hi, p + block_bytes, 4);
  return _mm512_movm_epi8(static_cast<__mmask64>(lo) | (static_cast<__mmask64>(hi) << 32));
}
inline F LoadHalfLanes(const uint8_t* p, int64_t block_bytes, int nblk) {
  uint16_t h0, h1 = 0;
  __builtin_memcpy(&h0, p, 2);
  if (nblk > 1) __builtin_memcpy(&h1, p + block_bytes, 2);
  return _mm512_cvtph_ps(_mm256_set_m128i(_mm_set1_epi16(static_cast<int16_t>(h1)),
                                          _mm_set1_epi16(static_cast<int16_t>(h0))));
}
inline I Lut16(I idx, const int8_t* table) {
  const __m512i t =
      _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(table)));
  return _mm512_shuffle_epi8(t, idx);
}
inline I MulPairsS8S8(I w, I x) {
  const __mmask64 negative = _mm512_movepi8_mask(x);
  const __m512i signed_w = _mm512_mask_sub_epi8(w, negative, _mm512_setzero_si512(), w);
  return _mm512_maddubs_epi16(_mm512_abs_epi8(x), signed_w);
}
inline I ScaleVector(const int16_t* s) {
  int64_t v;
  __builtin_memcpy(&v, s, 8);
  const __m512i pattern = _mm512_set_epi64(
      0x0706070607060706LL, 0x0706070607060706LL, 0x0504050405040504LL, 0x0504050405040504LL,
      0x0302030203020302LL, 0x0302030203020302LL, 0x0100010001000100LL, 0x0100010001000100LL);
  return _mm512_shuffle_epi8(_mm512_set1_epi64(v), pattern);
}
inline I MaddI16(I a, I b) { return _mm512_madd_epi16(a, b); }
inline I SubI16(I a, I b) { return _mm512_sub_epi16(a, b); }
// acc + MaddI16(a, b) (one instruction with VNNI).
inline I MaddAccI16(I acc, I a, I b) {
#ifdef THERMOCLINE_VNNI
  return _mm512_dpwssd_epi32(acc, a, b);
#else
  return AddI32(acc, MaddI16(a, b));
#endif
}
// Each int32 lane's low 16 bits in both of its halves: an int16 value v as the pair (v, v).
inline I DupLowI16(I v) {
  const __m128i pick = _mm_setr_epi32(0x01000100, 0x05040504, 0x09080908, 0x0D0C0D0C);
  return _mm512_shuffle_epi8(v, _mm512_broadcast_i32x4(pick));
}
inline int32_t DotI16x16(const int16_t* a, const int16_t* b) {
  const __m256i p = _mm256_madd_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(a)),
                                      _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b)));
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(p), _mm256_extracti128_si256(p, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
  return _mm_cvtsi128_si32(s);
}
// A Q4_0 block's quants minus 8 as floats in element order: a nibble in the low bits of a
// 32-bit lane indexes a table of the 16 values (vpermps reads 4 bits).
inline void Q4SignedFloats(const BlockQ4_0* b, F out[2]) {
  const __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b->qs)));
  const __m512 values = _mm512_setr_ps(-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7);
  out[0] = _mm512_permutexvar_ps(v, values);
  out[1] = _mm512_permutexvar_ps(_mm512_srli_epi32(v, 4), values);
}

// ---- Super-block scales: 16 small integers as int16 (256-bit operations on both ISAs) ----
// out[j] = p[j], 16 bytes unsigned / signed.
inline void WidenU8x16(const uint8_t* p, int16_t* out) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out),
                      _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}
inline void WidenS8x16(const void* p, int16_t* out) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out),
                      _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}
// out[2j] = out[2j + 1] = p[j], 8 bytes unsigned (scales of groups of 32 per 16 elements).
inline void WidenU8x8Twice(const uint8_t* p, int16_t* out) {
  __m128i v = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
  v = _mm_unpacklo_epi8(v, v);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), _mm256_cvtepu8_epi16(v));
}
// The same for 8 signed bytes.
inline void WidenS8x8Twice(const void* p, int16_t* out) {
  __m128i v = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
  v = _mm_unpacklo_epi8(v, v);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), _mm256_cvtepi8_epi16(v));
}
// out[j] = p[j] & 15 and hi[j] = p[j] >> 4 for 16 bytes.
inline void SplitNibbles16(const uint8_t* p, int16_t* lo, int16_t* hi) {
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const __m128i mask = _mm_set1_epi8(0x0F);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(lo), _mm256_cvtepu8_epi16(_mm_and_si128(v, mask)));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(hi),
                      _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(v, 4), mask)));
}
// The bits of a deposited at the set bits of mask, low to high (BMI2 pdep).
inline uint64_t DepositBits(uint64_t a, uint64_t mask) { return _pdep_u64(a, mask); }
inline void ZeroI16x16(int16_t* out) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), _mm256_setzero_si256());
}

// ---- Eight float lanes: the accumulators of ggml's x86 super-block dots (kquant_simd.inc) ----
#include "engine/ops/vec_f8.inc"
// The int32 lanes of an I folded into 8 (lane m + lane m + 8: elements 4m .. 4m + 3 of each of
// the two groups of 32), as floats.
inline F8 ToFloat8(I v) {
  return _mm256_cvtepi32_ps(
      _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1)));
}
// Blocks of 32 bytes a and b in the low and high halves, and the int32 lanes of each half as 8
// floats.
inline I LoadBlocks32(const void* a, const void* b) {
  return _mm512_inserti64x4(
      _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(a))),
      _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b)), 1);
}
inline F8 LowToFloat8(I v) { return _mm256_cvtepi32_ps(_mm512_castsi512_si256(v)); }
inline F8 HighToFloat8(I v) { return _mm256_cvtepi32_ps(_mm512_extracti64x4_epi64(v, 1)); }

}  // namespace thermocline::THERMOCLINE_VEC_NS

#undef THERMOCLINE_VEC_NS
