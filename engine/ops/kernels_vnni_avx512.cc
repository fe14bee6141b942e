// The AVX-512 kernels with VNNI int8 dot products (vpdpbusd): kernels_simd.inc over
// vec_avx512.h once more. The file name gives it the AVX-512 flags (engine/CMakeLists.txt);
// VNNI is enabled here by pragma so the build needs no extra flag. Called only on CPUs that
// have AVX512_VNNI (kernels.cc checks).
#include <immintrin.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "engine/ops/kernels_internal.h"
#include "engine/ops/quants_ref.h"

// After the shared headers, so that only this file's own functions get the VNNI target.
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512vnni"))), apply_to = function)
#else
#pragma GCC target("avx512vnni")
#endif

#define THERMOCLINE_VNNI 1
#include "engine/ops/vec_avx512.h"

namespace thermocline {
namespace simd = vec_avx512_vnni;
}  // namespace thermocline

#define THERMOCLINE_SIMD_TABLE Avx512VnniKernels
#include "engine/ops/kernels_simd.inc"

#if defined(__clang__)
#pragma clang attribute pop
#endif
