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
#include <vector>

#include "engine/ops/ggml_types.h"
#include "engine/ops/kernels.h"

namespace thermocline::ops_internal {

// How ggml's x86 dot of a super-block type (its AVX2 kernels, which AVX-512 builds run too)
// adds the mins term -d_x dmin Σ m bsums to its float lanes; the row dots of every ISA follow it
// so that their results are llama.cpp's bit for bit (kquant_simd.inc, kernels_scalar_quants.cc):
//   kNone    no mins (Q3_K, Q6_K and IQ4_XS fold their offsets into the integer lanes);
//   kLanes8  Q2_K: 8 lanes of two 16-element mins each, fused into the 8 float lanes before
//            the block's scales are;
//   kLanes4  Q4_K: 4 lanes of two 32-element mins each, in 4 float lanes of their own, added
//            to the 8 lanes' sum at the end;
//   kSum     Q5_K: one integer sum per block, fused into one float.
enum class KMins { kNone, kLanes8, kLanes4, kSum };

// ggml's float part of a super-block dot, in plain float operations (kquant_simd.inc's
// GgmlSuperAcc does it in vectors): Add takes one block's 8 integer lanes L[m] (elements
// 4m .. 4m + 3 of every 32, times their sub-block's scale), the mins' products P[m] (the mins of
// 16-element sub-blocks 2m and 2m + 1 times their bsums) and d = d_x·d, dmin = -d_x·dmin; Sum is
// hsum_float_8 of the lanes plus the mins as `kind` says. Shared by the scalar references of the
// file's rows (kernels_scalar_quants.cc, which defines it) and of the row groups
// (kquant_groups_scalar.cc), so both give llama.cpp's bits.
struct GgmlSuperFloats {
  KMins kind;
  float acc[8] = {}, mins4[4] = {}, mins = 0.0f;
  void Add(const int32_t lanes[8], const int32_t pairs[8], float d, float dmin);
  float Sum() const;
};

// Panel: one row of activations quantized to Q8_0 and laid out for the int8 dot kernels.
// Blocks are stored in groups of two (64 elements, kPanelGroupBytes bytes, 64-byte aligned when
// the row is):
//   int8  qs[64];  the two blocks' quants, in element order
//   float d[16];   d[8h .. 8h+8) = scale of block h (one per int32 lane of that block's dot)
//   float c[16];   c[8h .. 8h+8) = -offset * d_h * sum(qs of block h) / 8
// where offset is what the weight kernel adds to each weight to make it unsigned (8 for Q4_0,
// 16 for Q5_0, 128 for Q8_0 and IQ4_NL with VNNI, 0 when weights stay signed). A lane of the
// dot of unsigned weights u with x is then d * sum(u * x) + c, whose sum over the block's 8
// lanes is d * sum(w * x): the activation-only work is done once per row instead of once per
// weight row. Types with a min (Q4_1, Q5_1) use offset -1: c then holds s_h / 8, s as ggml's
// Q8_1 blocks have it (d_h * sum rounded to half, BlockQ8_1), which their kernels scale by the
// weight block's min. An odd last block is followed by a zero block.
inline constexpr int64_t kPanelGroupBytes = 192;
inline constexpr int64_t PanelRowBytes(int64_t n) {
  return (n / kQK8_0 + 1) / 2 * kPanelGroupBytes;
}

// The int8 kernels of one quantized weight type for one ISA, over activations prepared once
// per row ("panel"): the Q8_0 panel above for the 32-element types, plain Q8_K blocks for the
// 256-element ones (offset unused).
struct QuantDot {
  int offset;  // see the panel layout above
  // panel = x (n floats, n a multiple of the block size) quantized to the type's activation
  // format (exactly as that format's from_float does), row_bytes(n) bytes.
  void (*quantize_panel)(const float* x, int64_t n, int offset, uint8_t* panel);
  // out[j] = dot(weight row w, panel row j) for j < k <= 8; panel rows panel_stride bytes apart.
  void (*dot)(int64_t n, const void* w, const uint8_t* panel, size_t panel_stride, int k,
              float* out);
  // out[r] = dot(weight row w[r], panel) for r < k <= kMaxDotRows: rows anywhere (the active
  // rows of a sparse layer). The panel is loaded once per step for all k rows, and the k rows'
  // loads interleave, so more of their cache misses are in flight at once.
  void (*dot_rows)(int64_t n, const void* const* w, const uint8_t* panel, int k, float* out);
  size_t (*row_bytes)(int64_t n);  // of a panel row of n elements
};
inline constexpr int kMaxDotRows = 4;

// Tile row: one row of activations quantized to Q8_0 for the tile (matrix-matrix) kernels of
// the 32-element quantized types:
//   int8  qs[nb * 32];   the quants
//   float d[nb];         block scales
//   int32 corr[nb];      -offset * sum(qs of the block), offset as for panels; for offset -1
//                        the bits of the float s of Q8_1 (BlockQ8_1)
// padded to a multiple of 64 bytes. The 256-element types read plain Q8_K blocks instead.
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
  // Quantized types: tile row (row_bytes(n) bytes) = x (n floats) quantized as the activation
  // format's from_float does. nullptr for float types, whose gemm reads F32 activation rows.
  void (*quantize)(const float* x, int64_t n, int offset, uint8_t* tile_row);
  // y[t * y_stride + r] = dot(weight row r, activation row t) for r < rows <= rows_per_group,
  // t < n_tokens; weight rows w_stride bytes apart, activation rows act_stride bytes apart.
  void (*gemm)(int64_t n, const uint8_t* w, size_t w_stride, int rows, const uint8_t* act,
               size_t act_stride, int64_t n_tokens, float* y, int64_t y_stride);
  size_t (*row_bytes)(int64_t n);  // of a tile row of n elements (quantized types)
};

