// The vector API kernels_simd.inc is written against, for AVX2 + FMA + F16C: F holds kLanes
// floats, I holds kBlocks 32-byte int8 blocks. Include only from kernels_avx2.cc (it needs
// -mavx2 -mfma -mf16c); vec_avx512.h is the same API for AVX-512.
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "engine/ops/ggml_types.h"

namespace thermocline::vec_avx2 {

constexpr int kLanes = 8;
constexpr int kBlocks = 1;
constexpr bool kVnni = false;
using F = __m256;
using I = __m256i;

// ---- Floats ----
inline F Zero() { return _mm256_setzero_ps(); }
inline F Set1(float v) { return _mm256_set1_ps(v); }
inline F Load(const float* p) { return _mm256_loadu_ps(p); }
inline void Store(float* p, F v) { _mm256_storeu_ps(p, v); }
inline F LoadHalf(const uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
inline void StoreHalf(uint16_t* p, F v) {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p),
                   _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
inline F LoadBf16(const uint16_t* p) {
  const __m256i u = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(u, 16));
}
// Round to nearest even; NaN -> (bits >> 16) | 64, as FloatToBf16.
inline void StoreBf16(uint16_t* p, F v) {
  const __m256i u = _mm256_castps_si256(v);
  const __m256i hi = _mm256_srli_epi32(u, 16);
  const __m256i odd = _mm256_and_si256(hi, _mm256_set1_epi32(1));
  const __m256i rounded =
      _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7FFF), odd)), 16);
  const __m256i is_nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7FFFFFFF)),
                                            _mm256_set1_epi32(0x7F800000));
  const __m256i r = _mm256_blendv_epi8(rounded, _mm256_or_si256(hi, _mm256_set1_epi32(64)), is_nan);
  const __m128i packed =
      _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), packed);
}
// kLanes int8 -> float.
inline F LoadI8(const int8_t* p) {
  const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b));
}
// v holds integers in [-128, 127]: stored as kLanes int8.
inline void StoreI8(int8_t* p, F v) {
  const __m256i i = _mm256_cvtps_epi32(v);
  const __m128i w = _mm_packs_epi32(_mm256_castsi256_si128(i), _mm256_extracti128_si256(i, 1));
  _mm_storel_epi64(reinterpret_cast<__m128i*>(p), _mm_packs_epi16(w, w));
}
inline F Add(F a, F b) { return _mm256_add_ps(a, b); }
inline F Sub(F a, F b) { return _mm256_sub_ps(a, b); }
inline F Mul(F a, F b) { return _mm256_mul_ps(a, b); }
inline F Fma(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
inline F Max(F a, F b) { return _mm256_max_ps(a, b); }
inline F Min(F a, F b) { return _mm256_min_ps(a, b); }
inline F Div(F a, F b) { return _mm256_div_ps(a, b); }
inline F Abs(F v) { return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), v); }
// roundf: halfway cases away from zero.
inline F RoundHalfAway(F v) {
  const F t = _mm256_round_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
  const F up = _mm256_cmp_ps(Abs(_mm256_sub_ps(v, t)), _mm256_set1_ps(0.5f), _CMP_GE_OQ);
  const F one = _mm256_or_ps(_mm256_and_ps(v, _mm256_set1_ps(-0.0f)), _mm256_set1_ps(1.0f));
  return _mm256_add_ps(t, _mm256_and_ps(up, one));
}
inline float ReduceAdd(F v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}
// out[p] = ReduceAdd(v[p]) for kLanes vectors (vec_avx512.h's takes them across at once).
inline void ReduceAddEach(const F* v, float* out) {
  for (int p = 0; p < kLanes; ++p) out[p] = ReduceAdd(v[p]);
}
// acc[0, kLanes) += v's lanes, each widened to double (exact) and added in double.
inline void AddToDoubles(double* acc, F v) {
  _mm256_storeu_pd(acc,
                   _mm256_add_pd(_mm256_loadu_pd(acc), _mm256_cvtps_pd(_mm256_castps256_ps128(v))));
  _mm256_storeu_pd(acc + 4, _mm256_add_pd(_mm256_loadu_pd(acc + 4),
                                          _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1))));
}
inline float ReduceMax(F v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_max_ss(s, _mm_movehdup_ps(s)));
}
inline float HalfToFloat(uint16_t h) { return _cvtsh_ss(h); }
inline uint16_t FloatToHalf(float f) {
  return static_cast<uint16_t>(_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

// ---- Int8 blocks (nblk <= kBlocks blocks per I; the rest zero) ----
// Q4_0 quants as unsigned 0..15 in element order (low nibbles, then high nibbles).
inline I LoadQ4(const BlockQ4_0* b, int /*nblk*/) {
  const __m256i q =
      _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b->qs)));
  const __m256i shifted = _mm256_srlv_epi32(q, _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4));
  return _mm256_and_si256(shifted, _mm256_set1_epi8(0x0F));
}
inline I LoadQ8(const BlockQ8_0* b, int /*nblk*/) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b->qs));
}
inline I LoadBytes(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }
inline void StoreBytes(void* p, I v) { _mm256_storeu_si256(static_cast<__m256i*>(p), v); }
inline I SubI8(I v, int8_t c) { return _mm256_sub_epi8(v, _mm256_set1_epi8(c)); }
// Each block's fp16 scale, in all of its 8 int32 lanes.
template <class Block>
inline F LoadScales(const Block* b, int /*nblk*/) {
  return _mm256_cvtph_ps(_mm_set1_epi16(static_cast<int16_t>(b->d)));
}
// int32 lane i = sum of u[4i+t] * s[4i+t], u unsigned, s signed (u * s pairs must fit int16).
inline I DotU8S8(I u, I s) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}
// The same for two signed operands (sign trick; |w| <= 127).
inline I DotS8S8(I w, I x) { return DotU8S8(_mm256_abs_epi8(x), _mm256_sign_epi8(w, x)); }
// Flips the top bit: w + 128 as unsigned (used by the VNNI kernels only).
inline I FlipSign(I v) { return _mm256_xor_si256(v, _mm256_set1_epi8(static_cast<char>(0x80))); }
inline F ToFloat(I v) { return _mm256_cvtepi32_ps(v); }
// Float to int32 lanes, rounded to nearest even.
inline I ToIntRound(F v) { return _mm256_cvtps_epi32(v); }
// Float to int32 lanes, truncated toward zero (a C++ float-to-int cast).
inline I ToIntTrunc(F v) { return _mm256_cvttps_epi32(v); }
// v, kept apart: the product that made it is not fused into a later add (GCC contracts
// a * b + c into an FMA otherwise) where a reference rounds the product first.
inline F Unfused(F v) {
  __asm__("" : "+v"(v));
  return v;
}

