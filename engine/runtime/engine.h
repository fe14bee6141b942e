// The engine's front door. An Engine is built once per loaded model from the model, an optional
// sparse plan (engine/sparse/sparse_plan.h) and options (context, batch, GPU memory cap, GPU
// layers). It owns what the model's sessions share: the sparse FFN's copies of the weights, the
// plan of where each part runs on the device, and the one device memory budget every session's
// device parts are reserved in. NewSession hands out an EngineSession: a Session wired to its
// sparse FFN (CPU part and device part) and its GPU layers, ready to decode. `serve`, `generate`,
// `perplexity`, `bench` and the profiler all build their sessions here, so what the daemon
// serves is what the benchmarks measure.
//
// Where parts run (EngineOptions):
//   no GPU option           everything on the CPU;
//   gpu_layers N | auto     the first N whole layers on the device (dense, as llama.cpp's -ngl;
//                           auto: as many as fit), the output head too when all of them are; a
//                           sparse plan then runs the FFN of the CPU layers;
//   gpu_memory with a plan  the hybrid placement: the plan's attention layers (and head) on the
//                           device, the FFN split between the device's hot neurons and the CPU's
//                           cold ones, under the cap;
//   gpu_memory, dense       as gpu_layers auto under the cap;
//   gpu_memory, experts     a mixture of experts with an expert placement: the placement's
//                           experts on the device, the rest, the router and attention on the
//                           CPU (engine/sparse/moe_ffn.h).
// Without a usable device, placement().note says why and everything runs on the CPU, with the
// same tokens.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/gpu/device.h"
#include "engine/gpu/gpu_layers.h"
#include "engine/gpu/gpu_memory.h"
#include "engine/model/llama_model.h"
#include "engine/model/packed_weights.h"
#include "engine/model/session.h"
#include "engine/sparse/moe_ffn.h"
#include "engine/sparse/sparse_ffn.h"
#include "engine/sparse/sparse_plan.h"
#include "engine/util/thread_pool.h"

namespace thermocline {

// EngineOptions::gpu_layers when whole layers are not asked for.
constexpr int64_t kNoGpuLayers = -2;

struct EngineOptions {
  int64_t n_ctx = 0;       // KV cache length of each session; 0: the model's training context
  int64_t max_batch = 64;  // tokens per forward pass during prefill
  // Each session's KV cache on the CPU (session.h): F16 as llama.cpp's; F32 the reference.
  KvType kv_type = KvType::kF16;
  // Sparse FFN: prompts of more than one token through the dense FFN. false: every token through
  // the sparse FFN (what perplexity measures).
  bool dense_prefill = true;
  // Device memory the engine may use, in bytes; 0: not asked for (with gpu_layers: the
  // device's free memory less kDeviceReserveBytes).
  uint64_t gpu_memory = 0;
  // Whole layers on the device: kNoGpuLayers, gpu::kAutoLayers, or a count.
  int64_t gpu_layers = kNoGpuLayers;
  int device_index = 0;
  const gpu::Device* device = nullptr;  // nullptr: the CUDA backend (gpu::CudaDevice())
  // A mixture of experts with a plan: every expert of every token computed on the host (those
  // not routed to weighted 0), dense over the file's weights, the cost of the mixture as one
  // dense FFN. bench's reference only. Otherwise a ReLU-family mixture's host experts compute
  // only their firing neurons (engine/sparse/moe_ffn.h).
  bool moe_all_experts = false;
  // Re-lay the matrices that only the dense CPU path reads (attention and dense FFN of the CPU's
  // layers, the output head) once at load for its decode kernels: Q4_0 and Q2_K to Q6_K in row
  // groups, the other types copied onto huge pages (PackedWeights), replacing the file's pages.
  // false: the file's mapped rows (A/B benchmarks, tests).
  bool repack = true;

