// The AVX-512 axpy kernels: sparse_kernels_simd.inc over engine/ops/vec_avx512.h. Built with
// the AVX-512 flags (engine/CMakeLists.txt, by file name); called only on CPUs that have them.
#include <cstdint>
#include <cstring>

#include "engine/ops/vec_avx512.h"
#include "engine/sparse/sparse_kernels.h"

namespace thermocline {
namespace simd = vec_avx512;
}  // namespace thermocline

namespace thermocline::sparse_internal {
namespace {
// out[0] = elements 0..15 (low nibbles), out[1] = 16..31 (high nibbles), each q - 8: a nibble
// in the low bits of a 32-bit lane indexes a table of the 16 values (vpermps reads 4 bits).
inline void Q4Signed(const BlockQ4_0* b, __m512 out[2]) {
  const __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b->qs)));
  const __m512 values = _mm512_setr_ps(-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7);
  out[0] = _mm512_permutexvar_ps(v, values);
  out[1] = _mm512_permutexvar_ps(_mm512_srli_epi32(v, 4), values);
}
}  // namespace
}  // namespace thermocline::sparse_internal

#define THERMOCLINE_AXPY_TABLE Avx512AxpyKernels
#include "engine/sparse/sparse_kernels_simd.inc"
