// RowDot: the panel kernels of kernels_internal.h for quantized types on SIMD ISAs (Q8_0 panels
// or Q8_K blocks, as the type table says), else the type's vec_dot over activations converted to
// its vec_dot_type.
#include "engine/ops/row_dot.h"

#include <algorithm>
#include <cstring>

#include "engine/ops/kernels_internal.h"
#include "engine/ops/type_table.h"

namespace thermocline {

RowDot::RowDot(GgmlType type, Isa isa) : kernels_(KernelsFor(type, isa)), isa_(isa) {
  if (kernels_ == nullptr) return;
  if (const ops_internal::QuantDot* q = ops_internal::QuantDotFor(type, isa); q != nullptr) {
    panel_dot_ = q->dot;
    dot_rows_ = q->dot_rows;
    static_assert(kMaxRows <= ops_internal::kMaxDotRows);
    quantize_panel_ = q->quantize_panel;
    panel_offset_ = q->offset;
  }
}

size_t RowDot::PreparedBytes(GgmlType type, int64_t n) {
  const WeightTypeRow* row = FindWeightType(type);
  if (row == nullptr) return 0;
  size_t bytes = RowBytes(KernelsFor(type, Isa::kScalar)->vec_dot_type, n);
  if (row->activations == ActivationFormat::kQ8_0 || row->activations == ActivationFormat::kQ8_1) {
    bytes = std::max<size_t>(bytes, static_cast<size_t>(ops_internal::PanelRowBytes(n)));
  }
  return bytes;
}

void RowDot::Prepare(const float* x, int64_t n, void* prepared) const {
  if (quantize_panel_ != nullptr) {
    quantize_panel_(x, n, panel_offset_, static_cast<uint8_t*>(prepared));
  } else if (kernels_->vec_dot_type == GgmlType::kF32) {
    std::memcpy(prepared, x, static_cast<size_t>(n) * sizeof(float));
  } else {
    const TypeKernels* conv = KernelsFor(kernels_->vec_dot_type, isa_);
    if (conv == nullptr) conv = KernelsFor(kernels_->vec_dot_type, Isa::kScalar);
    conv->from_float(x, prepared, n);
  }
}

}  // namespace thermocline
