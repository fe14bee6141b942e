// Dots of single weight rows with one activation vector that is prepared once: the kernels a
// row-subset mat-vec (engine/sparse) calls for each active row. Quantized weights get the int8
// panel kernels of the dense decode path (activations quantized once into a panel, no per-row
// conversion); float weights get their vec_dot over F32 activations.
#pragma once

#include <cstddef>
#include <cstdint>

#include "engine/ops/ggml_types.h"
#include "engine/ops/kernels.h"

namespace thermocline {

// The row-dot kernels of one weight type on one ISA. Cheap to copy; thread-safe (stateless).
class RowDot {
 public:
  // The kernels of (type, isa); ok() is false when the type has no kernels on that ISA.
  RowDot(GgmlType type, Isa isa);
  bool ok() const { return kernels_ != nullptr; }

  // Bytes of x (n elements) prepared for Dot; the same for every ISA of `type` (the largest),
  // so a buffer sized once serves any of them.
  static size_t PreparedBytes(GgmlType type, int64_t n);
  // prepared = x: (n) in the layout Dot reads. n: the weight's columns.
  void Prepare(const float* x, int64_t n, void* prepared) const;
  // dot(w_row, x) for a weight row of n elements of this type and x from Prepare.
  float Dot(int64_t n, const void* w_row, const void* prepared) const {
    if (panel_dot_ != nullptr) {
      float out;
      panel_dot_(n, w_row, static_cast<const uint8_t*>(prepared), 0, 1, &out);
      return out;
    }
    return kernels_->vec_dot(n, w_row, prepared);
  }
  // out[r] = Dot(n, rows[r], prepared) for r < k <= kMaxRows, in one pass where the type has
  // multi-row kernels (the rows' loads interleave: more cache misses in flight).
  static constexpr int kMaxRows = 4;
  void DotRows(int64_t n, const void* const* rows, int k, const void* prepared, float* out) const {
    if (dot_rows_ != nullptr) {
      dot_rows_(n, rows, static_cast<const uint8_t*>(prepared), k, out);
      return;
    }
    for (int r = 0; r < k; ++r) out[r] = Dot(n, rows[r], prepared);
  }

 private:
  const TypeKernels* kernels_ = nullptr;
  // The panel kernels (kernels_internal.h's QuantDot), when the type and ISA have them.
  void (*panel_dot_)(int64_t, const void*, const uint8_t*, size_t, int, float*) = nullptr;
  void (*dot_rows_)(int64_t, const void* const*, const uint8_t*, int, float*) = nullptr;
  void (*quantize_panel_)(const float*, int64_t, int, uint8_t*) = nullptr;
  int panel_offset_ = 0;
  Isa isa_ = Isa::kScalar;
};

}  // namespace thermocline
