// SparseFfn: the FFN backend that computes only the neurons that fire. Per token and layer:
// predictor fc2·relu(fc1·xn + b1) + b2 → active set (logit > threshold) → row-sparse gate/up →
// gated activation, neurons with |act| <= the layer's magnitude threshold dropped (0 for the
// ReLU family: exact zeros; CATS/TEAL-style for SwiGLU) → axpy over down_t rows.
// The hybrid seam: a layer's placement (device_neurons) splits the active set into a device part
// and a host part that two executors run concurrently; their outputs are summed. Here the
// "device" executor is a second CPU thread pool; a GPU executor plugs into the same split.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/gpu/gpu_ffn_executor.h"
#include "engine/model/ffn_backend.h"
#include "engine/model/llama_model.h"
#include "engine/model/session.h"
#include "engine/sparse/sparse_ops.h"
#include "engine/util/thread_pool.h"

namespace thermocline {

// What the engine needs per layer (built from a sidecar by offline/sparse_loader.h, or from a
// model that carries predictors).
struct SparseLayerPlan {
  int64_t rank = 0;                     // 0: no predictor, every neuron is a candidate
  OwnedWeight fc1;                      // (rank, n_embd), any type with kernels
  std::vector<float> b1;                // (rank)
  OwnedWeight fc2;                      // (n_ff, rank)
  std::vector<float> b2;                // (n_ff)
  float threshold = 0.0f;               // predicted active iff logit > threshold
  float magnitude_threshold = 0;        // fired iff |act| > this
  std::vector<int32_t> device_neurons;  // the placement's device part (empty: all host)
};

// The plan of a model that carries its predictors (a PowerInfer file: blk.N.fc1/fc2, no
// biases, threshold powerinfer.sparse_threshold); the views point into the model.
// FailedPrecondition when it carries none.
absl::StatusOr<std::vector<SparseLayerPlan>> SparsePlanFromModel(const LlamaModel& model);

struct SparseFfnOptions {
  bool oracle = false;         // exact active set from dense gate/up instead of the predictor
  bool split = false;          // run device_neurons on a second executor, concurrently
  int device_threads = 1;      // threads of that executor
  bool dense_prefill = false;  // n_tokens > 1 through Session::DenseFfn (needs set_session)
  // The device part on the GPU (engine/gpu/gpu_ffn_executor.h) under a cap of gpu_memory
  // bytes. Without a CUDA device the device part stays on the CPU (gpu_status() says why).
  bool gpu = false;
  uint64_t gpu_memory = ~uint64_t{0};
};

struct SparseFfnStats {
  int64_t layer_tokens = 0;  // (token, layer) pairs computed sparsely
  double predicted = 0;      // Σ predicted-active neurons
  double fired = 0;          // Σ neurons with a nonzero activation after thresholds
  double predictor_s = 0;    // time in predictors
  double total_s = 0;        // time in Forward
};

class SparseFfn : public FfnBackend {
 public:
  // Builds down_t for every layer (once; a PowerInfer file's own ffn_down_t is used as it is).
  // pool: the host executor, shared with the session.
  static absl::StatusOr<std::unique_ptr<SparseFfn>> Create(const LlamaModel& model,
                                                           std::vector<SparseLayerPlan> plan,
                                                           ThreadPool* pool,
                                                           const SparseFfnOptions& options);
  ~SparseFfn() override;

  void Forward(int layer, const float* x, const float* xn, int64_t n_tokens, float* out) override;
  // The session whose DenseFfn serves prefill when options.dense_prefill.
  void set_session(Session* session) { session_ = session; }

  const SparseFfnStats& stats() const { return stats_; }
  void ResetStats() { stats_ = {}; }
  const SparseFfnOptions& options() const { return options_; }
  // OK when the device part runs on the GPU; else why not (options.gpu unset, no device).
  const absl::Status& gpu_status() const { return gpu_status_; }
  const std::vector<SparseLayerPlan>& plan() const { return plan_; }
  // Weight bytes one decode token reads, whole model (attention, FFN, output head): dense, and
  // sparse at the mean active counts of stats() (predictors included).
  double DenseBytesPerToken() const;
  double SparseBytesPerToken() const;
  double PredictorBytesPerToken() const;

 private:
  struct Executor;
  SparseFfn(const LlamaModel& model, std::vector<SparseLayerPlan> plan, ThreadPool* pool,
            const SparseFfnOptions& options);
  void ForwardToken(int layer, const float* xn, float* out);
  // One executor's share: idx (n) active neurons; act given (oracle) or computed from gate/up.
  void RunPart(int layer, Executor& e, int64_t n, bool have_act);
  // Uploads the device part to the GPU (options.gpu); no device leaves it on the CPU.
  absl::Status StartGpu();

  const LlamaModel& model_;
  std::vector<SparseLayerPlan> plan_;
  std::vector<OwnedWeight> down_t_;              // per layer (n_ff, n_embd)
  std::vector<OwnedWeight> fc2_t_;               // per layer (rank, n_ff): the predictor's fc2ᵀ
  std::vector<std::vector<uint8_t>> on_device_;  // per layer (n_ff) 1: device part
  ThreadPool* pool_;
  SparseFfnOptions options_;
  Session* session_ = nullptr;
  std::unique_ptr<ThreadPool> device_pool_;
  std::unique_ptr<ThreadPool> dispatch_pool_;  // 2 threads: host part, device part
  std::unique_ptr<Executor> host_, device_;
  std::unique_ptr<gpu::GpuFfnExecutor> gpu_;
  absl::Status gpu_status_ = absl::FailedPreconditionError("GPU not requested");

  // Shared per-token buffers, sized at construction.
  const Isa isa_ = BestIsa();
  std::vector<uint8_t> x_gate_, x_up_;  // xn prepared for gate's / up's row dots
  std::vector<float> hidden_;           // (max rank)
  std::vector<float> logits_;           // (n_ff)
  std::vector<int32_t> rank_ids_;       // 0 .. max rank - 1
  SparseScratch predictor_scratch_;
  std::vector<float> dense_gate_, dense_up_;  // (n_ff), oracle
  MatMulScratch matmul_scratch_;
  SparseFfnStats stats_;
};

}  // namespace thermocline
