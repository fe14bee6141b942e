// The weight-type table: one row per type Thermocline computes with, read by every path (dense
// CPU decode and prefill, the sparse operators, the down_t layout, the CUDA backend, quantize)
// so that adding a type means adding a row and its kernels. Sizes and names of every ggml type,
// computable or not, are ggml_types.h's.
#pragma once

#include <cstdint>

#include "absl/types/span.h"
#include "engine/ops/device_kernel.h"
#include "engine/ops/ggml_types.h"
#include "engine/ops/kernels.h"

namespace thermocline {

namespace ops_internal {
struct IsaTypeKernels;  // kernels_internal.h
}  // namespace ops_internal

// What the dot kernels of a weight type read as activations: floats, Q8_0 blocks (int8 with a
// scale per 32, in the SIMD kernels' panel layout), Q8_1 blocks (Q8_0's plus the half-rounded
// d * sum(qs) that a min multiplies, for Q4_1 and Q5_1, as ggml's) or Q8_K blocks (a scale per
// 256 and sums of 16, for the super-block types).
enum class ActivationFormat { kF32, kQ8_0, kQ8_1, kQ8_K };
const char* ActivationFormatName(ActivationFormat f);

inline constexpr int kIsaCount = 4;  // Isa's values, kScalar .. kAvx512Vnni

struct WeightTypeRow {
  GgmlType type;
  // A weight type files may hold; false for Q8_K and Q8_1, which only ever hold activations.
  bool weight;
  ActivationFormat activations;
  // The type TransposeWeight gives down_t (the sparse FFN's transposed down) when down has this
  // type: one with axpy kernels (can_be_down_t), chosen for quality (docs/types.md).
  GgmlType down_t;
  bool sparse;          // the row-sparse gate/up operators take rows of this type
  DeviceKernel device;  // the CUDA kernels; kNone: none
  // The kernels of each ISA (index Isa), nullptr where that ISA or this CPU has none.
  const ops_internal::IsaTypeKernels* isa[kIsaCount];

  const GgmlTypeInfo& info() const { return TypeInfo(type); }
  bool can_be_down_t() const;  // has axpy kernels
};

// The row of `type`; nullptr for a type without kernels.
const WeightTypeRow* FindTypeRow(GgmlType type);
// The row of a weight type (FindTypeRow's, less activation-only types); nullptr otherwise.
const WeightTypeRow* FindWeightType(GgmlType type);
// Every row, in the table's order.
absl::Span<const WeightTypeRow> TypeRows();
// The computable weight types as a list for messages: "f32, f16, bf16, q8_0, ...".
const char* WeightTypeNames();

}  // namespace thermocline
