// ISA dispatch: which ISAs this CPU runs (checked once), and the kernel table of each. The
// tables themselves live in kernels_scalar.cc and the per-ISA kernels_*.cc files; the
// weight-type table (type_table.cc) picks each type's kernels out of them.
#include "engine/ops/kernels.h"

#include <cpuid.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "engine/ops/kernels_internal.h"

namespace thermocline {
namespace {

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

void AttendHead(Isa isa, int64_t n_kv, int64_t k_dim, int64_t v_dim, const float* q, const float* k,
                int64_t k_stride, const float* v, int64_t v_stride, float scale, float softcap,
                float* scores, float* out) {
  ops_internal::TableOf(isa).attend(n_kv, k_dim, v_dim, q, k, k_stride, v, v_stride, scale, softcap,
                                    scores, out);
}

void AttendHead(int64_t n_kv, int64_t k_dim, int64_t v_dim, const float* q, const float* k,
                int64_t k_stride, const float* v, int64_t v_stride, float scale, float softcap,
                float* scores, float* out) {
  static const ops_internal::AttendFn attend = ops_internal::TableOf(BestIsa()).attend;
  attend(n_kv, k_dim, v_dim, q, k, k_stride, v, v_stride, scale, softcap, scores, out);
}

void AttendHeadF16(Isa isa, int64_t n_kv, int64_t k_dim, int64_t v_dim, const float* q,
                   const uint16_t* k, int64_t k_stride, const uint16_t* v, int64_t v_stride,
                   float scale, float softcap, bool batched, float* scores, float* out) {
  ops_internal::TableOf(isa).attend_f16(
      n_kv, k_dim, v_dim, 1, q, k_dim, HalfRows::Strided(k, k_stride),
      HalfRows::Strided(v, v_stride), scale, softcap, batched, scores, out, v_dim);
}

void AttendHeadF16(int64_t n_kv, int64_t k_dim, int64_t v_dim, const float* q, const uint16_t* k,
                   int64_t k_stride, const uint16_t* v, int64_t v_stride, float scale,
                   float softcap, bool batched, float* scores, float* out) {
  AttendHeadF16(BestIsa(), n_kv, k_dim, v_dim, q, k, k_stride, v, v_stride, scale, softcap, batched,
                scores, out);
}

void AttendGroupF16(Isa isa, int64_t n_kv, int64_t k_dim, int64_t v_dim, int n_heads,
                    const float* q, int64_t q_stride, const HalfRows& k, const HalfRows& v,
                    float scale, float softcap, bool batched, float* scores, float* out,
                    int64_t out_stride) {
  ops_internal::TableOf(isa).attend_f16(n_kv, k_dim, v_dim, n_heads, q, q_stride, k, v, scale,
                                        softcap, batched, scores, out, out_stride);
}

void AttendGroupF16(int64_t n_kv, int64_t k_dim, int64_t v_dim, int n_heads, const float* q,
                    int64_t q_stride, const HalfRows& k, const HalfRows& v, float scale,
                    float softcap, bool batched, float* scores, float* out, int64_t out_stride) {
  static const ops_internal::AttendF16Fn attend = ops_internal::TableOf(BestIsa()).attend_f16;
  attend(n_kv, k_dim, v_dim, n_heads, q, q_stride, k, v, scale, softcap, batched, scores, out,
         out_stride);
}

void SiluMul(Isa isa, float* gate, const float* up, int64_t n) {
  ops_internal::TableOf(isa).silu_mul(gate, up, n);
}

void SiluMul(float* gate, const float* up, int64_t n) {
  static const auto silu_mul = ops_internal::TableOf(BestIsa()).silu_mul;
  silu_mul(gate, up, n);
}

void AttendHead(Isa isa, int64_t n_kv, int64_t head_dim, const float* q, const float* k,
                int64_t k_stride, const float* v, int64_t v_stride, float scale, float* scores,
                float* out) {
  AttendHead(isa, n_kv, head_dim, head_dim, q, k, k_stride, v, v_stride, scale, 0.0f, scores, out);
}

void AttendHead(int64_t n_kv, int64_t head_dim, const float* q, const float* k, int64_t k_stride,
                const float* v, int64_t v_stride, float scale, float* scores, float* out) {
  AttendHead(n_kv, head_dim, head_dim, q, k, k_stride, v, v_stride, scale, 0.0f, scores, out);
}

namespace ops_internal {

const IsaKernels& TableOf(Isa isa) {
  const std::vector<Isa>& isas = AvailableIsas();
  if (std::find(isas.begin(), isas.end(), isa) == isas.end()) return ScalarKernels();
  switch (isa) {
    case Isa::kScalar:
      return ScalarKernels();
    case Isa::kAvx2:
      return Avx2Kernels();
    case Isa::kAvx512:
      return Avx512Kernels();
    case Isa::kAvx512Vnni:
      return Avx512VnniKernels();
  }
  return ScalarKernels();
}

}  // namespace ops_internal
}  // namespace thermocline
