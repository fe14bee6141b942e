// The integer column-sparse kernel on AVX-512 VNNI. Per block of 32 inputs with kept entries and
// per step (a line of each kept row: 64 outputs of the 8-bit form, 128 of the 4-bit one): each
// group of four kept rows' lines is interleaved bytewise and wordwise, so that every int32 lane
// holds one output's four weights (4-bit: two outputs', one per nibble, masked apart), and
// vpdpbusd adds their products with the group's four int8 activations; the block's sums are then
// scaled into y. The file name gives it the AVX-512 flags (engine/CMakeLists.txt); VNNI by
// pragma. Called only on CPUs with AVX512_VNNI (ColumnSparseAdd checks).

// GCC 12 takes the self-initialized _mm512_undefined_ps() inside cvtdq2ps and cvtph2ps for an
// uninitialized use once they are inlined into the kernel's epilogue; the diagnostic is placed at
// the header's line, so it is silenced there.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include "engine/sparse/column_sparse.h"

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512vnni"))), apply_to = function)
#else
#pragma GCC target("avx512vnni")
#endif

namespace thermocline::column_sparse_internal {
namespace {

inline __m512i Load(const uint8_t* p) { return _mm512_load_si512(p); }

// Where a block's sums go: y over the slice [c0, c1), with the block's scales and mins.
struct BlockOut {
  int64_t c0, c1;
  const uint16_t* scales;
  const uint16_t* mins;
  __m512 min_factor;
  float* y;
};

// Outputs [o, o + 16) += scale · d · acc (− min · dx · Σq), masked to the slice.
template <bool kMin>
inline void Store(const BlockOut& b, __m512i acc, __m512 d, int64_t o) {
  if (o >= b.c1) return;
  const __mmask16 mask = b.c1 - o >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (b.c1 - o)) - 1);
  const __m512 t = _mm512_mul_ps(_mm512_cvtepi32_ps(acc), d);
  const __m512 sc =
      _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.scales + o)));
  float* y = b.y + (o - b.c0);
  __m512 v = _mm512_fmadd_ps(sc, t, _mm512_maskz_loadu_ps(mask, y));
  if constexpr (kMin) {
    const __m512 mn =
        _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.mins + o)));
    v = _mm512_fnmadd_ps(mn, b.min_factor, v);
  }
  _mm512_mask_storeu_ps(y, mask, v);
}