  bool gpu_requested() const { return gpu_memory > 0 || gpu_layers != kNoGpuLayers; }
};

// Device memory left free when the engine sizes its cap from the device's free memory: the CUDA
// context, cuBLAS's workspace and the allocator's slack.
constexpr uint64_t kDeviceReserveBytes = uint64_t{512} << 20;

// Where a model's parts run.
struct EnginePlacement {
  bool gpu_requested = false;
  std::string device;      // the device's name; "" when everything runs on the CPU
  std::string note;        // why less than asked for runs on the device; "" otherwise
  uint64_t gpu_cap = 0;    // device bytes the engine may use (0: none)
  uint64_t gpu_bytes = 0;  // device bytes one session holds
  int64_t n_layer = 0;
  int64_t gpu_layers = 0;               // whole layers on the device (attention and dense FFN)
  int64_t gpu_input_sparse_layers = 0;  // of those, layers that run input-sparse there
  int64_t gpu_gate_first_layers = 0;    // and those that run their FFN gate-first there
  int64_t attention_gpu_layers = 0;     // hybrid layers: attention on the device, the FFN split
  bool output_gpu = false;              // the output norm and head on the device
  int64_t gpu_neurons = 0;              // FFN neurons computed on the device, all layers
  int64_t ffn_neurons = 0;              // all FFN neurons, all layers
  int64_t gpu_experts = 0;              // a mixture of experts: experts on the device, all layers
  int64_t experts = 0;                  // all experts, all layers
  bool sparse = false;
  bool oracle = false;
  SparsePlan::Source sparse_source = SparsePlan::Source::kSidecar;  // when sparse
  std::string sparse_method;  // when sparse: SparseMethodsOf the plan's layers
};

// One line: where the parts run ("all on the CPU", "3/22 whole layers on NVIDIA ...", ...).
std::string DescribePlacement(const EnginePlacement& p);

class EngineSession;

class Engine : public std::enable_shared_from_this<Engine> {
 public:
  // plan: std::nullopt for the dense FFN. build_pool: the threads that build the sparse copies
  // (once, here). InvalidArgument for options or a plan the model cannot take; a missing device
  // is not an error (placement().note says so).
  static absl::StatusOr<std::shared_ptr<const Engine>> Create(const LlamaModel& model,
                                                              std::optional<SparsePlan> plan,
                                                              const EngineOptions& options,
                                                              ThreadPool& build_pool);
  ~Engine();

  // A session on `pool` (its threads, which may be shared with other sessions used from the
  // same thread). Its device parts are reserved in the engine's budget; a session that finds
  // the budget spent by others runs on the CPU (its placement() says so). Thread-safe.
  absl::StatusOr<std::unique_ptr<EngineSession>> NewSession(ThreadPool* pool) const;

  const LlamaModel& model() const { return model_; }
  const EngineOptions& options() const { return options_; }
  int64_t n_ctx() const { return n_ctx_; }
  // null: dense. Its `layers` are empty: they moved into sparse_weights()->plan().
  const SparsePlan* sparse_plan() const { return plan_ ? &*plan_ : nullptr; }
  const std::shared_ptr<const SparseWeights>& sparse_weights() const { return weights_; }
  // A mixture of experts with a plan: the expert placement and its shared copies; else null.
  const std::shared_ptr<const ExpertWeights>& expert_weights() const { return experts_; }
  // Where the parts run: the plan, as the first session that reached the device got it.
  // Thread-safe.
  EnginePlacement placement() const;
  // The dense path's re-laid matrices (EngineOptions::repack); null when none.
  const std::shared_ptr<const PackedWeights>& packed_weights() const { return packed_; }
  // RAM the engine holds beyond the model's mapped file: the sparse copies and the re-laid
  // dense matrices.
  uint64_t host_bytes() const {
    return (weights_ != nullptr ? weights_->bytes() : 0) +
           (experts_ != nullptr ? experts_->bytes() : 0) +
           (packed_ != nullptr ? packed_->bytes() : 0);
  }
  // Of the model's mapped file, the pages those copies replaced (released once copied:
  // SparseWeights, ExpertWeights, PackedWeights).
  uint64_t released_file_bytes() const {
    return (weights_ != nullptr ? weights_->released_file_bytes() : 0) +
           (experts_ != nullptr ? experts_->released_file_bytes() : 0) +
           (packed_ != nullptr ? packed_->released_file_bytes() : 0);
  }

