// The scalar axpy reference kernels (plain C++, the yardstick of the SIMD versions in
// tests/unit/sparse_ops_test.cc) and the dispatch by type and ISA.
#include "engine/sparse/sparse_kernels.h"

#include <algorithm>
#include <cstring>

namespace thermocline::sparse_internal {
namespace {

float F32At(const uint8_t* row, int64_t i) {
  float v;
  std::memcpy(&v, row + 4 * i, 4);
  return v;
}
float F16At(const uint8_t* row, int64_t i) {
  uint16_t h;
  std::memcpy(&h, row + 2 * i, 2);
  return HalfToFloat(h);
}
float Bf16At(const uint8_t* row, int64_t i) {
  uint16_t h;
  std::memcpy(&h, row + 2 * i, 2);
  return Bf16ToFloat(h);
}
float Q8_0At(const uint8_t* row, int64_t i) {
  const BlockQ8_0& b = reinterpret_cast<const BlockQ8_0*>(row)[i / kQK8_0];
  return HalfToFloat(b.d) * b.qs[i % kQK8_0];
}
float Q4_0At(const uint8_t* row, int64_t i) {
  const BlockQ4_0& b = reinterpret_cast<const BlockQ4_0*>(row)[i / kQK4_0];
  const int j = static_cast<int>(i % kQK4_0);
  const int q = j < kQK4_0 / 2 ? (b.qs[j] & 0x0F) : (b.qs[j - kQK4_0 / 2] >> 4);
  return HalfToFloat(b.d) * static_cast<float>(q - 8);
}

template <float (*At)(const uint8_t*, int64_t)>
void ScalarAxpy(int64_t n, int k, const float* a, const uint8_t* const* rows, float* acc) {
  for (int64_t i = 0; i < n; ++i) {
    float s = acc[i];
    for (int r = 0; r < k; ++r) s += a[r] * At(rows[r], i);
    acc[i] = s;
  }
}

}  // namespace

const AxpyKernels& ScalarAxpyKernels() {
  static constexpr AxpyKernels kKernels = {ScalarAxpy<F32At>, ScalarAxpy<F16At>, ScalarAxpy<Bf16At>,
                                           ScalarAxpy<Q8_0At>, ScalarAxpy<Q4_0At>};
  return kKernels;
}

AxpyFn AxpyFor(GgmlType type, Isa isa) {
  const std::vector<Isa>& isas = AvailableIsas();
  if (std::find(isas.begin(), isas.end(), isa) == isas.end()) return nullptr;
  const AxpyKernels& t = isa == Isa::kScalar ? ScalarAxpyKernels()
                         : isa == Isa::kAvx2 ? Avx2AxpyKernels()
                                             : Avx512AxpyKernels();
  switch (type) {
    case GgmlType::kF32:
      return t.f32;
    case GgmlType::kF16:
      return t.f16;
    case GgmlType::kBF16:
      return t.bf16;
    case GgmlType::kQ8_0:
      return t.q8_0;
    case GgmlType::kQ4_0:
      return t.q4_0;
    default:
      return nullptr;
  }
}

}  // namespace thermocline::sparse_internal
