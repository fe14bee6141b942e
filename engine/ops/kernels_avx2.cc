// The AVX2 kernels: kernels_simd.inc over vec_avx2.h. Built with -mavx2 -mfma -mf16c -mbmi2
// (engine/CMakeLists.txt); called only on CPUs that have them (kernels.cc checks).
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "engine/ops/kernels_internal.h"
#include "engine/ops/quants_ref.h"
#include "engine/ops/vec_avx2.h"

namespace thermocline {
namespace simd = vec_avx2;
}  // namespace thermocline

#define THERMOCLINE_SIMD_TABLE Avx2Kernels
#include "engine/ops/kernels_simd.inc"
