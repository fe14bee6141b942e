// Whole layers on the GPU (engine/model/layer_backend.h), CUDA-free: the -ngl-style dense
// offload (the first N layers on the GPU, the rest on the CPU), full offload with the output
// head, and the hybrid layer (attention on the GPU, the FFN through a host FfnBackend such as
// SparseFfn, whose own GPU executor holds the hot neurons). What a set of GPU layers needs on the
// device is computed here without CUDA (GpuLayersMemory), so how many whole layers fit under a
// cap is decided, and tested, on any machine; the CUDA backend allocates exactly these sizes.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/gpu/column_layout.h"
#include "engine/gpu/gpu_ffn_executor.h"
#include "engine/gpu/gpu_memory.h"
#include "engine/gpu/queue.h"
#include "engine/model/ffn_backend.h"
#include "engine/model/layer_backend.h"
#include "engine/model/llama_model.h"
#include "engine/model/session.h"

namespace thermocline::gpu {

// An input-sparse layer (docs/sparse.md, "Input-sparse") on the device: q, k and v (one stacked
// layout, q's outputs then k's then v's, or three), gate, up and down as column layouts, read
// only at the columns of the input entries past the layer's thresholds. o stays dense.
struct InputSparseLayer {
  ColumnLayout qkv, q, k, v, gate, up, down;  // qkv not empty: stacked, and q, k, v empty
  float attn_in_threshold = 0;    // q/k/v read the entries of the normed input with |x| > this
  float ffn_in_threshold = 0;     // gate/up likewise, of the FFN's normed input
  float magnitude_threshold = 0;  // down reads the activations with |act| > this
  bool on() const { return !gate.empty(); }
};

// A gate-first layer (docs/sparse.md, "gate-first") on the device: every gate row, then the up
// and down_t rows only of the neurons whose |act(gate)| · scale passes gate_threshold, their
// activations past magnitude_threshold. The rows are the sparse weights' copies, in their slot
// order (the same permutation in all three).
struct GateFirstLayer {
  WeightView gate, up;                // (n_ff, n_embd)
  WeightView down_t;                  // (n_ff, n_embd): down's columns as rows
  const float* gate_scale = nullptr;  // (n_ff), or null: 1
  float gate_threshold = 0;
  float magnitude_threshold = 0;
  bool on() const { return down_t.data != nullptr; }
};

// OK when y's layouts have the shapes of a layer of h (q|k|v or q, k, v from n_embd inputs, gate
// and up n_ff outputs from n_embd, down n_embd from n_ff); InvalidArgumentError naming `layer`.
absl::Status CheckInputSparseLayer(const InputSparseLayer& y, const LlamaHparams& h, int64_t layer);

// The same for a gate-first layer's rows (gate, up and down_t: n_ff rows of n_embd).
absl::Status CheckGateFirstLayer(const GateFirstLayer& y, const LlamaHparams& h, int64_t layer);

struct GpuLayersSpec {
  const LlamaModel* model = nullptr;
  std::vector<uint8_t> layers;  // (n_layer) 1: the layer runs on the GPU
  bool output = false;          // the output norm and head too (needs the last layer on the GPU)
  int64_t n_ctx = 0;            // the session's KV cache length
  int64_t max_batch = 1;        // the session's tokens per forward pass
  // The element type of the layers' KV cache on the device, as the session's (kF16 halves it
  // and computes attention as the CPU's F16 cache does: q and the softmax weights in half).
  KvType kv_type = KvType::kF32;
  // nullptr: the FFN of a GPU layer runs dense on the GPU. Otherwise it runs through this host
  // backend: the hybrid layer. With device_ffn (the same backend's executor on this device and
  // queue) a decode token of a layer with device neurons (RunsResident) runs in resident mode
  // (gpu_ffn_executor.h): the device predicts, computes
  // its neurons into the residual and hands the host its active neurons and xn; the host's
  // partial sum alone comes back (host_ffn->ForwardListed). Without it, x and xn go to the host
  // and the host FFN's output comes back. Both must outlive the GpuLayers.
  FfnBackend* host_ffn = nullptr;
  GpuFfnExecutor* device_ffn = nullptr;
  // The session's queue (engine/gpu/queue.h); nullptr: one of the layers' own.
  Queue* queue = nullptr;
  uint64_t memory_cap = MemoryBudget::kUnlimited;
  // The budget the layers' device memory is reserved in, shared with the other device parts of
  // the same engine (engine/runtime/engine.h); nullptr: a budget of memory_cap of their own.
  // Must outlive the GpuLayers.
  MemoryBudget* budget = nullptr;
  int device = 0;
  // Empty, or (n_layer): a GPU layer whose entry is on() runs input-sparse (a whole layer only:
  // host_ffn null), its q, k, v, gate, up and down uploaded as these layouts instead of the
  // model's matrices; the layouts must outlive the GpuLayers.
  std::vector<InputSparseLayer> input_sparse;
  // Tokens of a batch (a prompt) through an input-sparse layer read every column (dense, as the
  // CPU's dense prefill); false: every token sparse, as perplexity measures it.
  bool dense_prefill = true;
  // Whether layer l, when on the GPU, runs input-sparse there.
  bool input_sparse_on(int64_t l) const {
    return host_ffn == nullptr && l >= 0 && l < static_cast<int64_t>(input_sparse.size()) &&
           input_sparse[l].on();
  }
  // Empty, or (n_layer): a GPU layer whose entry is on() (and not input-sparse) runs its FFN
  // gate-first (a whole layer only), from these rows instead of the model's gate, up and down;
  // the views must outlive the GpuLayers.
  std::vector<GateFirstLayer> gate_first;
  bool gate_first_on(int64_t l) const {
    return host_ffn == nullptr && !input_sparse_on(l) && l >= 0 &&
           l < static_cast<int64_t>(gate_first.size()) && gate_first[l].on();
  }
};

// Device bytes of a spec, each allocation rounded as MemoryBudget accounts it.
struct GpuLayersMemory {
  uint64_t scratch = 0;         // per-token buffers, shared by all GPU layers
  std::vector<uint64_t> layer;  // (n_layer) weights + norms + KV cache of layer l
  uint64_t output = 0;          // output norm + head + logits
  uint64_t Total(const GpuLayersSpec& spec) const;
};
GpuLayersMemory ComputeGpuLayersMemory(const GpuLayersSpec& spec);

// The scratch sizes the CUDA backend allocates (elements unless named *_bytes); one definition
// for the estimate above and the allocation.
struct GpuLayersScratch {
  int64_t x = 0, rope = 0, xn = 0, q = 0, att = 0, tmp = 0, gate = 0, up = 0, scores = 0;
  int64_t k = 0, v = 0;  // one token's K and V before they are stored at its position
  int64_t pos = 0;       // int32 positions of a batch's tokens (attention reads them there)
  int64_t xq_bytes = 0;  // Q8_0 blocks of the longest activation
  int64_t logits = 0;    // 0 without the output head
  // The input-sparse layers' partial sums (column_layout.h's ColumnGrid): the largest
  // splits · out of their layouts; 0 without such layers.
  int64_t column_partial = 0;
  // Gate-first layers: the fired slots (n_ff + 1 int32: the list, then its length), their
  // activations (n_ff), and the down_t axpy's partial sums; 0 without such layers.
  int64_t fired = 0, fired_act = 0, axpy_partial = 0;
};
GpuLayersScratch ScratchOf(const GpuLayersSpec& spec);

// --gpu-layers: "auto", or a whole number >= 0 (clamped to n_layer by the caller). kAuto: as
// many as fit.
constexpr int64_t kAutoLayers = -1;
absl::StatusOr<int64_t> ParseGpuLayers(const std::string& text);

// The -ngl plan: the first n layers on the GPU, n as many as fit under memory_cap with a dense
// FFN (spec.host_ffn null) when requested == kAutoLayers, else min(requested, n_layer); the
// output head too when every layer is on the GPU and it fits. input_sparse, gate_first: empty,
// or (n_layer) as GpuLayersSpec's, the layers they mark sized by their layouts and rows.
// ResourceExhaustedError naming the sizes when a requested count does not fit.
absl::StatusOr<GpuLayersSpec> PlanWholeLayers(const LlamaModel& model, int64_t requested,
                                              int64_t n_ctx, int64_t max_batch, uint64_t memory_cap,
                                              KvType kv_type,
                                              std::vector<InputSparseLayer> input_sparse = {},
                                              std::vector<GateFirstLayer> gate_first = {});

// A spec's layers on the device, as a Session layer backend; per session (it holds the KV cache
// of its layers). UnavailableError without a CUDA device, ResourceExhaustedError past the cap,
// InvalidArgumentError for shapes or weight types the kernels lack.
class GpuLayers : public LayerBackend {
 public:
  virtual uint64_t device_bytes() const = 0;
  // Per layer (n_layer), seconds the host waited for a resident hybrid layer's device half
  // (predictor and the copy down) since creation; empty when no layer runs resident.
  virtual const std::vector<double>& resident_wait_seconds() const { return no_waits_; }
  int64_t n_gpu_layers() const { return n_gpu_layers_; }
  bool output_on_gpu() const { return output_; }

 protected:
  int64_t n_gpu_layers_ = 0;
  bool output_ = false;

 private:
  std::vector<double> no_waits_;
};
absl::StatusOr<std::unique_ptr<GpuLayers>> CreateGpuLayers(const GpuLayersSpec& spec);

}  // namespace thermocline::gpu
