// The integer column-sparse kernel on AVX2 (CPUs without AVX512_VNNI): the VNNI kernel's
// interleave of four kept columns on 256-bit halves of a chunk, with vpmaddubsw + vpmaddwd in
// place of vpdpbusd. vpmaddubsw adds pairs of u8 · s8 products in int16 with saturation, so
// 8-bit quants go in as |w| against the inputs given w's sign (each pair at most 2 · 128 · 127,
// within int16), and 4-bit quants (at most 15) as they are. The file name gives it the AVX2
// flags (engine/CMakeLists.txt).
#include <immintrin.h>

#include <cstring>

#include "engine/sparse/column_sparse.h"

namespace thermocline::column_sparse_internal {
namespace {

// Σ over the four bytes of each int32 lane of w · q: w unsigned 4-bit, or (8-bit) u − 128.
template <bool kInt4>
inline __m256i Dot4(__m256i w, __m256i q) {
  const __m256i ones = _mm256_set1_epi16(1);
  if constexpr (kInt4) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(w, q), ones);
  } else {
    const __m256i s = _mm256_xor_si256(w, _mm256_set1_epi8(static_cast<char>(0x80)));
    return _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(s), _mm256_sign_epi8(q, s)),
                             ones);
  }
}

inline __m256i Load(const uint8_t* p) {
  return _mm256_load_si256(reinterpret_cast<const __m256i*>(p));
}

