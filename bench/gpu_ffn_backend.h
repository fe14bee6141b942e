// GpuFfnBackend: the FFN of every layer on the GPU (full offload of the FFN, dense: every neuron
// a device neuron, no predictor), through the hybrid executor (gpu_ffn_executor.h). Plugs into
// Session::set_ffn_backend; the end-to-end check of the GPU FFN path against the CPU's greedy
// tokens uses it. CUDA-free; without a device Create returns UnavailableError.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/gpu/gpu_ffn_executor.h"
#include "engine/model/ffn_backend.h"
#include "engine/model/llama_model.h"
#include "engine/ops/weight_layout.h"
#include "engine/util/thread_pool.h"

namespace thermocline::gpu {

class GpuFfnBackend : public FfnBackend {
 public:
  // Transposes each layer's down (pool) and uploads gate, up and down_t under memory_cap.
  static absl::StatusOr<std::unique_ptr<GpuFfnBackend>> Create(
      const LlamaModel& model, ThreadPool& pool, uint64_t memory_cap = MemoryBudget::kUnlimited);

  // One Launch/Wait per token. Forward cannot return an error: the first one is kept in
  // status() and the output is zero from then on.
  void Forward(int layer, const float* x, const float* xn, int64_t n_tokens, float* out) override;
  const absl::Status& status() const { return status_; }
  uint64_t device_bytes() const { return executor_->device_bytes(); }

 private:
  GpuFfnBackend() = default;
  int64_t n_embd_ = 0;
  std::unique_ptr<GpuFfnExecutor> executor_;
  absl::Status status_;
};

}  // namespace thermocline::gpu