// Q4_0 in row groups (weight_layout.h's PackQ4_0Groups, built once at load): the rows in groups
// of kQ4GroupRows (the last group padded with zero rows), group g at g * Q4GroupBytes(n):
//   uint8  qs[nb][4][kQ4GroupRows][4]   block b, chunk c, row r: bytes 4c .. 4c+3 of row r's
//                                       block b (low nibbles: elements 4c .. 4c+3, high
//                                       nibbles: elements 16+4c .. 16+4c+3)
//   uint16 d[nb][kQ4GroupRows]          the blocks' fp16 scales
// padded to 64 bytes. A vector of 16 rows' 4-byte chunks is one load, and its two nibble
// halves each meet one broadcast of 4 activation quants: an int8 dot then adds 4 products
// into every row's own int32 lane (the gemm's repacked layout, with nibbles still packed).
inline constexpr int kQ4GroupRows = 16;
inline constexpr int64_t kQ4GroupBlockBytes = 4 * kQ4GroupRows * 4;  // quants of one block
inline constexpr size_t Q4GroupBytes(int64_t n) {
  return static_cast<size_t>((n / kQK4_0 * (kQ4GroupBlockBytes + 2 * kQ4GroupRows) + 63) / 64 * 64);
}

// The kernels of one ISA over Q4_0 row groups. Activations are tile rows (TileRowBytes) with
// offset 8 (the weights are the unsigned nibbles, w + 8).
struct Q4GroupKernels {
  // tile_row = x (n floats) quantized to Q8_0, as the tile layout above.
  void (*quantize)(const float* x, int64_t n, int offset, uint8_t* tile_row);
  // y[r] = dot(row r, tile row act) for r < rows: the groups from w on, group_bytes apart.
  void (*matvec)(int64_t n, const uint8_t* w, size_t group_bytes, int64_t rows, const uint8_t* act,
                 float* y);
  // y[t * y_stride + r] = dot(row r, tile row t) for r < rows <= gemm_rows, t < n_tokens.
  void (*gemm)(int64_t n, const uint8_t* w, size_t group_bytes, int rows, const uint8_t* act,
               size_t act_stride, int64_t n_tokens, float* y, int64_t y_stride);
  int gemm_rows;  // a multiple of kQ4GroupRows
};