template <bool kInt4, bool kMin>
void Add(const ColumnWeight& w, const ColumnInput& x, int64_t c0, int64_t c1, float* y) {
  constexpr int64_t kChunk = kInt4 ? kColumnChunk4 : kColumnChunk;
  const uint8_t* values = w.values();
  const size_t row_bytes = w.row_bytes();
  const int32_t* slot_idx = x.slot_idx();
  const int64_t chunks = (c1 - c0 + kChunk - 1) / kChunk;
  const size_t at0 = static_cast<size_t>(c0 / kChunk) * kColumnStepBytes;
  for (int64_t t = 0; t < kAheadSteps; ++t) PrefetchStep(w, x, t, chunks, at0);
  const __m256i low = _mm256_set1_epi8(0x0F);
  const uint8_t* rows[kColumnBlock];
  for (int64_t k = 0; k < x.n_blocks(); ++k) {
    const int32_t s0 = x.begin(k), n = x.begin(k + 1) - s0;
    for (int32_t i = 0; i < n; ++i) rows[i] = values + slot_idx[s0 + i] * row_bytes + at0;
    const int32_t* q4 = reinterpret_cast<const int32_t*>(x.slot_q() + s0);
    const uint16_t* scales = w.scales(x.block(k));
    const uint16_t* mins = w.mins(x.block(k));
    // The 8-bit sums are of u − 128 already; the 4-bit ones start at −offset · Σq.
    const __m256i start = _mm256_set1_epi32(kInt4 ? -w.offset() * x.qsum(k) : 0);
    const __m256 dx = _mm256_set1_ps(x.scale(k));
    const __m256 min_factor = _mm256_set1_ps(x.scale(k) * static_cast<float>(x.qsum(k)));
    // Outputs [o, o + 8) += scale · dx · acc (− min · dx · Σq), within the slice.
    auto store = [&](__m256i acc, int64_t o) {
      if (o >= c1) return;
      const __m256 t = _mm256_mul_ps(_mm256_cvtepi32_ps(acc), dx);
      const __m256 sc =
          _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(scales + o)));
      float part[8] = {};
      float* dst = c1 - o >= 8 ? y + (o - c0) : part;
      if (dst == part) std::memcpy(part, y + (o - c0), sizeof(float) * (c1 - o));
      __m256 v = _mm256_fmadd_ps(sc, t, _mm256_loadu_ps(dst));
      if constexpr (kMin) {
        const __m256 mn =
            _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(mins + o)));
        v = _mm256_fnmadd_ps(mn, min_factor, v);
      }
      _mm256_storeu_ps(dst, v);
      if (dst == part) std::memcpy(y + (o - c0), part, sizeof(float) * (c1 - o));
    };
    for (int64_t c = c0; c < c1; c += kChunk) {
      const size_t at = static_cast<size_t>((c - c0) / kChunk) * kColumnStepBytes;
      PrefetchStep(w, x, k * chunks + (c - c0) / kChunk + kAheadSteps, chunks, at0);
      // The line in 256-bit halves h: vector m's int32 lanes hold outputs c + 16 m + 8 h + [0, 8)
      // (8-bit), or c + 32 m + 8 h + [0, 8) in their low nibbles and the same + 16 in their high
      // ones (4-bit; column_sparse.cc's StoredByte).
      for (int h = 0; h < 2; ++h) {
        if (c + 8 * h >= c1) break;
        __m256i a0 = start, a1 = start, a2 = start, a3 = start;
        __m256i a4 = start, a5 = start, a6 = start, a7 = start;
        for (int32_t g = 0; g < n / 4; ++g) {
          const uint8_t* const* r = rows + 4 * g;
          const size_t a = at + 32 * h;
          const __m256i r0 = Load(r[0] + a), r1 = Load(r[1] + a);
          const __m256i r2 = Load(r[2] + a), r3 = Load(r[3] + a);
          const __m256i lo01 = _mm256_unpacklo_epi8(r0, r1), hi01 = _mm256_unpackhi_epi8(r0, r1);
          const __m256i lo23 = _mm256_unpacklo_epi8(r2, r3), hi23 = _mm256_unpackhi_epi8(r2, r3);
          const __m256i v0 = _mm256_unpacklo_epi16(lo01, lo23);
          const __m256i v1 = _mm256_unpackhi_epi16(lo01, lo23);
          const __m256i v2 = _mm256_unpacklo_epi16(hi01, hi23);
          const __m256i v3 = _mm256_unpackhi_epi16(hi01, hi23);
          const __m256i q = _mm256_set1_epi32(q4[g]);
          if constexpr (kInt4) {
            auto high = [&](__m256i v) { return _mm256_and_si256(_mm256_srli_epi16(v, 4), low); };
            a0 = _mm256_add_epi32(a0, Dot4<true>(_mm256_and_si256(v0, low), q));
            a1 = _mm256_add_epi32(a1, Dot4<true>(high(v0), q));
            a2 = _mm256_add_epi32(a2, Dot4<true>(_mm256_and_si256(v1, low), q));
            a3 = _mm256_add_epi32(a3, Dot4<true>(high(v1), q));
            a4 = _mm256_add_epi32(a4, Dot4<true>(_mm256_and_si256(v2, low), q));
            a5 = _mm256_add_epi32(a5, Dot4<true>(high(v2), q));
            a6 = _mm256_add_epi32(a6, Dot4<true>(_mm256_and_si256(v3, low), q));
            a7 = _mm256_add_epi32(a7, Dot4<true>(high(v3), q));
          } else {
            a0 = _mm256_add_epi32(a0, Dot4<false>(v0, q));
            a1 = _mm256_add_epi32(a1, Dot4<false>(v1, q));
            a2 = _mm256_add_epi32(a2, Dot4<false>(v2, q));
            a3 = _mm256_add_epi32(a3, Dot4<false>(v3, q));
          }
        }
        const int64_t o = c + 8 * h;
        if constexpr (kInt4) {
          store(a0, o), store(a1, o + 16), store(a2, o + 32), store(a3, o + 48);
          store(a4, o + 64), store(a5, o + 80), store(a6, o + 96), store(a7, o + 112);
        } else {
          store(a0, o), store(a1, o + 16), store(a2, o + 32), store(a3, o + 48);
        }
      }
    }
  }
}

}  // namespace

void AddAvx2(const ColumnWeight& w, const ColumnInput& x, int64_t c0, int64_t c1, float* y) {
  ForForm(w, [&]<bool kInt4, bool kMin>() { Add<kInt4, kMin>(w, x, c0, c1, y); });
}

}  // namespace thermocline::column_sparse_internal
