// Internal to engine/sparse: the per-ISA axpy kernels of the down projection over down_t rows,
// acc += Σ_r a[r] · dequantized row r. A scalar reference (sparse_kernels.cc) and SIMD versions
// written once (sparse_kernels_simd.inc) and compiled per ISA (sparse_kernels_avx2.cc,
// sparse_kernels_avx512.cc); chosen like engine/ops' kernels.
#pragma once

#include <cstdint>

#include "engine/ops/ggml_types.h"
#include "engine/ops/kernels.h"

namespace thermocline::sparse_internal {

constexpr int kMaxAxpyRows = 8;  // rows one axpy call folds into acc (one load/store of acc)

// acc[0..n) += Σ_{r<k} a[r] · rows[r][0..n), k <= kMaxAxpyRows, rows of one weight type;
// n a multiple of the type's block size.
using AxpyFn = void (*)(int64_t n, int k, const float* a, const uint8_t* const* rows, float* acc);

struct AxpyKernels {
  AxpyFn f32, f16, bf16, q8_0, q4_0;
};

const AxpyKernels& ScalarAxpyKernels();  // sparse_kernels.cc
const AxpyKernels& Avx2AxpyKernels();    // sparse_kernels_avx2.cc
const AxpyKernels& Avx512AxpyKernels();  // sparse_kernels_avx512.cc

// The axpy kernel of `type` for `isa` (the AVX-512 one for kAvx512Vnni); nullptr when the type
// has none or the CPU lacks the ISA.
AxpyFn AxpyFor(GgmlType type, Isa isa);

}  // namespace thermocline::sparse_internal
