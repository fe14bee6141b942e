// The placed mixture-of-experts FFN: whole experts as the units of the hot/cold placement. The
// placement (a sidecar's, offline/solver/placement.h) puts the experts most often routed to on
// the device; per token and layer the router picks its k experts, those on the device are
// computed there (each expert one layer of the device's FFN executor, engine/gpu/
// gpu_ffn_executor.h, holding all its neurons, no predictor), the others on the host with the
// dense operators, concurrently, and the router-weighted outputs are summed:
//   xn ─► router (host) ─► top-k ─┬─► device experts: Launch ... Wait  ─┐
//                                 └─► host experts: gate, up, act, down ┴─► Σ w_e · expert_e
// On the device the down projection is an axpy over down_t rows that skips exact zeros, so a
// ReLU-family expert computes only its firing neurons there. ExpertWeights holds what sessions
// share (the device experts' down_t); MoeFfn is one session's FFN backend.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/gpu/device.h"
#include "engine/gpu/gpu_ffn_executor.h"
#include "engine/gpu/gpu_memory.h"
#include "engine/model/ffn_backend.h"
#include "engine/model/llama_model.h"
#include "engine/model/session.h"
#include "engine/ops/weight_layout.h"
#include "engine/sparse/sparse_plan.h"
#include "engine/util/thread_pool.h"

namespace thermocline {

// The experts' placement and the device experts' transposed down projections, built once per
// engine and shared read-only by its sessions.
class ExpertWeights {
 public:
  // layers: the plan's (n_layer); their device_experts must be distinct ids < n_expert.
  // FailedPrecondition for a model without experts.
  static absl::StatusOr<std::shared_ptr<const ExpertWeights>> Build(
      const LlamaModel& model, std::vector<SparseLayerPlan> layers, ThreadPool& pool);

  const LlamaModel& model() const { return model_; }
  const std::vector<SparseLayerPlan>& plan() const { return plan_; }
  // Experts on the device, all layers.
  int64_t n_device_experts() const { return static_cast<int64_t>(owner_.size()); }
  // The executor layer of expert `expert` of `layer`, or -1 when it runs on the host.
  int32_t slot(int64_t layer, int64_t expert) const {
    return slot_[layer * model_.hparams().n_expert + expert];
  }
  // The device executor's spec: one executor layer per device expert, in (layer, expert)
  // order; its views point into the model and into this object.
  gpu::GpuFfnSpec DeviceSpec() const;
  // RAM held beyond the model's mapped file (the down_t copies).
  uint64_t bytes() const;

 private:
  explicit ExpertWeights(const LlamaModel& model) : model_(model) {}
  const LlamaModel& model_;
  std::vector<SparseLayerPlan> plan_;
  std::vector<int32_t> slot_;                       // (n_layer, n_expert)
  std::vector<std::pair<int64_t, int64_t>> owner_;  // per slot: (layer, expert)
  std::vector<OwnedWeight> down_t_;                 // per slot: (n_ff_exp, n_embd)
  std::vector<int32_t> all_neurons_;                // 0 .. n_ff_exp - 1
};

struct MoeFfnOptions {
  // Prompts of more than one token through the session's dense MoE FFN.
  bool dense_prefill = true;
  // Every expert of every token on the host, those the router did not pick weighted 0: the cost
  // of running the mixture as one dense FFN (bench's "dense all experts"), the same outputs.
  bool all_experts = false;
  const gpu::Device* device = nullptr;  // nullptr: every expert on the host
  gpu::MemoryBudget* budget = nullptr;  // the engine's; nullptr: gpu_memory of its own
  uint64_t gpu_memory = gpu::MemoryBudget::kUnlimited;
  gpu::Queue* queue = nullptr;
  int device_index = 0;
};

class MoeFfn : public FfnBackend {
 public:
  // With options.device and device experts: the executor, reserved in the budget
  // (ResourceExhausted when they do not fit; a device that is Unavailable leaves every expert
  // on the host, device_status() says why). pool: the host's threads, shared with the session.
  static absl::StatusOr<std::unique_ptr<MoeFfn>> Create(
      std::shared_ptr<const ExpertWeights> weights, ThreadPool* pool, const MoeFfnOptions& options);

  // The session whose dense MoE FFN runs prefill (dense_prefill).
  void set_session(Session* session) { session_ = session; }
  void Forward(int layer, const float* x, const float* xn, int64_t n_tokens, float* out) override;

  bool on_device() const { return executor_ != nullptr && !device_failed_; }
  const absl::Status& device_status() const { return device_status_; }
  uint64_t device_bytes() const { return executor_ ? executor_->device_bytes() : 0; }
  const ExpertWeights& weights() const { return *weights_; }
  // Routed experts computed per place since creation (decode tokens and unbatched prefill).
  int64_t device_expert_calls() const { return device_calls_; }
  int64_t host_expert_calls() const { return host_calls_; }

 private:
  MoeFfn(std::shared_ptr<const ExpertWeights> weights, ThreadPool* pool,
         const MoeFfnOptions& options);
  // out: (n_embd) = the layer's FFN of one token.
  void Token(int layer, const float* xn, float* out);
  // acc += w · expert e of `layer` on xn, on the host.
  void HostExpert(int layer, int64_t e, const float* xn, float w, float* acc);

  std::shared_ptr<const ExpertWeights> weights_;
  const LlamaModel& model_;
  ThreadPool* pool_;
  const MoeFfnOptions options_;
  Session* session_ = nullptr;
  std::unique_ptr<gpu::GpuFfnExecutor> executor_;
  absl::Status device_status_ = absl::FailedPreconditionError("no device requested");
  bool device_failed_ = false;
  int64_t device_calls_ = 0, host_calls_ = 0;

  // Per-token buffers, sized at creation.
  std::vector<float> router_;     // (n_expert)
  std::vector<int32_t> sel_;      // (n_expert_used)
  std::vector<float> sel_w_;      // (n_expert_used)
  std::vector<float> gate_, up_;  // (widest expert)
  std::vector<float> eo_;         // (n_embd) one expert's output
  std::vector<float> dev_out_;    // (n_embd) a device expert's output
  MatMulScratch scratch_;
};

}  // namespace thermocline
