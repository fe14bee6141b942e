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

// Outputs [32 h, 32 h + 32) of a chunk as stored: 32 bytes, or the low (h = 0) or high (h = 1)
// nibbles of the chunk's 32 bytes.
template <bool kInt4>
inline __m256i LoadHalf(const uint8_t* chunk, int h) {
  if constexpr (kInt4) {
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(chunk));
    const __m256i low = _mm256_set1_epi8(0x0F);
    return h == 0 ? _mm256_and_si256(b, low) : _mm256_and_si256(_mm256_srli_epi16(b, 4), low);
  } else {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(chunk + 32 * h));
  }
}

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

template <bool kInt4, bool kMin>
void Add(const ColumnWeight& w, const ColumnInput& x, int64_t c0, int64_t c1, float* y) {
  const uint8_t* values = w.values();
  const size_t row_bytes = w.row_bytes();
  const size_t chunk_bytes = kInt4 ? kColumnChunk / 2 : kColumnChunk;
  const int32_t* slot_idx = x.slot_idx();
  // The 8-bit sums are of u − 128 already; the 4-bit ones need the offset taken off.
  const int32_t offset = kInt4 ? w.offset() : 0;
  const int64_t chunks = (c1 - c0 + kColumnChunk - 1) / kColumnChunk;
  for (int64_t t = 0; t < kAheadSteps; ++t) {
    PrefetchStep(w, x, t, chunks, c0 / kColumnChunk, chunk_bytes);
  }
  const uint8_t* rows[kColumnBlock];
  const size_t at0 = static_cast<size_t>(c0 / kColumnChunk) * chunk_bytes;
  for (int64_t k = 0; k < x.n_blocks(); ++k) {
    const int32_t s0 = x.begin(k), n = x.begin(k + 1) - s0;
    for (int32_t i = 0; i < n; ++i) rows[i] = values + slot_idx[s0 + i] * row_bytes + at0;
    const int32_t* q4 = reinterpret_cast<const int32_t*>(x.slot_q() + s0);
    const uint16_t* scales = w.scales(x.block(k));
    const uint16_t* mins = w.mins(x.block(k));
    const __m256i off = _mm256_set1_epi32(offset * x.qsum(k));
    const __m256 dx = _mm256_set1_ps(x.scale(k));
    const __m256 min_factor = _mm256_set1_ps(x.scale(k) * static_cast<float>(x.qsum(k)));
    for (int64_t c = c0; c < c1; c += kColumnChunk) {
      const size_t at = static_cast<size_t>((c - c0) / kColumnChunk) * chunk_bytes;
      PrefetchStep(w, x, k * chunks + (c - c0) / kColumnChunk + kAheadSteps, chunks,
                   c0 / kColumnChunk, chunk_bytes);
      for (int h = 0; h < 2; ++h) {
        // Half h of accumulator m: outputs c + 16 m + 8 h + [0, 8) (column_sparse.cc's
        // StoredPos, within 128-bit lanes).
        if (c + 8 * h >= c1) break;
        __m256i acc[4] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(),
                          _mm256_setzero_si256()};
        for (int32_t g = 0; g < n / 4; ++g) {
          const uint8_t* const* r = rows + 4 * g;
          const __m256i r0 = LoadHalf<kInt4>(r[0] + at, h), r1 = LoadHalf<kInt4>(r[1] + at, h);
          const __m256i r2 = LoadHalf<kInt4>(r[2] + at, h), r3 = LoadHalf<kInt4>(r[3] + at, h);
          const __m256i lo01 = _mm256_unpacklo_epi8(r0, r1), hi01 = _mm256_unpackhi_epi8(r0, r1);
          const __m256i lo23 = _mm256_unpacklo_epi8(r2, r3), hi23 = _mm256_unpackhi_epi8(r2, r3);
          const __m256i q = _mm256_set1_epi32(q4[g]);
          acc[0] = _mm256_add_epi32(acc[0], Dot4<kInt4>(_mm256_unpacklo_epi16(lo01, lo23), q));
          acc[1] = _mm256_add_epi32(acc[1], Dot4<kInt4>(_mm256_unpackhi_epi16(lo01, lo23), q));
          acc[2] = _mm256_add_epi32(acc[2], Dot4<kInt4>(_mm256_unpacklo_epi16(hi01, hi23), q));
          acc[3] = _mm256_add_epi32(acc[3], Dot4<kInt4>(_mm256_unpackhi_epi16(hi01, hi23), q));
        }
        for (int m = 0; m < 4; ++m) {
          const int64_t o = c + 16 * m + 8 * h;
          if (o >= c1) continue;
          const __m256 t = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(acc[m], off)), dx);
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
