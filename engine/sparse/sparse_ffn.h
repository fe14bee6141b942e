// SparseFfn: the FFN backend that computes only the neurons that fire. Per token and layer:
// predictor (engine/sparse/predictor.h) → active set (logit > threshold) → row-sparse gate/up →
// gated activation, neurons with |act| <= the layer's magnitude threshold dropped (0 for the
// ReLU family: exact zeros; TEAL-style for SwiGLU) → axpy over down_t rows. A gate-first layer
// (SparseMethod::kGateFirst, CATS-style, for SwiGLU) has no predictor: every gate row, then up
// and down rows only of the neurons whose |act(gate)| passes its gate threshold.
// The hybrid seam: a layer's placement (device_neurons) splits the active set into a device part
// and a host part that two executors run concurrently; their outputs are summed. Here the
// "device" executor is a second CPU thread pool; a GPU executor plugs into the same split.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/gpu/device.h"
#include "engine/gpu/gpu_ffn_executor.h"
#include "engine/model/ffn_backend.h"
#include "engine/model/llama_model.h"
#include "engine/model/session.h"
#include "engine/sparse/column_sparse.h"
#include "engine/sparse/predictor.h"
#include "engine/sparse/sparse_ops.h"
#include "engine/sparse/sparse_plan.h"
#include "engine/util/thread_pool.h"

namespace thermocline {

// What the sparse FFN reads, built once per model and plan and shared read-only by every
// SparseFfn over them (a daemon's slots). Per layer the FFN rows are copies in firing order,
// the profile's hottest neurons first, so that the rows that fire on most tokens are read as
// one stream rather than scattered; the copies are on huge pages (engine/util/huge_pages.h),
// where scattered rows cost no TLB miss each. Slot s holds neuron neuron_of[s]: active sets,
// predictor logits and the device part are all in slot order, the device part's neurons first. Gate
// and up rows of a neuron are interleaved when they share a type. The copies replace the
// model's FFN: prefill reads them too (SparseFfn::Forward), and the file's pages of gate, up and
// down are released once copied (GgufFile::ReleasePages), so a sparse model holds its FFN once.
// An input-sparse layer (SparseMethod::kInputSparse) instead holds transposed copies of q, k, v,
// gate, up and down beside the model's matrices, which its prefill reads.
// The type of an input-sparse layer's transposed copy of w: DownTType's, but Q8_0 for Q4_0
// (Q4_0 requantized along the other axis in every projection costs too much quality).
GgmlType InputSparseTType(const WeightView& w);

class SparseWeights {
 public:
  struct Layer {
    std::vector<int32_t> neuron_of;  // (n_ff) slot → neuron
    // (n_ff, n_embd) each, rows in slot order, over the copies; down_t: down's columns as rows.
    // A neuron's gate, up and down_t rows side by side (gate_rows holds all three), or, in
    // gate-first layers (gate read whole, as one stream), the three apart.
    WeightView gate, up, down_t;
    OwnedWeight gate_rows, up_rows, down_t_rows;
    OwnedWeight fc2_t;              // (rank, n_ff) the predictor's fc2ᵀ, columns in slot order
    std::vector<float> b2;          // (n_ff) slot order
    std::vector<float> gate_scale;  // (n_ff) slot order, gate-first layers (empty: none)
    int64_t n_device = 0;           // the placement's device part: slots [0, n_device)
    // Input-sparse layers: q, k, v, gate, up and down laid out for the column-sparse mat-vec
    // (column_sparse.h). Such a layer keeps the model's order (slot s is neuron s), has no
    // device part, no down_t and no gate/up row copies (gate and up view the model's matrices):
    // its prefill is the session's dense FFN, and its file pages stay mapped. q, k and v are
    // one layout, stacked (qkv_c: q's outputs, then k's, then v's) where they share a type and
    // the integer form takes them; else three (q_c, k_c, v_c).
    ColumnWeight qkv_c, q_c, k_c, v_c, gate_c, up_c, down_c;
  };

  // Checks the plan against the model and builds every layer's copies over `pool`.
  static absl::StatusOr<std::shared_ptr<const SparseWeights>> Build(
      const LlamaModel& model, std::vector<SparseLayerPlan> plan, ThreadPool& pool);

  const LlamaModel& model() const { return model_; }
  const std::vector<SparseLayerPlan>& plan() const { return plan_; }
  const Layer& layer(int l) const { return layers_[l]; }
  // Bytes of RAM the copies take.
  uint64_t bytes() const;
  // Whether layer l is input-sparse.
  bool input_sparse(int l) const { return plan_[l].method == SparseMethod::kInputSparse; }
  // Bytes of the model file's mapped FFN pages released after the copies were made: RAM the
  // model no longer holds while nothing else reads them.
  uint64_t released_file_bytes() const { return released_file_bytes_; }

