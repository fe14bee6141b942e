// A fixed sequence of stream work captured once as a CUDA graph and replayed: one launch where
// a decode step's layer otherwise issues a dozen or more (docs/cuda.md, "Launches"). Internal
// to engine/cuda/.
#pragma once

#include <cuda_runtime.h>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"

namespace thermocline::cuda {

// False when THERMOCLINE_CUDA_GRAPHS is "0": every StreamGraph then runs its work directly (for
// comparing the two, and a way out should a driver refuse capture). Read at each call.
bool GraphsEnabled();

class StreamGraph {
 public:
  StreamGraph() = default;
  StreamGraph(const StreamGraph&) = delete;
  StreamGraph& operator=(const StreamGraph&) = delete;
  StreamGraph(StreamGraph&& other) noexcept : exec_(other.exec_), direct_(other.direct_) {
    other.exec_ = nullptr;
  }
  StreamGraph& operator=(StreamGraph&& other) noexcept;
  ~StreamGraph();

  // Queues `work` on `stream`. work must only queue stream-ordered operations on `stream` (no
  // synchronization, no allocation) with arguments that are the same at every call: device
  // pointers and sizes fixed, anything that changes read from device memory. The first call
  // captures it and instantiates the graph, later calls replay it. When graphs are off, or
  // capture or instantiation fails (then for good), work runs directly instead.
  absl::Status Run(cudaStream_t stream, absl::FunctionRef<absl::Status()> work);

  bool captured() const { return exec_ != nullptr; }

 private:
  cudaGraphExec_t exec_ = nullptr;
  bool direct_ = false;
};

}  // namespace thermocline::cuda
