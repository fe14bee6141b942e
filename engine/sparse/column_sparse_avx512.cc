// The integer column-sparse kernel on AVX-512 VNNI. Per block of 32 inputs with kept entries and
// per chunk of 64 outputs: each group of four kept columns' chunks is interleaved bytewise and
// wordwise, so that every int32 lane holds one output's four weights, and vpdpbusd adds their
// products with the group's four int8 activations; the block's sum is then scaled into y. The
// file name gives it the AVX-512 flags (engine/CMakeLists.txt); VNNI by pragma. Called only on
// CPUs with AVX512_VNNI (ColumnSparseAdd checks).
#include <immintrin.h>

#include <cstring>

#include "engine/sparse/column_sparse.h"

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512vnni"))), apply_to = function)
#else
#pragma GCC target("avx512vnni")
#endif

namespace thermocline::column_sparse_internal {
namespace {

// A chunk's 64 values of a row: 64 bytes, or 32 bytes of nibbles (low: stored 0..31, high:
// 32..63) spread over the two halves and masked.
template <bool kInt4>
inline __m512i LoadChunk(const uint8_t* p) {
  if constexpr (kInt4) {
    const __m512i both =
        _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    const __m512i shift = _mm512_inserti64x4(_mm512_setzero_si512(), _mm256_set1_epi16(4), 1);
    return _mm512_and_si512(_mm512_srlv_epi16(both, shift), _mm512_set1_epi8(0x0F));
  } else {
    return _mm512_loadu_si512(p);
  }
}

template <bool kInt4, bool kMin>
void Add(const ColumnWeight& w, const ColumnInput& x, int64_t c0, int64_t c1, float* y) {
  const uint8_t* values = w.values();
  const size_t row_bytes = w.row_bytes();
  const size_t chunk_bytes = kInt4 ? kColumnChunk / 2 : kColumnChunk;
  const int32_t* slot_idx = x.slot_idx();
  const int8_t* slot_q = x.slot_q();
  const int64_t chunks = (c1 - c0 + kColumnChunk - 1) / kColumnChunk;
  for (int64_t t = 0; t < kAheadSteps; ++t) {
    PrefetchStep(w, x, t, chunks, c0 / kColumnChunk, chunk_bytes);
  }
  // A block's rows, at the slice's first chunk (at most 32 kept entries: 8 groups).
  const uint8_t* rows[kColumnBlock];
  for (int64_t k = 0; k < x.n_blocks(); ++k) {
    const uint16_t* scales = w.scales(x.block(k));
    const uint16_t* mins = w.mins(x.block(k));
    const int32_t s0 = x.begin(k), n = x.begin(k + 1) - s0;
    const size_t at0 = static_cast<size_t>(c0 / kColumnChunk) * chunk_bytes;
    for (int32_t i = 0; i < n; ++i) rows[i] = values + slot_idx[s0 + i] * row_bytes + at0;
    const int32_t* q4 = reinterpret_cast<const int32_t*>(slot_q + s0);
    const __m512i offset = _mm512_set1_epi32(w.offset() * x.qsum(k));
    const __m512 dx = _mm512_set1_ps(x.scale(k));
    const __m512 min_factor = _mm512_set1_ps(x.scale(k) * static_cast<float>(x.qsum(k)));
    for (int64_t c = c0; c < c1; c += kColumnChunk) {
      const size_t at = static_cast<size_t>((c - c0) / kColumnChunk) * chunk_bytes;
      PrefetchStep(w, x, k * chunks + (c - c0) / kColumnChunk + kAheadSteps, chunks,
                   c0 / kColumnChunk, chunk_bytes);
      __m512i acc[4] = {_mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512(),
                        _mm512_setzero_si512()};
      for (int32_t g = 0; g < n / 4; ++g) {
        const uint8_t* const* r = rows + 4 * g;
        const __m512i r0 = LoadChunk<kInt4>(r[0] + at), r1 = LoadChunk<kInt4>(r[1] + at);
        const __m512i r2 = LoadChunk<kInt4>(r[2] + at), r3 = LoadChunk<kInt4>(r[3] + at);
        const __m512i lo01 = _mm512_unpacklo_epi8(r0, r1), hi01 = _mm512_unpackhi_epi8(r0, r1);
        const __m512i lo23 = _mm512_unpacklo_epi8(r2, r3), hi23 = _mm512_unpackhi_epi8(r2, r3);
        const __m512i q = _mm512_set1_epi32(q4[g]);
        acc[0] = _mm512_dpbusd_epi32(acc[0], _mm512_unpacklo_epi16(lo01, lo23), q);
        acc[1] = _mm512_dpbusd_epi32(acc[1], _mm512_unpackhi_epi16(lo01, lo23), q);
        acc[2] = _mm512_dpbusd_epi32(acc[2], _mm512_unpacklo_epi16(hi01, hi23), q);
        acc[3] = _mm512_dpbusd_epi32(acc[3], _mm512_unpackhi_epi16(hi01, hi23), q);
      }
      const int64_t left = c1 - c;
      for (int m = 0; m < 4; ++m) {
        const int64_t o = c + 16 * m;
        if (o >= c1) break;
        const __mmask16 mask =
            left >= 16 * (m + 1) ? __mmask16(0xFFFF) : __mmask16((1u << (left - 16 * m)) - 1);
        const __m512 t = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(acc[m], offset)), dx);
        const __m512 sc =
            _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(scales + o)));
        __m512 v = _mm512_maskz_loadu_ps(mask, y + (o - c0));
        v = _mm512_fmadd_ps(sc, t, v);
        if constexpr (kMin) {
          const __m512 mn =
              _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(mins + o)));
          v = _mm512_fnmadd_ps(mn, min_factor, v);
        }
        _mm512_mask_storeu_ps(y + (o - c0), mask, v);
      }
    }
  }
}

}  // namespace

void AddVnni(const ColumnWeight& w, const ColumnInput& x, int64_t c0, int64_t c1, float* y) {
  ForForm(w, [&]<bool kInt4, bool kMin>() { Add<kInt4, kMin>(w, x, c0, c1, y); });
}

}  // namespace thermocline::column_sparse_internal

#if defined(__clang__)
#pragma clang attribute pop
#endif