 private:
  SparseWeights(const LlamaModel& model, std::vector<SparseLayerPlan> plan)
      : model_(model), plan_(std::move(plan)) {}
  const LlamaModel& model_;
  std::vector<SparseLayerPlan> plan_;
  std::vector<Layer> layers_;
  uint64_t released_file_bytes_ = 0;
};

// The input-sparse layers of `weights` as whole GPU layers take them (gpu_layers.h): empty
// without any, else (n_layer), each input-sparse layer's layouts and thresholds. The layouts
// are weights'.
std::vector<gpu::InputSparseLayer> DeviceInputSparse(const SparseWeights& weights);
// Its gate-first layers likewise: each one's gate, up and down_t copies (slot order), gate
// scale and thresholds. The views are weights'.
std::vector<gpu::GateFirstLayer> DeviceGateFirst(const SparseWeights& weights);

struct SparseFfnOptions {
  bool oracle = false;  // exact active set from dense gate/up instead of the predictor
  // n_tokens > 1 (up to max_batch) computed exactly (every neuron) over the copies: gate and up
  // as matrix products, down as an axpy over down_t (SparseAxpyTokens); else token by token
  // through the predictor like decode.
  bool dense_prefill = false;
  int64_t max_batch = 1;
  // The device part (the plan's device neurons, slots [0, n_device)) on `device`
  // (engine/gpu/device.h; nullptr: CUDA) under a cap of gpu_memory bytes, or in gpu_budget when
  // given (shared with the engine's other device parts), on gpu_queue when given (the session's
  // one queue, shared with its GPU layers). Without a device the device part stays on the CPU
  // (gpu_status() says why).
  bool gpu = false;
  uint64_t gpu_memory = ~uint64_t{0};
  gpu::MemoryBudget* gpu_budget = nullptr;
  const gpu::Device* device = nullptr;
  gpu::Queue* gpu_queue = nullptr;
};

struct SparseFfnStats {
  int64_t layer_tokens = 0;  // (token, layer) pairs computed sparsely
  double predicted = 0;      // Σ predicted-active neurons (gate-first: every neuron)
  double up_rows = 0;        // Σ up rows read on the host's fused path
  double fired = 0;          // Σ neurons with a nonzero activation after thresholds
  double predictor_s = 0;    // time in predictors
  double total_s = 0;        // time in Forward
  // Input-sparse layers (not counted above): (token, layer) pairs of q/k/v and of the FFN
  // computed column-sparse, Σ the input entries kept for each (of n_embd), and Σ the neurons
  // whose activation passed to down.
  int64_t attn_in_tokens = 0, ffn_in_tokens = 0;
  double attn_in_kept = 0, ffn_in_kept = 0, ffn_in_fired = 0;
  // Per layer, with a device part: seconds of the host's part and seconds waiting for the
  // device's (Wait) after the host's was done; and the (token) calls they add up.
  std::vector<double> layer_host_s, layer_wait_s;
  std::vector<int64_t> layer_calls;
};

// Sees the rows the fused decode path (no device part, no oracle) reads, for benchmarks
// (bench/sparse_read_floor.h replays them). OnLayer comes once per layer and token,
// before its chunks; OnChunk then from the pool's threads, concurrently, once per chunk of slots:
// the slots whose gate rows were read (predicted), whose up rows were (up: those whose gate
// fired, for the ReLU family; else the predicted), and whose down_t rows were (fired).
// Input-sparse layers call OnColumns instead, on the calling thread, per token: the inputs
// whose rows of the q/k/v layouts were read (kQkv, first), of gate's and up's (kGateUp), then
// the neurons whose rows of down's were (kDown), each list ascending.
enum class ColumnReads : uint8_t { kQkv, kGateUp, kDown };
class ActiveSetObserver {
 public:
  virtual ~ActiveSetObserver() = default;
  virtual void OnLayer(int layer) = 0;
  virtual void OnChunk(int layer, absl::Span<const int32_t> predicted, absl::Span<const int32_t> up,
                       absl::Span<const int32_t> fired) = 0;
  virtual void OnColumns(int /*layer*/, ColumnReads /*which*/, absl::Span<const int32_t> /*kept*/) {
  }
};

class SparseFfn : public FfnBackend {
 public:
  // SparseWeights::Build, then the FFN over them. pool: the host executor, shared with the
  // session.
  static absl::StatusOr<std::unique_ptr<SparseFfn>> Create(const LlamaModel& model,
                                                           std::vector<SparseLayerPlan> plan,
                                                           ThreadPool* pool,
                                                           const SparseFfnOptions& options);
  // Over weights another SparseFfn may share.
  static absl::StatusOr<std::unique_ptr<SparseFfn>> Create(
      std::shared_ptr<const SparseWeights> weights, ThreadPool* pool,
      const SparseFfnOptions& options);
  ~SparseFfn() override;

