#include "engine/cuda/cuda_graph.h"

#include <atomic>
#include <cstdlib>
#include <cstring>

#include "engine/cuda/cuda_common.h"
#include "engine/gpu/gpu_backend.h"

namespace thermocline::cuda {
namespace {
std::atomic<int64_t> captured_graphs{0}, direct_graphs{0};
std::atomic<const char*> last_refusal{nullptr};  // CUDA's static error strings
}  // namespace

bool GraphsEnabled() {
  const char* v = std::getenv("THERMOCLINE_CUDA_GRAPHS");
  return v == nullptr || std::strcmp(v, "0") != 0;
}

StreamGraph& StreamGraph::operator=(StreamGraph&& other) noexcept {
  if (this != &other) {
    if (exec_ != nullptr) cudaGraphExecDestroy(exec_);
    exec_ = other.exec_;
    direct_ = other.direct_;
    other.exec_ = nullptr;
  }
  return *this;
}

StreamGraph::~StreamGraph() {
  if (exec_ != nullptr) cudaGraphExecDestroy(exec_);
}

absl::Status StreamGraph::Run(cudaStream_t stream, absl::FunctionRef<absl::Status()> work) {
  if (exec_ == nullptr && !direct_) {
    if (!GraphsEnabled()) {
      direct_ = true;
    } else {
      // Thread-local capture: other threads' CUDA calls (other sessions) neither join this
      // graph nor invalidate it.
      TC_CUDA_RETURN_IF_ERROR(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal),
                              "cudaStreamBeginCapture");
      const absl::Status queued = work();
      cudaGraph_t graph = nullptr;
      const cudaError_t ended = cudaStreamEndCapture(stream, &graph);
      if (!queued.ok()) {
        if (graph != nullptr) cudaGraphDestroy(graph);
        cudaGetLastError();
        return queued;
      }
      cudaError_t e = ended;
      if (e == cudaSuccess && graph != nullptr) e = cudaGraphInstantiate(&exec_, graph, 0);
      if (graph != nullptr) cudaGraphDestroy(graph);
      if (e != cudaSuccess || exec_ == nullptr) {
        // Nothing was queued by the failed capture: run the work directly, now and from now on.
        last_refusal = cudaGetErrorString(e != cudaSuccess ? e : cudaErrorUnknown);
        cudaGetLastError();
        exec_ = nullptr;
        direct_ = true;
      }
    }
    ++(direct_ ? direct_graphs : captured_graphs);
  }
  if (direct_) return work();
  TC_CUDA_RETURN_IF_ERROR(cudaGraphLaunch(exec_, stream), "cudaGraphLaunch");
  return absl::OkStatus();
}

}  // namespace thermocline::cuda

namespace thermocline::gpu {
GraphCounts CudaGraphCounts() {
  return {cuda::captured_graphs.load(), cuda::direct_graphs.load(), cuda::last_refusal.load()};
}
}  // namespace thermocline::gpu
