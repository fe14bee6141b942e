// The launch shape of the device's axpy over down_t rows, shared by the CUDA kernel and the
// CUDA-free account of its scratch (device_memory.h). No includes: nvcc compiles it too.
#pragma once

#include <cstdint>

namespace thermocline::gpu {

// The number of partial sums the axpy splits max_active rows into: enough slices to fill a
// large GPU when n_embd is small, each at least 64 rows long, at most 32.
inline int AxpyPartialSplits(int64_t max_active) {
  const int64_t splits = (max_active + 63) / 64;
  return static_cast<int>(splits < 1 ? 1 : (splits > 32 ? 32 : splits));
}

}  // namespace thermocline::gpu