  // Per token: with a device part, the device predicts and computes its slots while the pool
  // takes the host's slots through the fused path, and the two partial sums are added.
  void Forward(int layer, const float* x, const float* xn, int64_t n_tokens, float* out) override;
  // The host's slots of a hybrid layer whose device predicted them (`active`, ascending, all
  // >= the device part): the fused path over that list, no predictor. Oracle plans compute the
  // exact set themselves and ignore the list.
  absl::Status ForwardListed(int layer, const float* xn, const int32_t* active, int64_t n_active,
                             float* out) override;
  // Input-sparse layers: a prefill batch (with options.dense_prefill) is left to the session's
  // dense FFN; decode (and every token without dense_prefill) is column-sparse here, q/k/v too.
  bool TakesFfn(int layer, int64_t n_tokens) const override;
  bool ProjectQkv(int layer, const float* xn, int64_t n_tokens, float* q, float* k,
                  float* v) override;
  // Not owned; nullptr (the default) to stop. Costs a copy of each chunk's slots while set.
  void set_active_set_observer(ActiveSetObserver* observer) { observer_ = observer; }

  const SparseFfnStats& stats() const { return stats_; }
  void ResetStats();
  const SparseFfnOptions& options() const { return options_; }
  // OK when the device part runs on the GPU; else why not (options.gpu unset, no device, a
  // failed launch).
  const absl::Status& gpu_status() const { return gpu_status_; }
  // The device part's executor (GPU layers of the same session drive it in resident mode);
  // null when the device part runs on the CPU. It lives as long as this SparseFfn.
  gpu::GpuFfnExecutor* gpu_executor() const { return gpu_.get(); }
  // Device bytes the GPU part holds (weights and scratch, within options.gpu_memory); 0 when
  // it does not run on the GPU.
  uint64_t gpu_device_bytes() const { return gpu_ != nullptr ? gpu_->device_bytes() : 0; }
  const std::vector<SparseLayerPlan>& plan() const { return weights_->plan(); }
  const std::shared_ptr<const SparseWeights>& weights() const { return weights_; }
  // Weight bytes one decode token reads, whole model (attention, FFN, output head): dense, and
  // sparse at the mean active counts of stats() (predictors included).
  double DenseBytesPerToken() const;
  double SparseBytesPerToken() const;
  double PredictorBytesPerToken() const;
  // The part of both that every token reads whole: attention and the output head.
  double NonFfnBytesPerToken() const;

