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

}  // namespace thermocline
