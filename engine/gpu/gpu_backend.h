// The GPU backend's entry point, free of CUDA headers and compile flags: whether this build has
// the CUDA backend and whether a device is present. One binary serves both cases: without a
// device (or without the CUDA backend) Probe returns an error and the engine runs on the CPU.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "engine/gpu/queue.h"
#include "engine/ops/ggml_types.h"

namespace thermocline::gpu {

struct DeviceInfo {
  int index = 0;
  std::string name;       // e.g. "NVIDIA H200"
  int compute_major = 0;  // compute capability, e.g. 9.0
  int compute_minor = 0;
  uint64_t total_bytes = 0;  // device memory
  uint64_t free_bytes = 0;   // free when probed
  int multiprocessors = 0;
};

// True when this binary was built with the CUDA backend (THERMOCLINE_CUDA).
bool CudaCompiledIn();

// Device `index` if it exists and works. Errors (never a crash):
//   UnavailableError "no CUDA device: ..." when the build has no CUDA backend, no driver is
//   installed, or no device is visible (CUDA_VISIBLE_DEVICES), and NotFoundError for an index
//   past the last device.
absl::StatusOr<DeviceInfo> Probe(int index = 0);

// A CUDA stream on device `index` behind the queue interface (engine/gpu/queue.h).
absl::StatusOr<std::unique_ptr<Queue>> CreateCudaQueue(int index);

// Whether a [cuda] test or benchmark can run here: Probe(0).ok().
bool DeviceAvailable();

// The weight types the CUDA kernels compute (false for every type without the CUDA backend).
bool TypeSupported(GgmlType type);

// Decode steps' CUDA graphs (engine/cuda/cuda_graph.h) in this process so far: captured and
// instantiated, or run as direct launches (THERMOCLINE_CUDA_GRAPHS=0, or a capture the driver
// refused). Zero without the CUDA backend.
struct GraphCounts {
  int64_t captured = 0;
  int64_t direct = 0;
  const char* last_refusal = nullptr;  // CUDA's message for the last refused capture, if any
};
GraphCounts CudaGraphCounts();

}  // namespace thermocline::gpu
