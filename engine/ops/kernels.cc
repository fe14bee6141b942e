// Kernel dispatch: which ISAs this CPU runs (checked once), and the kernel table of each.
// The tables themselves live in kernels_scalar.cc and the per-ISA kernels_*.cc files.
#include "engine/ops/kernels.h"

#include <cpuid.h>

#include <cstdlib>
#include <cstring>

#include "engine/ops/kernels_internal.h"

namespace thermocline {
namespace {

using ops_internal::IsaKernels;

bool CpuHasF16c() {  // not every compiler's __builtin_cpu_supports knows "f16c"
  unsigned eax, ebx, ecx, edx;
  return __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & bit_F16C) != 0;
}

bool CpuHas(Isa isa) {
  __builtin_cpu_init();
  switch (isa) {
    case Isa::kScalar:
      return true;
    case Isa::kAvx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && CpuHasF16c() &&
             __builtin_cpu_supports("bmi2");
    case Isa::kAvx512:
      return CpuHas(Isa::kAvx2) && __builtin_cpu_supports("avx512f") &&
             __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
             __builtin_cpu_supports("avx512dq");
    case Isa::kAvx512Vnni:
      return CpuHas(Isa::kAvx512) && __builtin_cpu_supports("avx512vnni");
  }
  return false;
}

std::vector<Isa> DetectIsas() {
  std::vector<Isa> isas;
  const char* cap = std::getenv("THERMOCLINE_ISA");
  for (Isa isa : {Isa::kScalar, Isa::kAvx2, Isa::kAvx512, Isa::kAvx512Vnni}) {
    if (!CpuHas(isa)) break;
    isas.push_back(isa);
    if (cap != nullptr && std::strcmp(cap, IsaName(isa)) == 0) break;
  }
  return isas;
}

const IsaKernels* TableFor(Isa isa) {
  for (Isa available : AvailableIsas()) {
    if (available != isa) continue;
    switch (isa) {
      case Isa::kScalar:
        return &ops_internal::ScalarKernels();
      case Isa::kAvx2:
        return &ops_internal::Avx2Kernels();
      case Isa::kAvx512:
        return &ops_internal::Avx512Kernels();
      case Isa::kAvx512Vnni:
        return &ops_internal::Avx512VnniKernels();
    }
  }
  return nullptr;
}

}  // namespace

const char* IsaName(Isa isa) {
  switch (isa) {
    case Isa::kScalar:
      return "scalar";
    case Isa::kAvx2:
      return "avx2";
    case Isa::kAvx512:
      return "avx512";
    case Isa::kAvx512Vnni:
      return "avx512_vnni";
  }
  return "unknown";
}

const std::vector<Isa>& AvailableIsas() {
  static const std::vector<Isa> isas = DetectIsas();
  return isas;
}

Isa BestIsa() { return AvailableIsas().back(); }

const TypeKernels* KernelsFor(GgmlType type) { return KernelsFor(type, BestIsa()); }

const TypeKernels* KernelsFor(GgmlType type, Isa isa) {
  const IsaKernels* table = TableFor(isa);
  if (table == nullptr) return nullptr;
  switch (type) {
    case GgmlType::kF32:
      return &table->f32;
    case GgmlType::kF16:
      return &table->f16;
    case GgmlType::kBF16:
      return &table->bf16;
    case GgmlType::kQ8_0:
      return &table->q8_0;
    case GgmlType::kQ4_0:
      return &table->q4_0;
    default:
      return nullptr;
  }
}

void AttendHead(Isa isa, int64_t n_kv, int64_t k_dim, int64_t v_dim, const float* q,
                const float* k, int64_t k_stride, const float* v, int64_t v_stride, float scale,
                float softcap, float* scores, float* out) {
  const IsaKernels* table = TableFor(isa);
  if (table == nullptr) table = &ops_internal::ScalarKernels();
  table->attend(n_kv, k_dim, v_dim, q, k, k_stride, v, v_stride, scale, softcap, scores, out);
}

void AttendHead(int64_t n_kv, int64_t k_dim, int64_t v_dim, const float* q, const float* k,
                int64_t k_stride, const float* v, int64_t v_stride, float scale, float softcap,
                float* scores, float* out) {
  static const ops_internal::AttendFn attend = TableFor(BestIsa())->attend;
  attend(n_kv, k_dim, v_dim, q, k, k_stride, v, v_stride, scale, softcap, scores, out);
}

void AttendHead(Isa isa, int64_t n_kv, int64_t head_dim, const float* q, const float* k,
                int64_t k_stride, const float* v, int64_t v_stride, float scale, float* scores,
                float* out) {
  AttendHead(isa, n_kv, head_dim, head_dim, q, k, k_stride, v, v_stride, scale, 0.0f, scores,
             out);
}

void AttendHead(int64_t n_kv, int64_t head_dim, const float* q, const float* k, int64_t k_stride,
                const float* v, int64_t v_stride, float scale, float* scores, float* out) {
  AttendHead(n_kv, head_dim, head_dim, q, k, k_stride, v, v_stride, scale, 0.0f, scores, out);
}

namespace ops_internal {

const QuantDot* QuantDotFor(GgmlType type, Isa isa) {
  const IsaKernels* table = TableFor(isa);
  if (table == nullptr) return nullptr;
  const QuantDot* dot = type == GgmlType::kQ8_0   ? &table->q8_0_panel
                        : type == GgmlType::kQ4_0 ? &table->q4_0_panel
                                                  : nullptr;
  return dot != nullptr && dot->dot != nullptr ? dot : nullptr;
}

const GemmKernels* GemmFor(GgmlType type, Isa isa) {
  const IsaKernels* table = TableFor(isa);
  if (table == nullptr) return nullptr;
  const GemmKernels* gemm = nullptr;
  switch (type) {
    case GgmlType::kF32:
      gemm = &table->f32_gemm;
      break;
    case GgmlType::kF16:
      gemm = &table->f16_gemm;
      break;
    case GgmlType::kBF16:
      gemm = &table->bf16_gemm;
      break;
    case GgmlType::kQ8_0:
      gemm = &table->q8_0_gemm;
      break;
    case GgmlType::kQ4_0:
      gemm = &table->q4_0_gemm;
      break;
    default:
      return nullptr;
  }
  return gemm->gemm != nullptr ? gemm : nullptr;
}

}  // namespace ops_internal
}  // namespace thermocline