// ---- Int32 / int16 lanes (the tile kernels: one weight row per int32 lane) ----
inline I ZeroI() { return _mm256_setzero_si256(); }
inline I Set1I32(int32_t v) { return _mm256_set1_epi32(v); }
inline I Broadcast32(const void* p) {  // 4 bytes into every int32 lane
  int32_t v;
  __builtin_memcpy(&v, p, 4);
  return _mm256_set1_epi32(v);
}
inline I AddI32(I a, I b) { return _mm256_add_epi32(a, b); }
inline I AddI16(I a, I b) { return _mm256_add_epi16(a, b); }
// int16 lane i = u[2i] * s[2i] + u[2i+1] * s[2i+1] (saturating), u unsigned, s signed.
inline I MulPairsU8S8(I u, I s) { return _mm256_maddubs_epi16(u, s); }
// int32 lane i = int16 lanes 2i + 2i+1.
inline I WidenPairsI16(I v) { return _mm256_madd_epi16(v, _mm256_set1_epi16(1)); }
// acc + DotU8S8(u, s).
inline I DotAccU8S8(I acc, I u, I s) { return AddI32(acc, DotU8S8(u, s)); }
// out[j] lane r = dword j of the 16 bytes at p + r * stride, for kLanes rows (a transpose).
inline void LoadTranspose4(const uint8_t* p, int64_t stride, I out[4]) {
  I z[4];
  for (int k = 0; k < 4; ++k) {  // 128-bit lane L of z[k] = row 4L + k
    const __m128i lo = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + k * stride));
    const __m128i hi = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + (4 + k) * stride));
    z[k] = _mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1);
  }
  const __m256i t0 = _mm256_unpacklo_epi32(z[0], z[1]), t1 = _mm256_unpackhi_epi32(z[0], z[1]);
  const __m256i t2 = _mm256_unpacklo_epi32(z[2], z[3]), t3 = _mm256_unpackhi_epi32(z[2], z[3]);
  out[0] = _mm256_unpacklo_epi64(t0, t2);
  out[1] = _mm256_unpackhi_epi64(t0, t2);
  out[2] = _mm256_unpacklo_epi64(t1, t3);
  out[3] = _mm256_unpackhi_epi64(t1, t3);
}
inline I AndI(I a, int32_t mask) { return _mm256_and_si256(a, _mm256_set1_epi32(mask)); }
// kLanes bytes at p, zero-extended into int32 lanes.
inline I LoadU8AsI32(const uint8_t* p) {
  return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
}
// kLanes bytes at p, sign-extended into int32 lanes.
inline I LoadS8AsI32(const uint8_t* p) {
  return _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
}
// 2 kLanes bytes at p, zero-extended into int16 lanes.
inline I LoadU8AsI16(const uint8_t* p) {
  return _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
inline I MulI32(I a, I b) { return _mm256_mullo_epi32(a, b); }
inline I ShiftRightI32(I a, int bits) { return _mm256_srli_epi32(a, bits); }
inline I ShiftLeftI32(I a, int bits) { return _mm256_slli_epi32(a, bits); }
inline F AsFloat(I v) { return _mm256_castsi256_ps(v); }
// The halves in the low 16 bits of each int32 lane, as floats.
inline F HalfLowToFloat(I v) {
  const __m256i h = _mm256_and_si256(v, _mm256_set1_epi32(0xFFFF));
  return _mm256_cvtph_ps(
      _mm_packus_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1)));
}

