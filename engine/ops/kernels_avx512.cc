// The AVX-512 kernels: kernels_simd.inc over vec_avx512.h. Built with -mavx512f -mavx512bw
// -mavx512vl -mavx512dq on top of the AVX2 flags (engine/CMakeLists.txt); called only on CPUs
// that have them (kernels.cc checks).
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "engine/ops/kernels_internal.h"
#include "engine/ops/quants_ref.h"
#include "engine/ops/vec_avx512.h"

namespace thermocline {
namespace simd = vec_avx512;
}  // namespace thermocline

#define THERMOCLINE_SIMD_TABLE Avx512Kernels
#include "engine/ops/kernels_simd.inc"
