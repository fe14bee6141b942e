// Shared by the kernel parity tests: the weight types with kernels and how far a SIMD dot of a
// quantized type may be from the scalar reference.
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "engine/ops/kernels.h"
#include "engine/ops/type_table.h"

namespace thermocline::testing {

// Every weight type of the table (Q8_K, activations only, left out).
inline std::vector<GgmlType> WeightTypes() {
  std::vector<GgmlType> types;
  for (const WeightTypeRow& row : TypeRows()) {
    if (row.weight) types.push_back(row.type);
  }
  return types;
}

inline bool IsQuantized(GgmlType type) { return TypeInfo(type).block_size > 1; }

// Bound on |SIMD dot - scalar reference dot| of weight row w (n elements of `type`) with
// activations x (its vec_dot_type), for the quantized types. The int8 kernels make weights
// unsigned (w = s (u - offset), offset up to 128, or w = s u - m with a min) and add the
// offset's or min's share in float, so a partial sum is rounded at a magnitude bounded by
// Σ (|w_i| + |s offset| + |m|) |x_i|, and |s offset|, |m| are at most about twice the block's
// largest |w| (the quantizers put an extreme weight at the end of the range; 4x for margin).
// Roundings: a few per 16 elements (the super-block kernels scale each 16) plus the final sums.
inline double QuantDotTolerance(GgmlType type, int64_t n, const void* w, const void* x) {
  constexpr double kEps = std::numeric_limits<float>::epsilon();
  const TypeKernels& ref = *KernelsFor(type, Isa::kScalar);
  std::vector<float> wf(static_cast<size_t>(n)), xf(static_cast<size_t>(n));
  ref.to_float(w, wf.data(), n);
  KernelsFor(ref.vec_dot_type, Isa::kScalar)->to_float(x, xf.data(), n);
  const int64_t block = TypeInfo(type).block_size;
  double magnitude = 0.0;
  for (int64_t b = 0; b < n / block; ++b) {
    double a = 0.0;
    for (int64_t i = b * block; i < (b + 1) * block; ++i) a = std::max(a, std::fabs(double{wf[i]}));
    for (int64_t i = b * block; i < (b + 1) * block; ++i) {
      magnitude += (std::fabs(wf[i]) + 4 * a) * std::fabs(xf[i]);
    }
  }
  return (static_cast<double>(n) / 16 + 32) * 2 * kEps * magnitude + 1e-30;
}

}  // namespace thermocline::testing
