// The device the engine's front door puts GPU work on, as one interface: probe it, create whole
// layers on it, create the FFN executor of a hybrid layer on it. CudaDevice() is the CUDA
// backend (every call Unavailable in a build or on a machine without one); tests and benchmarks
// pass CPU stand-ins (bench/cpu_device.h) so that the front door's split and merge run on any
// machine. CUDA-free.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "engine/gpu/gpu_backend.h"
#include "engine/gpu/gpu_ffn_executor.h"
#include "engine/gpu/gpu_layers.h"
#include "engine/gpu/queue.h"

namespace thermocline::gpu {

class Device {
 public:
  virtual ~Device() = default;
  // A queue on device `index`: pass it to the specs of one session's layers and FFN executor.
  virtual absl::StatusOr<std::unique_ptr<Queue>> CreateQueue(int index) const = 0;
  // The device's name and free memory, or why there is none (UnavailableError).
  virtual absl::StatusOr<DeviceInfo> Probe(int index) const = 0;
  virtual absl::StatusOr<std::unique_ptr<GpuLayers>> CreateLayers(
      const GpuLayersSpec& spec) const = 0;
  virtual absl::StatusOr<std::unique_ptr<GpuFfnExecutor>> CreateFfnExecutor(
      const GpuFfnSpec& spec) const = 0;
};

// The CUDA backend: Probe, CreateGpuLayers, CreateGpuFfnExecutor. Lives for the process.
const Device& CudaDevice();

}  // namespace thermocline::gpu
