// Internal to engine/ops: the per-ISA kernel tables behind kernels.h, and the activation
// "panel" layout that the int8 matrix kernels of quantized weights read. Nothing outside
// engine/ops (and its tests) should include this.
//
// This header is included by the ISA-specific translation units (compiled with -mavx512f etc.),
// so it must not define inline functions that other translation units also use: the linker
// may keep the AVX-512 copy of such a function for the whole program.
#pragma once

#include <cstddef>
#include <cstdint>

#include "engine/ops/ggml_types.h"
#include "engine/ops/kernels.h"

namespace thermocline::ops_internal {

// Panel: one row of activations quantized to Q8_0 and laid out for the int8 dot kernels.
// Blocks are stored in groups of two (64 elements, kPanelGroupBytes bytes, 64-byte aligned when
// the row is):
//   int8  qs[64];  the two blocks' quants, in element order
//   float d[16];   d[8h .. 8h+8) = scale of block h (one per int32 lane of that block's dot)
//   float c[16];   c[8h .. 8h+8) = -offset * d_h * sum(qs of block h) / 8
// where offset is what the weight kernel adds to each weight to make it unsigned (8 for Q4_0,
// 128 for Q8_0 with VNNI, 0 when weights stay signed). A lane of the dot of unsigned weights u
// with x is then d * sum(u * x) + c, whose sum over the block's 8 lanes is d * sum(w * x):
// the activation-only work is done once per row instead of once per weight row. An odd last
// block is followed by a zero block.
inline constexpr int64_t kPanelGroupBytes = 192;
inline constexpr int64_t PanelRowBytes(int64_t n) {
  return (n / kQK8_0 + 1) / 2 * kPanelGroupBytes;
}

// The int8 kernels of one quantized weight type (Q4_0 or Q8_0) for one ISA.
struct QuantDot {
  int offset;  // see the panel layout above
  // panel = x (n floats, n a multiple of 32) quantized to Q8_0 (exactly as from_float does).
  void (*quantize_panel)(const float* x, int64_t n, int offset, uint8_t* panel);
  // out[j] = dot(weight row w, panel row j) for j < k <= 8; panel rows panel_stride bytes apart.
  void (*dot)(int64_t n, const void* w, const uint8_t* panel, size_t panel_stride, int k,
              float* out);
  // out[r] = dot(weight row w[r], panel) for r < k <= kMaxDotRows: rows anywhere (the active
  // rows of a sparse layer). The panel is loaded once per step for all k rows, and the k rows'
  // loads interleave, so more of their cache misses are in flight at once.
  void (*dot_rows)(int64_t n, const void* const* w, const uint8_t* panel, int k, float* out);
};
inline constexpr int kMaxDotRows = 4;

// Tile row: one row of activations quantized to Q8_0 for the tile (matrix-matrix) kernels of
// quantized weights:
//   int8  qs[nb * 32];   the quants
//   float d[nb];         block scales
//   int32 corr[nb];      -offset * sum(qs of the block), offset as for panels
// padded to a multiple of 64 bytes.
inline constexpr int64_t TileRowBytes(int64_t n) { return (n / kQK8_0 * 40 + 63) / 64 * 64; }

// The matrix-matrix (prefill) kernels of one weight type for one ISA. A group of up to
// rows_per_group weight rows is repacked (on the stack, a chunk of columns at a time) so that
// each lane of a vector holds one row: a product then needs one broadcast activation per
// vector of rows, and for quantized types the int8 dot of a block stays in one int32 lane, so
// the float scaling is done once per row, block and token instead of once per 4 elements.
struct GemmKernels {
  int offset;          // quantized types: see the panel layout
  int rows_per_group;  // 0: no gemm kernels
  int min_tokens;      // below this many tokens the row kernels are faster (repacking dominates)
  // Quantized types: tile row (TileRowBytes(n) bytes) = x (n floats) quantized to Q8_0 as
  // from_float does. nullptr for float types, whose gemm reads F32 activation rows as they are.
  void (*quantize)(const float* x, int64_t n, int offset, uint8_t* tile_row);
  // y[t * y_stride + r] = dot(weight row r, activation row t) for r < rows <= rows_per_group,
  // t < n_tokens; weight rows w_stride bytes apart, activation rows act_stride bytes apart.
  void (*gemm)(int64_t n, const uint8_t* w, size_t w_stride, int rows, const uint8_t* act,
               size_t act_stride, int64_t n_tokens, float* y, int64_t y_stride);
};

// Every kernel of one ISA. Panel and gemm kernels are null where the ISA has none (scalar).
// kernels.h's AttendHead (its general form).
using AttendFn = void (*)(int64_t n_kv, int64_t k_dim, int64_t v_dim, const float* q,
                          const float* k, int64_t k_stride, const float* v, int64_t v_stride,
                          float scale, float softcap, float* scores, float* out);

struct IsaKernels {
  TypeKernels f32, f16, bf16, q8_0, q4_0;
  QuantDot q8_0_panel, q4_0_panel;
  GemmKernels f32_gemm, f16_gemm, bf16_gemm, q8_0_gemm, q4_0_gemm;
  AttendFn attend;
};

const IsaKernels& ScalarKernels();      // kernels_scalar.cc
const IsaKernels& Avx2Kernels();        // kernels_avx2.cc
const IsaKernels& Avx512Kernels();      // kernels_avx512.cc
const IsaKernels& Avx512VnniKernels();  // kernels_vnni_avx512.cc

// ggml's quantize_row_q4_0_ref (scalar; weights are quantized offline, so no SIMD version).
void QuantizeQ4_0Reference(const float* src, void* dst, int64_t n);

// The panel / gemm kernels of `type` for `isa`; nullptr when there are none.
const QuantDot* QuantDotFor(GgmlType type, Isa isa);
const GemmKernels* GemmFor(GgmlType type, Isa isa);

}  // namespace thermocline::ops_internal