// ---- Decoding the other quantized types (kBlocks groups of 32 int8 per I) ----
// 32 bytes at p (AVX-512: and 32 at p + step in the upper half).
inline I LoadGroups(const uint8_t* p, int64_t /*step*/) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
}
// 16-bit lanes shifted right by s0 (AVX-512: the upper half by s1).
inline I SrlGroups(I v, int s0, int /*s1*/) { return _mm256_srl_epi16(v, _mm_cvtsi32_si128(s0)); }
inline I SllI16(I v, int s) { return _mm256_sll_epi16(v, _mm_cvtsi32_si128(s)); }
inline I AndBytes(I v, int m) {
  return _mm256_and_si256(v, _mm256_set1_epi8(static_cast<char>(m)));
}
inline I OrI(I a, I b) { return _mm256_or_si256(a, b); }
// The 16 nibble bytes of a block at qs as 32 values 0..15 in element order (low nibbles, then
// high ones); AVX-512: the next block's, block_bytes further, in the upper half when nblk > 1.
inline I LoadNibbles(const uint8_t* qs, int64_t /*block_bytes*/, int /*nblk*/) {
  const __m256i q =
      _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qs)));
  const __m256i shifted = _mm256_srlv_epi32(q, _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4));
  return _mm256_and_si256(shifted, _mm256_set1_epi8(0x0F));
}
// Bit j of the 32-bit little-endian mask at p as byte j: 0xFF where set, 0 where clear.
inline I LoadBitBytes(const uint8_t* p, int64_t /*block_bytes*/, int /*nblk*/) {
  uint32_t bits;
  __builtin_memcpy(&bits, p, 4);
  const __m256i spread =
      _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(bits)),
                          _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2,
                                           2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3));
  const __m256i mask = _mm256_set1_epi64x(static_cast<int64_t>(0x8040201008040201ULL));
  return _mm256_cmpeq_epi8(_mm256_and_si256(spread, mask), mask);
}
// The fp16 value at p in every lane of its block (AVX-512: the next block's, block_bytes further,
// in lanes 8..15, zero when nblk == 1).
inline F LoadHalfLanes(const uint8_t* p, int64_t /*block_bytes*/, int /*nblk*/) {
  uint16_t h;
  __builtin_memcpy(&h, p, 2);
  return _mm256_cvtph_ps(_mm_set1_epi16(static_cast<int16_t>(h)));
}
// Bytes 0..15 of idx replaced by table[idx] (16 int8 values).
inline I Lut16(I idx, const int8_t* table) {
  const __m256i t =
      _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(table)));
  return _mm256_shuffle_epi8(t, idx);
}
// int16 lane i = w[2i] * x[2i] + w[2i+1] * x[2i+1], both signed (|w|, |x| <= 127).
inline I MulPairsS8S8(I w, I x) {
  return _mm256_maddubs_epi16(_mm256_abs_epi8(x), _mm256_sign_epi8(w, x));
}
// int16 lanes holding s[h] in the 8 lanes of each 16 elements h of the I (s[0..2 kBlocks)).
inline I ScaleVector(const int16_t* s) {
  int32_t v;
  __builtin_memcpy(&v, s, 4);
  return _mm256_shuffle_epi8(_mm256_set1_epi32(v),
                             _mm256_setr_epi8(0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 2, 3,
                                              2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3, 2, 3));
}
// int32 lane i = a[2i] * b[2i] + a[2i+1] * b[2i+1] (int16 lanes).
inline I MaddI16(I a, I b) { return _mm256_madd_epi16(a, b); }
inline I SubI16(I a, I b) { return _mm256_sub_epi16(a, b); }
// acc + MaddI16(a, b).
inline I MaddAccI16(I acc, I a, I b) { return AddI32(acc, MaddI16(a, b)); }
// Each int32 lane's low 16 bits in both of its halves: an int16 value v as the pair (v, v).
inline I DupLowI16(I v) {
  const __m128i pick = _mm_setr_epi32(0x01000100, 0x05040504, 0x09080908, 0x0D0C0D0C);
  return _mm256_shuffle_epi8(v, _mm256_broadcastsi128_si256(pick));
}
// Σ a[i] * b[i] over 16 int16 values.
inline int32_t DotI16x16(const int16_t* a, const int16_t* b) {
  const __m256i p = _mm256_madd_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(a)),
                                      _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b)));
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(p), _mm256_extracti128_si256(p, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
  return _mm_cvtsi128_si32(s);
}
// A Q4_0 block's quants minus 8 as floats in element order (kQK4_0 / kLanes vectors).
inline void Q4SignedFloats(const BlockQ4_0* b, F out[4]) {
  const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b->qs));
  const __m256i lo = _mm256_cvtepu8_epi32(q);                     // bytes 0..7
  const __m256i hi = _mm256_cvtepu8_epi32(_mm_srli_si128(q, 8));  // bytes 8..15
  const __m256i mask = _mm256_set1_epi32(15), eight = _mm256_set1_epi32(8);
  out[0] = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_and_si256(lo, mask), eight));
  out[1] = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_and_si256(hi, mask), eight));
  out[2] = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_srli_epi32(lo, 4), eight));
  out[3] = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_srli_epi32(hi, 4), eight));
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
// The int32 lanes of an I as 8 floats (lane m: elements 4m .. 4m + 3 of each 32).
inline F8 ToFloat8(I v) { return _mm256_cvtepi32_ps(v); }
// Blocks of 32 bytes (kBlocks 1: only a), and the int32 lanes of each as 8 floats.
inline I LoadBlocks32(const void* a, const void* /*b*/) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a));
}
inline F8 LowToFloat8(I v) { return _mm256_cvtepi32_ps(v); }
inline F8 HighToFloat8(I /*v*/) { return _mm256_setzero_ps(); }

}  // namespace thermocline::vec_avx2
