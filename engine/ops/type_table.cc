// The rows of the weight-type table and the lookup of each row's kernels in the per-ISA kernel
// lists (kernels_scalar.cc, kernels_simd.inc), done once on first use.
#include "engine/ops/type_table.h"

#include <algorithm>
#include <array>
#include <cstdlib>
#include <string>
#include <vector>

#include "engine/ops/kernels_internal.h"

namespace thermocline {
namespace {

using A = ActivationFormat;
using D = DeviceKernel;
using T = GgmlType;

// type, weight, activations, down_t, sparse, device. down_t: the float types and Q8_0 / Q4_0
// transpose into their own type; the others into Q8_0, whose requantization of already
// quantized values costs little (docs/types.md has the measurements), where transposing into the
// same type would quantize twice and an axpy over super-blocks of 256 costs more per row.
struct RowSpec {
  T type;
  bool weight;
  A activations;
  T down_t;
  bool sparse;
  D device;
};
constexpr RowSpec kRows[] = {
    {T::kF32, true, A::kF32, T::kF32, true, D::kF32},
    {T::kF16, true, A::kF32, T::kF16, true, D::kF16},
    {T::kBF16, true, A::kF32, T::kBF16, true, D::kBF16},
    {T::kQ8_0, true, A::kQ8_0, T::kQ8_0, true, D::kQ8_0},
    {T::kQ4_0, true, A::kQ8_0, T::kQ4_0, true, D::kQ4_0},
    {T::kQ4_1, true, A::kQ8_1, T::kQ8_0, true, D::kQ4_1},
    {T::kQ5_0, true, A::kQ8_0, T::kQ8_0, true, D::kQ5_0},
    {T::kQ5_1, true, A::kQ8_1, T::kQ8_0, true, D::kQ5_1},
    {T::kIQ4_NL, true, A::kQ8_0, T::kQ8_0, true, D::kIQ4_NL},
    {T::kQ2_K, true, A::kQ8_K, T::kQ8_0, true, D::kQ2_K},
    {T::kQ3_K, true, A::kQ8_K, T::kQ8_0, true, D::kQ3_K},
    {T::kQ4_K, true, A::kQ8_K, T::kQ8_0, true, D::kQ4_K},
    {T::kQ5_K, true, A::kQ8_K, T::kQ8_0, true, D::kQ5_K},
    {T::kQ6_K, true, A::kQ8_K, T::kQ8_0, true, D::kQ6_K},
    {T::kIQ4_XS, true, A::kQ8_K, T::kQ8_0, true, D::kIQ4_XS},
    {T::kQ8_K, false, A::kF32, T::kF32, false, D::kNone},
    {T::kQ8_1, false, A::kF32, T::kF32, false, D::kNone},
};
constexpr int kNumRows = sizeof(kRows) / sizeof(kRows[0]);
constexpr size_t kMaxTypeNumber = 40;  // above every GgmlType value

const ops_internal::IsaTypeKernels* Find(const ops_internal::IsaKernels& table, T type) {
  for (int i = 0; i < table.n_types; ++i) {
    if (table.types[i].type == type) return &table.types[i];
  }
  return nullptr;
}

struct Table {
  std::array<WeightTypeRow, kNumRows> rows;
  std::array<const WeightTypeRow*, kMaxTypeNumber> by_type{};
  std::string names;
};

const Table& GetTable() {
  static const Table table = [] {
    Table t;
    for (int i = 0; i < kNumRows; ++i) {
      const RowSpec& s = kRows[i];
      WeightTypeRow& row = t.rows[i];
      row = {s.type, s.weight, s.activations, s.down_t, s.sparse, s.device, {}};
      for (Isa isa : AvailableIsas()) {
        row.isa[static_cast<int>(isa)] = Find(ops_internal::TableOf(isa), s.type);
      }
      // Every row has its scalar reference; a missing one is a build error in kernel tables.
      if (row.isa[0] == nullptr) std::abort();
      t.by_type[static_cast<size_t>(s.type)] = &row;
      if (s.weight) t.names += std::string(t.names.empty() ? "" : ", ") + TypeName(s.type);
    }
    return t;
  }();
  return table;
}

}  // namespace

const char* ActivationFormatName(ActivationFormat f) {
  switch (f) {
    case ActivationFormat::kF32:
      return "f32";
    case ActivationFormat::kQ8_0:
      return "q8_0";
    case ActivationFormat::kQ8_1:
      return "q8_1";
    case ActivationFormat::kQ8_K:
      return "q8_K";
  }
  return "?";
}

bool WeightTypeRow::can_be_down_t() const { return isa[0] != nullptr && isa[0]->axpy != nullptr; }

const WeightTypeRow* FindTypeRow(GgmlType type) {
  const size_t i = static_cast<size_t>(type);
  return i < kMaxTypeNumber ? GetTable().by_type[i] : nullptr;
}

const WeightTypeRow* FindWeightType(GgmlType type) {
  const WeightTypeRow* row = FindTypeRow(type);
  return row != nullptr && row->weight ? row : nullptr;
}

absl::Span<const WeightTypeRow> TypeRows() { return GetTable().rows; }

const char* WeightTypeNames() { return GetTable().names.c_str(); }

namespace ops_internal {

const IsaTypeKernels* IsaKernelsFor(GgmlType type, Isa isa) {
  const WeightTypeRow* row = FindTypeRow(type);
  return row != nullptr ? row->isa[static_cast<int>(isa)] : nullptr;
}

const QuantDot* QuantDotFor(GgmlType type, Isa isa) {
  const IsaTypeKernels* k = IsaKernelsFor(type, isa);
  return k != nullptr && k->dot.dot != nullptr ? &k->dot : nullptr;
}

const GemmKernels* GemmFor(GgmlType type, Isa isa) {
  const IsaTypeKernels* k = IsaKernelsFor(type, isa);
  return k != nullptr && k->gemm.gemm != nullptr ? &k->gemm : nullptr;
}

}  // namespace ops_internal

const TypeKernels* KernelsFor(GgmlType type, Isa isa) {
  const ops_internal::IsaTypeKernels* k = ops_internal::IsaKernelsFor(type, isa);
  return k != nullptr ? &k->row : nullptr;
}

const TypeKernels* KernelsFor(GgmlType type) { return KernelsFor(type, BestIsa()); }

AxpyFn AxpyFor(GgmlType type, Isa isa) {
  const ops_internal::IsaTypeKernels* k = ops_internal::IsaKernelsFor(type, isa);
  return k != nullptr ? k->axpy : nullptr;
}

}  // namespace thermocline
