// The CUDA backend's numbering of weight types (a column of the weight-type table,
// type_table.h): free of CUDA headers, so the table and engine/cuda's kernels share it.
#pragma once

namespace thermocline {

enum class DeviceKernel : int {
  kNone = -1,  // no CUDA kernels for the type
  kF32 = 0,
  kF16,
  kBF16,
  kQ8_0,
  kQ4_0,
  kQ4_1,
  kQ5_0,
  kQ5_1,
  kIQ4_NL,
  kQ2_K,
  kQ3_K,
  kQ4_K,
  kQ5_K,
  kQ6_K,
  kIQ4_XS,
};

// The device kernels of Q8_0 and Q4_0 dot their rows with Q8_0 activations (dp4a), as the CPU
// does; the others read F32 activations (dequantized weights times floats).
constexpr bool DeviceUsesQ8Activations(DeviceKernel k) {
  return k == DeviceKernel::kQ8_0 || k == DeviceKernel::kQ4_0;
}

}  // namespace thermocline
