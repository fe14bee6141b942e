// Tensor element types in ggml's numbering and block layouts, so GGUF files written by llama.cpp
// load unchanged. One table describes every type; kernels live in ops/kernels.h.
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
  bool computable;     // Thermocline has kernels for it (dequantize, dot)
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

// Block layouts (ggml's, byte for byte).
constexpr int kQK4_0 = 32;
constexpr int kQK8_0 = 32;
struct BlockQ4_0 {
  uint16_t d;              // scale, IEEE half
  uint8_t qs[kQK4_0 / 2];  // element i in low nibble of qs[i], element i+16 in the high nibble
};
struct BlockQ8_0 {
  uint16_t d;  // scale, IEEE half
  int8_t qs[kQK8_0];
};
static_assert(sizeof(BlockQ4_0) == 18);
static_assert(sizeof(BlockQ8_0) == 34);

}  // namespace thermocline
