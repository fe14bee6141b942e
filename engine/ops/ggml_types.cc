#include "engine/ops/ggml_types.h"

#include <array>
#include <cstdlib>

namespace thermocline {
namespace {

constexpr std::array<GgmlTypeInfo, 31> kTypes = {{
    {GgmlType::kF32, "f32", 1, 4, true},
    {GgmlType::kF16, "f16", 1, 2, true},
    {GgmlType::kQ4_0, "q4_0", 32, 18, true},
    {GgmlType::kQ4_1, "q4_1", 32, 20, false},
    {GgmlType::kQ5_0, "q5_0", 32, 22, false},
    {GgmlType::kQ5_1, "q5_1", 32, 24, false},
    {GgmlType::kQ8_0, "q8_0", 32, 34, true},
    {GgmlType::kQ8_1, "q8_1", 32, 36, false},
    {GgmlType::kQ2_K, "q2_K", 256, 84, false},
    {GgmlType::kQ3_K, "q3_K", 256, 110, false},
    {GgmlType::kQ4_K, "q4_K", 256, 144, false},
    {GgmlType::kQ5_K, "q5_K", 256, 176, false},
    {GgmlType::kQ6_K, "q6_K", 256, 210, false},
    {GgmlType::kQ8_K, "q8_K", 256, 292, false},
    {GgmlType::kIQ2_XXS, "iq2_xxs", 256, 66, false},
    {GgmlType::kIQ2_XS, "iq2_xs", 256, 74, false},
    {GgmlType::kIQ3_XXS, "iq3_xxs", 256, 98, false},
    {GgmlType::kIQ1_S, "iq1_s", 256, 50, false},
    {GgmlType::kIQ4_NL, "iq4_nl", 32, 18, false},
    {GgmlType::kIQ3_S, "iq3_s", 256, 110, false},
    {GgmlType::kIQ2_S, "iq2_s", 256, 82, false},
    {GgmlType::kIQ4_XS, "iq4_xs", 256, 136, false},
    {GgmlType::kI8, "i8", 1, 1, false},
    {GgmlType::kI16, "i16", 1, 2, false},
    {GgmlType::kI32, "i32", 1, 4, false},
    {GgmlType::kI64, "i64", 1, 8, false},
    {GgmlType::kF64, "f64", 1, 8, false},
    {GgmlType::kIQ1_M, "iq1_m", 256, 56, false},
    {GgmlType::kBF16, "bf16", 1, 2, true},
    {GgmlType::kTQ1_0, "tq1_0", 256, 54, false},
    {GgmlType::kTQ2_0, "tq2_0", 256, 66, false},
}};

}  // namespace

const GgmlTypeInfo* FindGgmlType(uint32_t type) {
  for (const GgmlTypeInfo& info : kTypes) {
    if (static_cast<uint32_t>(info.type) == type) return &info;
  }
  return nullptr;
}

const GgmlTypeInfo& TypeInfo(GgmlType type) {
  const GgmlTypeInfo* info = FindGgmlType(static_cast<uint32_t>(type));
  if (info == nullptr) std::abort();  // GgmlType values only come from validated input
  return *info;
}

const GgmlTypeInfo* FindGgmlTypeByName(std::string_view name) {
  for (const GgmlTypeInfo& info : kTypes) {
    if (std::string_view(info.name) == name) return &info;
  }
  return nullptr;
}

}  // namespace thermocline