template <bool kInt4, bool kMin>
void Add(const ColumnWeight& w, const ColumnInput& x, int64_t c0, int64_t c1, float* y) {
  constexpr int64_t kChunk = kInt4 ? kColumnChunk4 : kColumnChunk;
  const uint8_t* values = w.values();
  const size_t row_bytes = w.row_bytes();
  const int32_t* slot_idx = x.slot_idx();
  const int8_t* slot_q = x.slot_q();
  const int64_t chunks = (c1 - c0 + kChunk - 1) / kChunk;
  const size_t at0 = static_cast<size_t>(c0 / kChunk) * kColumnStepBytes;
  for (int64_t t = 0; t < kAheadSteps; ++t) PrefetchStep(w, x, t, chunks, at0);
  const __m512i low = _mm512_set1_epi8(0x0F), high = _mm512_set1_epi8(static_cast<char>(0xF0));
  // A block's rows, at the slice's first line (at most 32 kept entries: 8 groups).
  const uint8_t* rows[kColumnBlock];
  for (int64_t k = 0; k < x.n_blocks(); ++k) {
    const uint16_t* scales = w.scales(x.block(k));
    const uint16_t* mins = w.mins(x.block(k));
    const int32_t s0 = x.begin(k), n = x.begin(k + 1) - s0;
    for (int32_t i = 0; i < n; ++i) rows[i] = values + slot_idx[s0 + i] * row_bytes + at0;
    const int32_t* q4 = reinterpret_cast<const int32_t*>(slot_q + s0);
    // The sums start at −offset · Σq, so that they end as Σ (u − offset) · q. 4-bit: the high
    // nibbles are summed as 16 u (masked in place), their sums scaled by 1/16 (exact).
    const __m512i start = _mm512_set1_epi32(-w.offset() * x.qsum(k));
    const __m512i start16 = _mm512_set1_epi32(-16 * w.offset() * x.qsum(k));
    const __m512 dx = _mm512_set1_ps(x.scale(k));
    const __m512 dx16 = _mm512_set1_ps(x.scale(k) / 16.0f);
    const __m512 min_factor = _mm512_set1_ps(x.scale(k) * static_cast<float>(x.qsum(k)));
    const BlockOut out{c0, c1, scales, mins, min_factor, y};
    for (int64_t c = c0; c < c1; c += kChunk) {
      const size_t at = static_cast<size_t>((c - c0) / kChunk) * kColumnStepBytes;
      PrefetchStep(w, x, k * chunks + (c - c0) / kChunk + kAheadSteps, chunks, at0);
      // Separate variables, not an array: GCC keeps them in registers.
      __m512i a0 = start, a1 = kInt4 ? start16 : start, a2 = start, a3 = a1;
      __m512i a4 = start, a5 = start16, a6 = start, a7 = start16;
      for (int32_t g = 0; g < n / 4; ++g) {
        const uint8_t* const* r = rows + 4 * g;
        const __m512i r0 = Load(r[0] + at), r1 = Load(r[1] + at);
        const __m512i r2 = Load(r[2] + at), r3 = Load(r[3] + at);
        const __m512i lo01 = _mm512_unpacklo_epi8(r0, r1), hi01 = _mm512_unpackhi_epi8(r0, r1);
        const __m512i lo23 = _mm512_unpacklo_epi8(r2, r3), hi23 = _mm512_unpackhi_epi8(r2, r3);
        const __m512i v0 = _mm512_unpacklo_epi16(lo01, lo23);
        const __m512i v1 = _mm512_unpackhi_epi16(lo01, lo23);
        const __m512i v2 = _mm512_unpacklo_epi16(hi01, hi23);
        const __m512i v3 = _mm512_unpackhi_epi16(hi01, hi23);
        const __m512i q = _mm512_set1_epi32(q4[g]);
        if constexpr (kInt4) {
          a0 = _mm512_dpbusd_epi32(a0, _mm512_and_si512(v0, low), q);
          a1 = _mm512_dpbusd_epi32(a1, _mm512_and_si512(v0, high), q);
          a2 = _mm512_dpbusd_epi32(a2, _mm512_and_si512(v1, low), q);
          a3 = _mm512_dpbusd_epi32(a3, _mm512_and_si512(v1, high), q);
          a4 = _mm512_dpbusd_epi32(a4, _mm512_and_si512(v2, low), q);
          a5 = _mm512_dpbusd_epi32(a5, _mm512_and_si512(v2, high), q);
          a6 = _mm512_dpbusd_epi32(a6, _mm512_and_si512(v3, low), q);
          a7 = _mm512_dpbusd_epi32(a7, _mm512_and_si512(v3, high), q);
        } else {
          a0 = _mm512_dpbusd_epi32(a0, v0, q);
          a1 = _mm512_dpbusd_epi32(a1, v1, q);
          a2 = _mm512_dpbusd_epi32(a2, v2, q);
          a3 = _mm512_dpbusd_epi32(a3, v3, q);
        }
      }
      if constexpr (kInt4) {
        // Vector m's low nibbles: outputs c + 32 m + [0, 16); its high ones the next 16.
        Store<kMin>(out, a0, dx, c), Store<kMin>(out, a1, dx16, c + 16);
        Store<kMin>(out, a2, dx, c + 32), Store<kMin>(out, a3, dx16, c + 48);
        Store<kMin>(out, a4, dx, c + 64), Store<kMin>(out, a5, dx16, c + 80);
        Store<kMin>(out, a6, dx, c + 96), Store<kMin>(out, a7, dx16, c + 112);
      } else {
        Store<kMin>(out, a0, dx, c), Store<kMin>(out, a1, dx, c + 16);
        Store<kMin>(out, a2, dx, c + 32), Store<kMin>(out, a3, dx, c + 48);
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
