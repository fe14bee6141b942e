// Helpers of the CUDA parity tests (cuda_ops_test.cc, cuda_executor_test.cc): random weights,
// the CPU reference mat-vec with its error bounds, and the skip of [cuda] cases without a device.
//
// Tolerances are worst-case float-summation bounds, written next to each comparison: the CPU
// reference (engine/ops/kernels_scalar.cc) accumulates in double, the GPU in float, so the GPU
// error of a sum of k terms done as s sequential additions is at most (s + 2) · ε32 · Σ|term|
// (two more roundings for the product and the scale). The activations of quantized weights are
// quantized to Q8_0 on both sides with the same formula, so that step adds no difference.
#pragma once

#include <cmath>
#include <limits>
#include <memory>
#include <random>
#include <vector>

#include "bench/gpu_ops.h"
#include "engine/ops/kernels.h"
#include "engine/sparse/sparse_ops.h"
#include "test_util.h"

namespace thermocline::cuda_test {

constexpr double kEps32 = std::numeric_limits<float>::epsilon();
constexpr double kEps16 = 1.0 / 1024;  // F16 machine epsilon
inline constexpr GgmlType kTypes[] = {GgmlType::kF32, GgmlType::kF16, GgmlType::kBF16,
                                      GgmlType::kQ8_0, GgmlType::kQ4_0};

#define REQUIRE_OK(expr)            \
  do {                              \
    const absl::Status s_ = (expr); \
    INFO(s_.ToString());            \
    REQUIRE(s_.ok());               \
  } while (0)

// The device's ops, or nullptr after printing SKIPPED (no device).
inline std::unique_ptr<gpu::GpuOps> OpsOrNull() {
  absl::StatusOr<std::unique_ptr<gpu::GpuOps>> ops = gpu::GpuOps::Create();
  if (!ops.ok()) return nullptr;
  return *std::move(ops);
}
#define REQUIRE_GPU_OPS(ops)                                                   \
  std::unique_ptr<gpu::GpuOps> ops = ::thermocline::cuda_test::OpsOrNull();    \
  if (ops == nullptr) THERMOCLINE_SKIP("no CUDA device: [cuda] case skipped"); \
  (void)0

inline std::vector<float> RandomFloats(int64_t n, uint32_t seed, float lo = -1.0f,
                                       float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& f : v) f = dist(rng);
  return v;
}

inline OwnedWeight RandomWeight(GgmlType type, int64_t rows, int64_t cols, uint32_t seed) {
  const std::vector<float> v = RandomFloats(rows * cols, seed);
  OwnedWeight w = OwnedWeight::Allocate(type, rows, cols);
  for (int64_t r = 0; r < rows; ++r) {
    KernelsFor(type, Isa::kScalar)
        ->from_float(v.data() + r * cols, w.data.data() + r * w.view.row_bytes, cols);
  }
  return w;
}

inline std::vector<float> DequantRow(const WeightView& w, int64_t r) {
  std::vector<float> out(w.cols);
  KernelsFor(w.type, Isa::kScalar)->to_float(w.row(r), out.data(), w.cols);
  return out;
}

// The CPU's decode mat-vec semantics (scalar kernels): x converted to the type's vec_dot_type,
// then vec_dot per row. Also the x the dot really sees (dequantized Q8_0 for quantized types),
// from which the magnitudes Σ|w x| of the bounds are computed.
struct CpuMatVec {
  std::vector<float> y, x_seen, magnitude;
};
inline CpuMatVec ReferenceMatVec(const WeightView& w, const std::vector<float>& x) {
  const TypeKernels& k = *KernelsFor(w.type, Isa::kScalar);
  CpuMatVec r;
  std::vector<uint8_t> conv(RowBytes(k.vec_dot_type, w.cols));
  KernelsFor(k.vec_dot_type, Isa::kScalar)->from_float(x.data(), conv.data(), w.cols);
  r.x_seen.resize(w.cols);
  KernelsFor(k.vec_dot_type, Isa::kScalar)->to_float(conv.data(), r.x_seen.data(), w.cols);
  for (int64_t i = 0; i < w.rows; ++i) {
    r.y.push_back(k.vec_dot(w.cols, w.row(i), conv.data()));
    const std::vector<float> row = DequantRow(w, i);
    double m = 0;
    for (int64_t c = 0; c < w.cols; ++c) m += std::fabs(double{row[c]} * r.x_seen[c]);
    r.magnitude.push_back(m);
  }
  return r;
}

// A GPU dot of n elements: each lane adds at most n/32 + 1 (block) terms in sequence, then five
// shuffle levels; +2 roundings per term (product, scale). See the file comment.
inline double DotBound(int64_t n, double magnitude) {
  return (n / 32.0 + 1 + 5 + 2) * kEps32 * magnitude + 1e-30;
}

}  // namespace thermocline::cuda_test
