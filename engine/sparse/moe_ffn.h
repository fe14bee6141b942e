// The placed mixture-of-experts FFN: whole experts as the units of the hot/cold placement. The
// placement (a sidecar's, offline/solver/placement.h) puts the experts most often routed to on
// the device; per token and layer the router picks its k experts, those on the device are
// computed there (each expert one layer of the device's FFN executor, engine/gpu/
// gpu_ffn_executor.h, holding all its neurons, no predictor), the others on the host,
// concurrently, and the router-weighted outputs are summed:
//   xn ─► router (host) ─► top-k ─┬─► device experts: Launch ... Wait             ─┐
//                                 └─► host experts: gate, up, act, axpy over down_t ┴─► Σ w_e·y_e
// down_t (down's columns as rows) is copied once per engine for the experts that use it: those
// on the device, and in a ReLU-family model every expert, whose host computation then skips the
// neurons that do not fire, exactly: the gate of every neuron, then up rows and down_t rows of
// those whose gate > 0 only (no predictor). Once copied, the file's mapped pages of those
// experts' down are released (GgufFile::ReleasePages) and nothing reads them again (prefill
// goes over the copies too), so such a model holds its experts once. gate and up are read in
// place from the file. ExpertWeights holds what sessions share; MoeFfn is one session's FFN
// backend.
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
#include "engine/ops/weight_layout.h"
#include "engine/sparse/sparse_ops.h"
#include "engine/sparse/sparse_plan.h"
#include "engine/util/thread_pool.h"

namespace thermocline {

// The experts' placement and the experts' transposed down projections, built once per engine
// and shared read-only by its sessions.
class ExpertWeights {
 public:
  // layers: the plan's (n_layer); their device_experts must be distinct ids < n_expert.
  // sparse_host: a ReLU-family model's host experts compute only their firing neurons (every
  // expert's down_t is copied); false, or another activation (or up rows of a type without
  // row-sparse kernels): host experts are dense over the file's weights and only the device
  // experts' down_t is copied. FailedPrecondition for a model without experts.
  static absl::StatusOr<std::shared_ptr<const ExpertWeights>> Build(
      const LlamaModel& model, std::vector<SparseLayerPlan> layers, ThreadPool& pool,
      bool sparse_host = true);

  const LlamaModel& model() const { return model_; }
  const std::vector<SparseLayerPlan>& plan() const { return plan_; }
  // Experts on the device, all layers.
  int64_t n_device_experts() const { return static_cast<int64_t>(owner_.size()); }
  // The executor layer of expert `expert` of `layer`, or -1 when it runs on the host.
  int32_t slot(int64_t layer, int64_t expert) const {
    return slot_[layer * model_.hparams().n_expert + expert];
  }
  // The copy of expert `expert`'s down transposed, (n_ff_exp, n_embd); nullptr when it has
  // none (its down is read from the file).
  const WeightView* down_t(int64_t layer, int64_t expert) const {
    const OwnedWeight& w = down_t_[layer * model_.hparams().n_expert + expert];
    return w.view.data != nullptr ? &w.view : nullptr;
  }
  // Whether host experts compute only their firing neurons (Build's sparse_host, granted).
  bool sparse_host() const { return sparse_host_; }
  // 0 .. n_ff_exp - 1: the down_t rows of a dense expert.
  const std::vector<int32_t>& all_neurons() const { return all_neurons_; }
  // The device executor's spec: one executor layer per device expert, in (layer, expert)
  // order; its views point into the model and into this object.
  gpu::GpuFfnSpec DeviceSpec() const;
  // RAM held beyond the model's mapped file (the down_t copies).
  uint64_t bytes() const;
  // Bytes of the model file's mapped pages of down released once the copies were made.
  uint64_t released_file_bytes() const { return released_file_bytes_; }