// Q4_K in row groups (weight_layout.h's PackQ4_KGroups, built once at load): the rows in groups
// of kQ4GroupRows (the last padded with zero rows), group g at g * Q4KGroupBytes(n), one record
// of Q4KGroupSuperBytes per super-block sb of 256 elements:
//   uint8  qs[4][8][kQ4GroupRows][4]  pair j, chunk c, row r: bytes 4c .. 4c+3 of the row's
//                                     qs[32j .. 32j+32) (low nibbles: elements 64j + 4c .. +3,
//                                     of sub-block 2j; high nibbles: 64j + 32 + 4c .. +3, of 2j+1)
//   uint8  sc[8][kQ4GroupRows]        the sub-blocks' 6-bit scales, unpacked
//   uint8  m[4][kQ4GroupRows][2]      the sub-blocks' 6-bit mins, pair j = (m[2j], m[2j+1])
//   uint16 d[kQ4GroupRows], dmin[kQ4GroupRows]  fp16
// As for Q4_0 groups, each chunk load holds 16 rows' bytes and meets broadcast activation quants
// in int8 dots, one int32 lane per row; the scales multiply each sub-block's sum in its lane
// and the mins meet the activations' sums of 32 in int16 pairs. Per row and super-block:
//   y += d·dx · Σ_s sc[s]·(q·x)_s  -  dmin·dx · Σ_s m[s]·Σ x_s,   x a Q8_K block (dx its scale).
inline constexpr int64_t kQ4KGroupQuantBytes = 4 * 8 * kQ4GroupRows * 4;
inline constexpr int64_t kQ4KGroupSuperBytes =
    kQ4KGroupQuantBytes + 8 * kQ4GroupRows + 8 * kQ4GroupRows + 4 * kQ4GroupRows;
static_assert(kQ4KGroupSuperBytes % 64 == 0, "super-block records stay 64-byte aligned");
inline constexpr size_t Q4KGroupBytes(int64_t n) {
  return static_cast<size_t>(n / kQK_K * kQ4KGroupSuperBytes);
}

// Q5_K in row groups (weight_layout.h's PackQ5_KGroups): Q4_K's record with the weights' fifth
// bits between the quants and the scales, one record of Q5KGroupSuperBytes per super-block:
//   uint8  qs[4][8][kQ4GroupRows][4]  as Q4_K's: the weights' low 4 bits
//   uint8  qh[8][kQ4GroupRows][4]     chunk c, row r: bytes 4c .. 4c+3 of the row's qh (bit
//                                     2j of byte k: the fifth bit of element 64j + 4c + k, bit
//                                     2j + 1: of 64j + 32 + 4c + k), what chunk c of every pair
//                                     needs in one load
//   then sc, m, d and dmin as Q4_K's. The weights are 0..31; the sums are Q4_K's.
inline constexpr int64_t kQ5KGroupHighBytes = 8 * kQ4GroupRows * 4;
inline constexpr int64_t kQ5KGroupSuperBytes = kQ4KGroupSuperBytes + kQ5KGroupHighBytes;
static_assert(kQ5KGroupSuperBytes % 64 == 0, "super-block records stay 64-byte aligned");
inline constexpr size_t Q5KGroupBytes(int64_t n) {
  return static_cast<size_t>(n / kQK_K * kQ5KGroupSuperBytes);
}

// Q6_K in row groups (weight_layout.h's PackQ6_KGroups), as Q4_K's, one record of
// Q6KGroupSuperBytes per super-block:
//   uint8 q[2][8][3][kQ4GroupRows][4]  half h, chunk k, part p, row r: 4 bytes that hold the
//                                      6-bit weights of the elements 128h + 32s + 4k + {0..3}
//                                      of its 4 streams s: part p's low 6 bits are stream p's
//                                      weight, its top 2 bits bits 2p, 2p + 1 of stream 3's
//                                      (Q6GroupEncode), so that three of the streams are one
//                                      AND each
//   int8  sc[16][kQ4GroupRows]         the scales of the sub-blocks of 16
//   uint16 d[kQ4GroupRows]             fp16, then 32 bytes of zeros (64-byte records)
// The weights stay unsigned (0..63) in the int8 dots; the offset 32 leaves each sub-block's sum
// as 32 Σx_s, the same for every row, which is taken from it before its scale multiplies it:
//   y += d·dx · Σ_s sc[s]·((q·x)_s - 32 Σ x_s)
inline constexpr int64_t kQ6KGroupQuantBytes = 2 * 8 * 3 * kQ4GroupRows * 4;
inline constexpr int64_t kQ6KGroupSuperBytes =
    (kQ6KGroupQuantBytes + 16 * kQ4GroupRows + 2 * kQ4GroupRows + 63) / 64 * 64;
