// Helpers of the CUDA parity tests (cuda_ops_test.cc, cuda_executor_test.cc): random weights,
// the CPU reference mat-vec with its error bounds, and the skip of [cuda] cases without a device.
//
// Tolerances are worst-case float-summation bounds, written next to each comparison: the CPU
// reference (engine/ops/kernels_scalar.cc) accumulates in double, the GPU in float, so the GPU
// error of a sum of k terms done as s sequential additions is at most (s + 2) · ε32 · Σ|term|
// (two more roundings for the product and the scale). The activations of Q8_0 and Q4_0 weights
// are quantized to Q8_0 on both sides with the same formula, so that step adds no difference;
// the other quantized types are dotted with F32 activations on the device (device_kernel.h), and
// their reference is the dequantized row times x in double.
#pragma once

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <random>
#include <vector>

#include "bench/gpu_ops.h"
#include "engine/ops/kernels.h"
#include "engine/ops/type_table.h"
#include "engine/sparse/sparse_ops.h"
#include "test_util.h"

namespace thermocline::cuda_test {

constexpr double kEps32 = std::numeric_limits<float>::epsilon();
constexpr double kEps16 = 1.0 / 1024;  // F16 machine epsilon
// Every type with CUDA kernels.
inline std::vector<GgmlType> DeviceTypes() {
  std::vector<GgmlType> types;
  for (const WeightTypeRow& row : TypeRows()) {
    if (row.weight && row.device != DeviceKernel::kNone) types.push_back(row.type);
  }
  return types;
}
inline const std::vector<GgmlType> kTypes = DeviceTypes();

// `small` rounded up to whole blocks of `type`: a row length every type accepts.
inline int64_t ColsFor(GgmlType type, int64_t small) {
  const int64_t b = TypeInfo(type).block_size;
  return (small + b - 1) / b * b;
}

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

// The device's decode mat-vec semantics on the CPU: for Q8_0 and Q4_0 the scalar kernels (x
// converted to Q8_0, vec_dot per row), for the others the dequantized row times x in double.
// Also the x the dot really sees and the magnitudes the bounds scale: Σ|w x|, and for the
// dequantizing kernels (dequant.cuh) twice Σ (|w| + 2 A) |x|, A the block's largest |w|: their
// lanes round a group's dot of q x and its sum of x, whose terms reach the group's scale times q
// and its bias (a min, at most about A) times x, and round twice per element (DotBound counts
// one per 32).
struct CpuMatVec {
  std::vector<float> y, x_seen, magnitude;
};
inline CpuMatVec ReferenceMatVec(const WeightView& w, const std::vector<float>& x) {
  const TypeKernels& k = *KernelsFor(w.type, Isa::kScalar);
  const bool q8 = DeviceUsesQ8Activations(FindWeightType(w.type)->device);
  const bool dequantizing = !q8 && TypeInfo(w.type).block_size > 1;
  CpuMatVec r;
  std::vector<uint8_t> conv;
  if (q8 || k.vec_dot_type == GgmlType::kF32) {
    conv.resize(RowBytes(k.vec_dot_type, w.cols));
    KernelsFor(k.vec_dot_type, Isa::kScalar)->from_float(x.data(), conv.data(), w.cols);
    r.x_seen.resize(w.cols);
    KernelsFor(k.vec_dot_type, Isa::kScalar)->to_float(conv.data(), r.x_seen.data(), w.cols);
  } else {
    r.x_seen = x;
  }
  const int64_t block = TypeInfo(w.type).block_size;
  for (int64_t i = 0; i < w.rows; ++i) {
    const std::vector<float> row = DequantRow(w, i);
    if (dequantizing) {
      double y = 0, m = 0;
      for (int64_t b = 0; b < w.cols; b += block) {
        double a = 0;
        for (int64_t c = b; c < b + block; ++c) a = std::max(a, std::fabs(double{row[c]}));
        for (int64_t c = b; c < b + block; ++c) {
          y += double{row[c]} * x[c];
          m += (std::fabs(double{row[c]}) + 2 * a) * std::fabs(double{x[c]});
        }
      }
      r.y.push_back(static_cast<float>(y));
      r.magnitude.push_back(2 * m);
      continue;
    }
    r.y.push_back(k.vec_dot(w.cols, w.row(i), conv.data()));
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