 private:
  struct Executor;
  // One thread's share of a layer on the fused path: the chunks of slots it claimed, from
  // predictor logits to its partial down sum.
  struct Lane {
    std::vector<int32_t> idx;                      // (n_ff) active slots of the chunk at hand
    std::vector<float> gate;                       // (n_ff) compact: gate, then the activation
    std::vector<float> up;                         // (n_ff)
    std::vector<int32_t> seen_predicted, seen_up;  // (n_ff) for observer_: idx before compaction
    ColumnInput kept_in;   // input-sparse: this thread's share of the kept inputs (ColumnSplit)
    ColumnInput fired_in;  // and of down's inputs, its slice of the neurons that fire
    int64_t predicted = 0, up_rows = 0, fired = 0;
    double predictor_s = 0;
  };
  // Chunks of one layer's slots [first, n_ff) that the lanes claim.
  using ChunkBounds = std::vector<int64_t>;
  SparseFfn(std::shared_ptr<const SparseWeights> weights, ThreadPool* pool,
            const SparseFfnOptions& options);
  // Chunk bounds of every layer over its host slots (all slots, or those after the device
  // part).
  std::vector<ChunkBounds> PlanChunks(bool after_device_part) const;
  void ForwardToken(int layer, const float* xn, float* out);
  // An input-sparse layer's FFN of one token: the entries of xn with |x_i| > ffn_in_threshold
  // select columns of gate and up, the pool's threads each taking a share of them through every
  // neuron, then each a slice of the neurons through the activation and their down columns
  // into their own sums.
  void ForwardTokenInputSparse(int layer, const float* xn, float* out);
  // Part `thread` of a column-sparse product over the m kept inputs in in_idx_, in_val_: its
  // share of them (ColumnSplit) into its lane's kept_in, and its sums, n zeroed floats.
  float* ShareKeptInputs(int thread, int64_t m, int64_t n);
  // out[0, i1 − i0) = Σ over threads, in thread order, of split_sums_[i0, i1).
  void AddThreadSums(int64_t i0, int64_t i1, float* out) const;
  // The entries of x: (n) with |x_i| > threshold into in_idx_, in_val_; returns how many.
  int64_t KeepInputs(const float* x, int64_t n, float threshold);
  // options.dense_prefill: n tokens (<= max_batch), every neuron, over the copies.
  void Prefill(int layer, const float* xn, int64_t n, float* out);
  // The oracle: dense gate/up, the exact active set split between the host and the device
  // (host_only: the host's slots alone, the device computing its own in resident mode).
  void ForwardTokenOracle(int layer, const float* xn, float* out, bool host_only);
  // Whether the device part runs on the device (it did not fail).
  bool device_part() const { return gpu_ != nullptr && !gpu_failed_; }
  // The fused path: one hand-off to the pool per layer, the threads claiming chunks of the slots
  // (of equal expected work by the profile's firing counts) and taking each through predictor
  // (or the listed slots), gate, up and down into their own sums, which are added at the end.
  void ForwardTokenFused(int layer, const float* xn, float* out,
                         const std::vector<ChunkBounds>& chunks, const int32_t* listed,
                         int64_t n_listed);
  void RunLane(int layer, int lane, const ChunkBounds& bounds);
  // Slots [begin, end) of `layer` into lane's counts and the chunk's partial output `out`
  // (n_embd, zeroed).
  void RunChunk(int layer, Lane& lane, int64_t begin, int64_t end, float* out, bool time_it);
  // One executor's share (oracle): idx (n) active slots with their activations.
  void RunPart(int layer, Executor& e, int64_t n);
  // Creates the device part's executor (options.gpu); no device leaves it on the CPU.
  absl::Status StartGpu();
  // A failed device call: the device part runs on the CPU from now on.
  void LoseGpu(const absl::Status& why);

  std::shared_ptr<const SparseWeights> weights_;
  const LlamaModel& model_;
  ThreadPool* pool_;
  SparseFfnOptions options_;
  ActiveSetObserver* observer_ = nullptr;
  std::unique_ptr<Executor> host_, device_;  // oracle
  std::vector<Lane> lanes_;                  // (pool size) fused path
  std::vector<ChunkBounds> all_chunks_;      // per layer, over all slots
  std::vector<ChunkBounds> host_chunks_;     // per layer, over the slots after the device part
  std::atomic<int> next_chunk_{0};           // the next chunk a lane claims
  // (most chunks of a layer × n_embd): each chunk's partial output, summed in chunk order after
  // the lanes, so that a token's output does not depend on which lane took which chunk.
  std::vector<float> chunk_out_;
  const int32_t* listed_ = nullptr;  // ForwardListed: the host's active slots
  int64_t n_listed_ = 0;
  std::vector<PredictorView> predictors_;  // per layer (engine/sparse/predictor.h)
  std::vector<int32_t> hidden_idx_;        // predictor hidden units that are > 0
  std::vector<float> hidden_val_;          // and their values
  PredictorHidden hidden_nz_;              // over the two above
  std::unique_ptr<gpu::GpuFfnExecutor> gpu_;
  bool gpu_failed_ = false;
  absl::Status gpu_status_ = absl::FailedPreconditionError("GPU not requested");

  // Shared per-token buffers, sized at construction.
  const Isa isa_ = BestIsa();
  std::vector<uint8_t> x_gate_, x_up_;            // xn prepared for gate's / up's row dots
  std::vector<float> hidden_;                     // (max rank) fc1 · xn
  std::vector<float> logits_;                     // (n_ff)
  std::vector<float> device_out_;                 // (n_embd) the device part's partial sum
  std::vector<float> dense_gate_, dense_up_;      // (n_ff), oracle
  std::vector<float> prefill_gate_, prefill_up_;  // (max_batch, n_ff) with dense_prefill
  std::vector<int32_t> in_idx_;                   // (n_embd) input-sparse: entries kept
  std::vector<float> in_val_;                     // (n_embd) and their values
  // Input-sparse: per thread, its sums over its share of the kept inputs (gate | up, or q | k | v).
  std::vector<float> split_sums_;  // (pool size × split_stride_)
  int64_t split_stride_ = 0;
  AxpyTokensScratch prefill_axpy_;
  MatMulScratch matmul_scratch_;
  SparseFfnStats stats_;
};

}  // namespace thermocline
