// CUDA error handling and type mapping shared by the host code of engine/cuda/. Internal.
#pragma once

#include <cuda_runtime.h>

#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/cuda/cuda_kernels.h"
#include "engine/gpu/queue.h"
#include "engine/ops/ggml_types.h"
#include "engine/ops/matmul.h"
#include "engine/util/status_macros.h"

namespace thermocline::cuda {

// OK, or an InternalError naming `what` and CUDA's message (the sticky error state cleared).
absl::Status CudaStatus(cudaError_t e, std::string_view what);

#define TC_CUDA_RETURN_IF_ERROR(expr, what)                                       \
  do {                                                                            \
    if (absl::Status tc_status = ::thermocline::cuda::CudaStatus((expr), (what)); \
        !tc_status.ok()) {                                                        \
      return tc_status;                                                           \
    }                                                                             \
  } while (0)

// A session's queue on CUDA: one stream on one device (gpu::CreateCudaQueue makes it).
class CudaQueue : public gpu::Queue {
 public:
  CudaQueue(int device, cudaStream_t stream) : device_(device), stream_(stream) {}
  ~CudaQueue() override;
  int device() const { return device_; }
  cudaStream_t stream() const { return stream_; }

 private:
  int device_;
  cudaStream_t stream_;
};
// The stream of a CudaQueue; nullptr for no queue.
cudaStream_t StreamOf(gpu::Queue* queue);

// The kernel type of a weight, or InvalidArgumentError for a type without CUDA kernels or a
// row length its blocks do not divide.
absl::StatusOr<KType> KernelType(const WeightView& w);

}  // namespace thermocline::cuda
