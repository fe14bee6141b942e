// The GPU entry points of a build without the CUDA backend (THERMOCLINE_CUDA off): every one
// reports that there is no CUDA device, so callers fall back to the CPU.
#include "engine/gpu/gpu_backend.h"
#include "engine/gpu/gpu_ffn_executor.h"
#include "engine/gpu/gpu_layers.h"

namespace thermocline::gpu {

namespace {
absl::Status NoCuda() {
  return absl::UnavailableError(
      "no CUDA device: this build has no CUDA backend (rebuild with the CUDA toolkit installed "
      "and -DTHERMOCLINE_CUDA=ON)");
}
}  // namespace

bool CudaCompiledIn() { return false; }
absl::StatusOr<DeviceInfo> Probe(int index) { return NoCuda(); }
bool DeviceAvailable() { return false; }
absl::StatusOr<std::unique_ptr<Queue>> CreateCudaQueue(int index) { return NoCuda(); }
bool TypeSupported(GgmlType type) { return false; }
GraphCounts CudaGraphCounts() { return {}; }

absl::StatusOr<std::unique_ptr<GpuFfnExecutor>> CreateGpuFfnExecutor(const GpuFfnSpec& spec) {
  return NoCuda();
}

absl::StatusOr<std::unique_ptr<GpuLayers>> CreateGpuLayers(const GpuLayersSpec& spec) {
  return NoCuda();
}

}  // namespace thermocline::gpu
