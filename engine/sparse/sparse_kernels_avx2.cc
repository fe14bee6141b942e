// The AVX2 axpy kernels: sparse_kernels_simd.inc over engine/ops/vec_avx2.h. Built with the AVX2
// flags (engine/CMakeLists.txt, by file name); called only on CPUs that have them.
#include <cstdint>
#include <cstring>

#include "engine/ops/vec_avx2.h"
#include "engine/sparse/sparse_kernels.h"

namespace thermocline {
namespace simd = vec_avx2;
}  // namespace thermocline

namespace thermocline::sparse_internal {
namespace {
// out[0..1] = elements 0..15 (low nibbles), out[2..3] = 16..31 (high nibbles), each q - 8.
inline void Q4Signed(const BlockQ4_0* b, __m256 out[4]) {
  const __m128i q = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b->qs));
  const __m256i lo = _mm256_cvtepu8_epi32(q);                     // bytes 0..7
  const __m256i hi = _mm256_cvtepu8_epi32(_mm_srli_si128(q, 8));  // bytes 8..15
  const __m256i mask = _mm256_set1_epi32(15), eight = _mm256_set1_epi32(8);
  out[0] = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_and_si256(lo, mask), eight));
  out[1] = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_and_si256(hi, mask), eight));
  out[2] = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_srli_epi32(lo, 4), eight));
  out[3] = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_srli_epi32(hi, 4), eight));
}
}  // namespace
}  // namespace thermocline::sparse_internal

#define THERMOCLINE_AXPY_TABLE Avx2AxpyKernels
#include "engine/sparse/sparse_kernels_simd.inc"