 private:
  friend class EngineSession;
  Engine(const LlamaModel& model, std::optional<SparsePlan> plan, const EngineOptions& options,
         int64_t n_ctx);
  absl::Status PlanDevice();
  // What only the dense CPU path reads once the device plan is known (PackedWeights).
  PackScope DenseCpuScope() const;
  const gpu::Device& device() const;
  SparseFfnOptions FfnOptions(bool on_device, gpu::Queue* queue) const;
  MoeFfnOptions ExpertOptions(bool on_device, gpu::Queue* queue) const;
  absl::Status AttachExperts(EngineSession* s, ThreadPool* pool) const;
  // The device parts of `s` as planned, falling back (attention dropped, then the device) when
  // the budget cannot hold them; what it got in s->placement_.
  absl::Status AttachDevice(EngineSession* s, ThreadPool* pool) const;
  void Realized(const EnginePlacement& p) const;

  const LlamaModel& model_;
  const std::optional<SparsePlan> plan_;
  const EngineOptions options_;
  const int64_t n_ctx_;
  std::shared_ptr<const SparseWeights> weights_;
  std::shared_ptr<const ExpertWeights> experts_;
  std::shared_ptr<const PackedWeights> packed_;

  // The device plan (PlanDevice): whole layers, or the hybrid placement's layers and neurons.
  bool use_device_ = false;
  bool whole_layers_ = false;
  gpu::GpuLayersSpec layers_spec_;             // .layers empty: none
  std::unique_ptr<gpu::MemoryBudget> budget_;  // sessions reserve their device parts in it

  mutable std::mutex mu_;  // guards the two below
  mutable EnginePlacement placement_;
  mutable bool realized_ = false;
};

// One sequence of one engine: a Session with its FFN and layer backends. Not thread-safe: one
// decode loop owns it. Keeps its engine alive.
class EngineSession {
 public:
  ~EngineSession();
  Session& session() { return *session_; }
  const Session& session() const { return *session_; }
  const Engine& engine() const { return *engine_; }
  // The sparse FFN (stats, the active-set observer); null when dense.
  SparseFfn* sparse() { return sparse_.get(); }
  const SparseFfn* sparse() const { return sparse_.get(); }
  // The placed MoE FFN (a mixture of experts with a plan); null otherwise.
  MoeFfn* moe() { return moe_.get(); }
  const MoeFfn* moe() const { return moe_.get(); }
  // Where this session's parts run.
  const EnginePlacement& placement() const { return placement_; }
  // Its whole or hybrid layers on the device; null when none.
  const gpu::GpuLayers* gpu_layers() const { return layers_.get(); }
  // Device bytes this session holds.
  uint64_t device_bytes() const;
  // The profiler's hook on the dense FFN of every CPU layer (nullptr to stop).
  void set_ffn_observer(FfnObserver* observer) { session_->set_ffn_observer(observer); }

 private:
  friend class Engine;
  EngineSession() = default;
  std::shared_ptr<const Engine> engine_;  // first: freed last
  std::unique_ptr<gpu::Queue> queue_;     // the order of its device work; outlives its users
  std::unique_ptr<Session> session_;
  std::unique_ptr<SparseFfn> sparse_;
  std::unique_ptr<MoeFfn> moe_;             // after queue_: its executor runs on it
  std::unique_ptr<gpu::GpuLayers> layers_;  // after sparse_: may call it, freed first
  EnginePlacement placement_;
};

}  // namespace thermocline
