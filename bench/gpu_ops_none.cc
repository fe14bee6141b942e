// GpuOps in a build without the CUDA backend: no device, so Create says so.
#include "bench/gpu_ops.h"

namespace thermocline::gpu {

absl::StatusOr<std::unique_ptr<GpuOps>> GpuOps::Create(uint64_t memory_cap, int device) {
  return absl::UnavailableError(
      "no CUDA device: this build has no CUDA backend (rebuild with the CUDA toolkit installed "
      "and -DTHERMOCLINE_CUDA=ON)");
}

}  // namespace thermocline::gpu