inline constexpr size_t Q6KGroupBytes(int64_t n) {
  return static_cast<size_t>(n / kQK_K * kQ6KGroupSuperBytes);
}

// Q3_K in row groups (weight_layout.h's PackQ3_KGroups), with Q6_K's streams and sub-blocks,
// one record of Q3KGroupSuperBytes per super-block:
//   uint8 qs[2][8][kQ4GroupRows][4]  half h, chunk k, row r: bytes 4k .. 4k+3 of the row's
//                                    qs[32h ..): bits 2s, 2s + 1 of byte b are the low 2 bits
//                                    of element 128h + 32s + 4k + b
//   uint8 hm[8][kQ4GroupRows][4]     chunk k, row r: bytes 4k .. 4k+3 of the row's hmask (bit
//                                    4h + s of byte b: bit 2 of that element)
//   uint8 sc[16][kQ4GroupRows]       the sub-blocks' 6-bit scales, unpacked (scale: sc - 32)
//   uint16 d[kQ4GroupRows]           fp16, then zeros to 64 bytes
// The weights are unsigned (q = low 2 bits + 4 · bit 2, 0..7) with offset 4, as Q6_K's:
//   y += d·dx · Σ_s sc[s]·((q·x)_s - 4 Σ x_s)
inline constexpr int64_t kQ3KGroupQuantBytes = (2 * 8 + 8) * kQ4GroupRows * 4;
inline constexpr int64_t kQ3KGroupSuperBytes =
    (kQ3KGroupQuantBytes + 16 * kQ4GroupRows + 2 * kQ4GroupRows + 63) / 64 * 64;
inline constexpr size_t Q3KGroupBytes(int64_t n) {
  return static_cast<size_t>(n / kQK_K * kQ3KGroupSuperBytes);
}

// Q2_K in row groups (weight_layout.h's PackQ2_KGroups), with Q3_K's streams, one record of
// Q2KGroupSuperBytes per super-block, the same bytes as the rows:
//   uint8 qs[2][8][kQ4GroupRows][4]  as Q3_K's: bits 2s, 2s + 1 of byte b, the weight (0..3)
//                                    of element 128h + 32s + 4k + b
//   uint8 sc[8][kQ4GroupRows][2]     pair j, row r: the row's scales bytes 2j, 2j + 1 (low
//                                    nibble the sub-block's scale, high nibble its min)
//   uint16 d[kQ4GroupRows], dmin[kQ4GroupRows]  fp16
//   y += d·dx · Σ_s sc[s]·(q·x)_s  -  dmin·dx · Σ_s m[s]·Σ x_s
inline constexpr int64_t kQ2KGroupQuantBytes = 2 * 8 * kQ4GroupRows * 4;
inline constexpr int64_t kQ2KGroupSuperBytes =
    kQ2KGroupQuantBytes + 16 * kQ4GroupRows + 4 * kQ4GroupRows;
static_assert(kQ2KGroupSuperBytes % 64 == 0, "super-block records stay 64-byte aligned");
inline constexpr size_t Q2KGroupBytes(int64_t n) {
  return static_cast<size_t>(n / kQK_K * kQ2KGroupSuperBytes);
}

// The three part bytes of one row's chunk from the weights v[0..3] (0..63) of its 4 streams, and
// back.
inline void Q6GroupEncode(const int v[4], uint8_t part[3]) {
  for (int p = 0; p < 3; ++p) {
    part[p] = static_cast<uint8_t>(v[p] | ((v[3] >> (2 * p)) & 3) << 6);
  }
}
inline void Q6GroupDecode(const uint8_t part[3], int v[4]) {
  v[3] = 0;
  for (int p = 0; p < 3; ++p) {
    v[p] = part[p] & 0x3F;
    v[3] |= (part[p] >> 6) << (2 * p);
  }
}

