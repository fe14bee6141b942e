// Tensor element types in ggml's numbering and block layouts, so GGUF files written by llama.cpp
// load unchanged: the name and size of every ggml type (computable or not), and the block
// structs of those Thermocline computes with (their kernels: the weight-type table,
// ops/type_table.h).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace thermocline {

enum class GgmlType : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ5_0 = 6,
  kQ5_1 = 7,
  kQ8_0 = 8,
  kQ8_1 = 9,
  kQ2_K = 10,
  kQ3_K = 11,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
  kQ8_K = 15,
  kIQ2_XXS = 16,
  kIQ2_XS = 17,
  kIQ3_XXS = 18,
  kIQ1_S = 19,
  kIQ4_NL = 20,
  kIQ3_S = 21,
  kIQ2_S = 22,
  kIQ4_XS = 23,
  kI8 = 24,
  kI16 = 25,
  kI32 = 26,
  kI64 = 27,
  kF64 = 28,
  kIQ1_M = 29,
  kBF16 = 30,
  kTQ1_0 = 34,
  kTQ2_0 = 35,
};

struct GgmlTypeInfo {
  GgmlType type;
  const char* name;    // as llama.cpp prints it: "f32", "q4_0", ...
  int64_t block_size;  // elements per block
  int64_t type_size;   // bytes per block
};

// nullptr for a number that is not a ggml type.
const GgmlTypeInfo* FindGgmlType(uint32_t type);
const GgmlTypeInfo& TypeInfo(GgmlType type);
const GgmlTypeInfo* FindGgmlTypeByName(std::string_view name);
inline const char* TypeName(GgmlType type) { return TypeInfo(type).name; }

// Bytes of a row of n elements; n must be a multiple of the block size.
inline size_t RowBytes(GgmlType type, int64_t n) {
  const GgmlTypeInfo& info = TypeInfo(type);
  return static_cast<size_t>(n / info.block_size * info.type_size);
}

// Block layouts (ggml's, byte for byte). Halves (d, m, dmin) are IEEE fp16 bits.
constexpr int kQK4_0 = 32;
constexpr int kQK8_0 = 32;
constexpr int kQK_K = 256;  // elements of a K-quant (and IQ4_XS) super-block
struct BlockQ4_0 {
  uint16_t d;              // scale
  uint8_t qs[kQK4_0 / 2];  // element i in low nibble of qs[i], element i+16 in the high nibble
};
struct BlockQ8_0 {
  uint16_t d;  // scale
  int8_t qs[kQK8_0];
};
// Activations of the weight types with a min (Q4_1, Q5_1), as ggml's block_q8_1: Q8_0's quants
// and scale, and s = d * sum(qs) rounded to half from the unrounded d: the min's factor.
struct BlockQ8_1 {
  uint16_t d, s;
  int8_t qs[kQK8_0];
};
// x = d * q + m, q in 0..15 packed as Q4_0's.
struct BlockQ4_1 {
  uint16_t d, m;
  uint8_t qs[16];
};
// x = d * (q - 16), q in 0..31: low 4 bits as Q4_0's, bit 4 of element i is bit i of qh.
struct BlockQ5_0 {
  uint16_t d;
  uint8_t qh[4];
  uint8_t qs[16];
};
// x = d * q + m, q in 0..31 packed as Q5_0's.
struct BlockQ5_1 {
  uint16_t d, m;
  uint8_t qh[4];
  uint8_t qs[16];
};
// x = d * kIq4nlValues[q], q in 0..15 packed as Q4_0's.
struct BlockIQ4_NL {
  uint16_t d;
  uint8_t qs[16];
};
// Sixteen groups of 16: x = d * (scales[j] & 15) * q - dmin * (scales[j] >> 4), q in 0..3.
// Element 128h + 32s + l (s < 4, l < 32) is bits 2s..2s+1 of qs[32h + l].
struct BlockQ2_K {
  uint8_t scales[16];
  uint8_t qs[64];
  uint16_t d, dmin;
};
// Sixteen groups of 16: x = d * (sc_j - 32) * (q - 4), q in 0..7 with sc_j 6-bit (low 4 bits in
// scales[0..7], nibbles, high 2 bits in scales[8..11]); the low 2 bits of q are packed as
// Q2_K's, bit 2 of element 32g + l is bit g of hmask[l].
struct BlockQ3_K {
  uint8_t hmask[32];
  uint8_t qs[64];
  uint8_t scales[12];
  uint16_t d;
};
// Eight groups of 32: x = d * sc_j * q - dmin * m_j, 6-bit sc/m packed in scales[12] (see
// Q4KScaleMin), q in 0..15: element 64c + l is the low nibble of qs[32c + l], 64c + 32 + l the
// high one.
struct BlockQ4_K {
  uint16_t d, dmin;
  uint8_t scales[12];
  uint8_t qs[128];
};
// Q4_K with a fifth bit: bit 4 of element 32g + l is bit g of qh[l].
struct BlockQ5_K {
  uint16_t d, dmin;
  uint8_t scales[12];
  uint8_t qh[32];
  uint8_t qs[128];
};
// Sixteen groups of 16: x = d * scales[j] * (q - 32), q in 0..63: element 128h + 32s + l has
// its low 4 bits in ql[64h + 32(s & 1) + l] (low nibble for s < 2, high for s >= 2) and its
// high 2 bits at bits 2s..2s+1 of qh[32h + l].
struct BlockQ6_K {
  uint8_t ql[128];
  uint8_t qh[64];
  int8_t scales[16];
  uint16_t d;
};
// Eight groups of 32: x = d * (ls_j - 32) * kIq4nlValues[q], ls_j 6-bit (low 4 bits in
// scales_l nibbles, high 2 bits in scales_h), quants of group j packed as a Q4_0 block's at
// qs[16j].
struct BlockIQ4_XS {
  uint16_t d;
  uint16_t scales_h;
  uint8_t scales_l[4];
  uint8_t qs[128];
};
// Activations for the K-quant dots (never a weight type in files): x = d * qs, and bsums[j] the
// sum of qs[16j .. 16j + 16).
struct BlockQ8_K {
  float d;
  int8_t qs[kQK_K];
  int16_t bsums[kQK_K / 16];
};
static_assert(sizeof(BlockQ4_0) == 18);
static_assert(sizeof(BlockQ8_0) == 34);
static_assert(sizeof(BlockQ8_1) == 36);
static_assert(sizeof(BlockQ4_1) == 20);
static_assert(sizeof(BlockQ5_0) == 22);
static_assert(sizeof(BlockQ5_1) == 24);
static_assert(sizeof(BlockIQ4_NL) == 18);
static_assert(sizeof(BlockQ2_K) == 84);
static_assert(sizeof(BlockQ3_K) == 110);
static_assert(sizeof(BlockQ4_K) == 144);
static_assert(sizeof(BlockQ5_K) == 176);
static_assert(sizeof(BlockQ6_K) == 210);
static_assert(sizeof(BlockIQ4_XS) == 136);
static_assert(sizeof(BlockQ8_K) == 292);

// The 16 values of IQ4_NL and IQ4_XS quants (ggml's kvalues_iq4nl).
inline constexpr int8_t kIq4nlValues[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                            1,    13,   25,  38,  53,  69,  89,  113};

}  // namespace thermocline