 private:
  explicit ExpertWeights(const LlamaModel& model) : model_(model) {}
  const LlamaModel& model_;
  std::vector<SparseLayerPlan> plan_;
  std::vector<int32_t> slot_;                       // (n_layer, n_expert)
  std::vector<std::pair<int64_t, int64_t>> owner_;  // per slot: (layer, expert)
  std::vector<OwnedWeight> down_t_;                 // (n_layer, n_expert): (n_ff_exp, n_embd)
  std::vector<int32_t> all_neurons_;                // 0 .. n_ff_exp - 1
  bool sparse_host_ = false;
  uint64_t released_file_bytes_ = 0;
};

struct MoeFfnOptions {
  // Prompts of more than one token (up to max_batch) batched expert by expert, each routed
  // expert's weights read once per chunk: gate and up of all its neurons, down over its down_t
  // copy (zero activations skipped) where it has one. false: token by token.
  bool dense_prefill = true;
  int64_t max_batch = 1;  // the session's prefill chunk
  // Every expert of every token on the host, dense over the file's weights, those the router did
  // not pick weighted 0: the cost of running the mixture as one dense FFN (bench's "dense all
  // experts"), the same outputs. bench's reference only: it reads the file's down even where a
  // copy replaced it (the engine builds its ExpertWeights with sparse_host false for it, so only
  // the device experts' pages come back).
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

  void Forward(int layer, const float* x, const float* xn, int64_t n_tokens, float* out) override;

  bool on_device() const { return executor_ != nullptr && !device_failed_; }
  const absl::Status& device_status() const { return device_status_; }
  uint64_t device_bytes() const { return executor_ ? executor_->device_bytes() : 0; }
  const ExpertWeights& weights() const { return *weights_; }
  // Routed experts computed per place since creation (decode tokens and unbatched prefill).
  int64_t device_expert_calls() const { return device_calls_; }
  int64_t host_expert_calls() const { return host_calls_; }
  // Of those host experts' neurons, the ones computed past the gate (sparse_host: the firing
  // ones; else all).
  int64_t host_expert_neurons() const { return host_neurons_; }

 private:
  MoeFfn(std::shared_ptr<const ExpertWeights> weights, ThreadPool* pool,
         const MoeFfnOptions& options);
  // out: (n_embd) = the layer's FFN of one token.
  void Token(int layer, const float* xn, float* out);
  // out: (n, n_embd) = the layer's FFN of n <= max_batch tokens, expert by expert.
  void Prefill(int layer, const float* xn, int64_t n, float* out);
  // acc += w · expert e of `layer` on xn, on the host.
  void HostExpert(int layer, int64_t e, const float* xn, float w, float* acc);
  // acc += w · expert e of `layer` on xn, dense over the file's gate, up and down.
  void FileExpert(int layer, int64_t e, const float* xn, float w, float* acc);
  // out: (n, n_embd) += the shared expert (qwen2moe) of n tokens, scaled by its sigmoid gate.
  void SharedExpert(int layer, const float* xn, int64_t n, float* out);

  std::shared_ptr<const ExpertWeights> weights_;
  const LlamaModel& model_;
  ThreadPool* pool_;
  const MoeFfnOptions options_;
  const Isa isa_ = BestIsa();
  std::unique_ptr<gpu::GpuFfnExecutor> executor_;
  absl::Status device_status_ = absl::FailedPreconditionError("no device requested");
  bool device_failed_ = false;
  int64_t device_calls_ = 0, host_calls_ = 0, host_neurons_ = 0;

  // Buffers sized at creation: one token's, or a prefill chunk's (max_batch rows).
  std::vector<float> router_;     // (max_batch, n_expert)
  std::vector<int32_t> sel_;      // (max_batch, n_expert_used)
  std::vector<float> sel_w_;      // (max_batch, n_expert_used)
  std::vector<int32_t> tok_;      // (max_batch) the chunk's tokens routed to one expert
  std::vector<float> tok_w_;      // (max_batch) their weights
  std::vector<float> xg_;         // (max_batch, n_embd) their inputs
  std::vector<float> gate_, up_;  // (max_batch, widest expert)
  std::vector<float> eo_;         // (max_batch, n_embd) one expert's outputs
  std::vector<float> dev_out_;    // (n_embd) a device expert's output
  std::vector<int32_t> idx_;      // (n_ff_exp) a host expert's firing neurons
  std::vector<uint8_t> x_up_;     // xn prepared for the up rows' dots
  MatMulScratch scratch_;
  SparseScratch sparse_scratch_;
  AxpyTokensScratch axpy_tokens_;
};

}  // namespace thermocline