// The kernels of one ISA over the K-quants' row groups. Activations are Q8_K rows (the
// types' own activation format).
struct KGroupKernels {
  // y[r] = dot(row r, act) for r < rows: the groups from w on, group_bytes apart.
  void (*matvec)(int64_t n, const uint8_t* w, size_t group_bytes, int64_t rows, const uint8_t* act,
                 float* y);
  // y[t * y_stride + r] = dot(row r, act row t) for r < rows <= kQ4GroupRows, t < n_tokens.
  void (*gemm)(int64_t n, const uint8_t* w, int rows, const uint8_t* act, size_t act_stride,
               int64_t n_tokens, float* y, int64_t y_stride);
};

// kernels.h's AttendHead (its general form).
using AttendFn = void (*)(int64_t n_kv, int64_t k_dim, int64_t v_dim, const float* q,
                          const float* k, int64_t k_stride, const float* v, int64_t v_stride,
                          float scale, float softcap, float* scores, float* out);
// kernels.h's AttendGroupF16: the same over rows of halves, for the query heads that share them.
using AttendF16Fn = void (*)(int64_t n_kv, int64_t k_dim, int64_t v_dim, int n_heads,
                             const float* q, int64_t q_stride, const HalfRows& k, const HalfRows& v,
                             float scale, float softcap, bool batched, float* scores, float* out,
                             int64_t out_stride);

// Everything one ISA has for one weight type (a cell of the weight-type table). Panel, gemm
// and axpy kernels are null where the ISA has none.
struct IsaTypeKernels {
  GgmlType type;
  TypeKernels row;   // conversions, and the dots over activations in row.vec_dot_type
  QuantDot dot;      // decode: dots over prepared activations (dot.dot null: none)
  GemmKernels gemm;  // prefill (gemm.gemm null: none)
  AxpyFn axpy;       // the sparse down projection over rows of this type
};

// Every kernel of one ISA: one entry per type it has kernels for, and attention.
struct IsaKernels {
  const IsaTypeKernels* types;
  int n_types;
  AttendFn attend;
  AttendF16Fn attend_f16;
  void (*silu_mul)(float* gate, const float* up, int64_t n);
  Q4GroupKernels q4_groups;
  KGroupKernels q2k_groups;
  KGroupKernels q3k_groups;
  KGroupKernels q4k_groups;
  KGroupKernels q5k_groups;
  KGroupKernels q6k_groups;
};

const IsaKernels& ScalarKernels();      // kernels_scalar.cc
const IsaKernels& Avx2Kernels();        // kernels_avx2.cc
const IsaKernels& Avx512Kernels();      // kernels_avx512.cc
const IsaKernels& Avx512VnniKernels();  // kernels_vnni_avx512.cc

// The scalar Q4_0 row-group kernels (q4_groups_scalar.cc).
Q4GroupKernels ScalarQ4GroupKernels();
// The scalar K-quant row-group kernels (kquant_groups_scalar.cc).
KGroupKernels ScalarQ2KGroupKernels();
KGroupKernels ScalarQ3KGroupKernels();
KGroupKernels ScalarQ4KGroupKernels();
KGroupKernels ScalarQ5KGroupKernels();
KGroupKernels ScalarQ6KGroupKernels();

// The scalar entries of the types beyond Q8_0 / Q4_0 and of Q8_K (kernels_scalar_quants.cc).
std::vector<IsaTypeKernels> ScalarQuantTypes();

// ggml's quantize_row_q4_0_ref (scalar; weights are quantized offline, so no SIMD version).
void QuantizeQ4_0Reference(const float* src, void* dst, int64_t n);

// The cell of (type, isa) in the weight-type table; nullptr when the type or the CPU's ISA has
// no kernels.
const IsaTypeKernels* IsaKernelsFor(GgmlType type, Isa isa);
// The panel / gemm kernels of `type` for `isa`; nullptr when there are none.
const QuantDot* QuantDotFor(GgmlType type, Isa isa);
const GemmKernels* GemmFor(GgmlType type, Isa isa);
// The kernel tables of `isa` (the scalar ones for an ISA this CPU lacks).
const IsaKernels& TableOf(Isa isa);

}  // namespace thermocline::ops_internal
