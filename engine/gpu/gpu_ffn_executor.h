// The GPU half of the hybrid FFN (engine/sparse/sparse_ffn.h's device part), CUDA-free. It holds
// the device neurons' gate/up rows and down_t rows of every layer on the GPU (uploaded once,
// accounted against the memory cap) and computes, per token and layer, the partial FFN output
// of those neurons while the CPU computes the rest:
//   Launch: xn → pinned buffer → GPU (one async copy) → predictor (or the given active set) →
//           row-sparse gate/up → gated activation → axpy over down_t → partial → pinned buffer
//           (async), all on the executor's stream, then an event;
//   Wait:   waits on the event and hands the partial (n_embd) back.
// No allocation, lock or log per token. Not thread-safe: one thread drives Launch/Wait pairs.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/gpu/gpu_memory.h"
#include "engine/gpu/queue.h"
#include "engine/model/hparams.h"
#include "engine/ops/matmul.h"

namespace thermocline::gpu {

// One layer's device part. Views and spans are read during Create only.
struct GpuFfnLayerSpec {
  WeightView gate;    // (n_ff, n_embd)
  WeightView up;      // (n_ff, n_embd)
  WeightView down_t;  // (n_ff, n_embd), the transposed down (SparseFfn's down_t)
  // The neurons on the GPU: compact row k holds neuron device_neurons[k]. Distinct, < n_ff.
  absl::Span<const int32_t> device_neurons;
  // Predictor fc2(relu(fc1 xn + b1)) + b2 > threshold; rank 0: none (all device neurons, or
  // the active set given to Launch). With a predictor the device holds fc2's rows of every
  // neuron: resident mode (below) predicts the host's neurons too.
  int64_t rank = 0;
  WeightView fc1;  // (rank, n_embd)
  absl::Span<const float> b1;
  WeightView fc2;  // (n_ff, rank)
  absl::Span<const float> b2;
  float threshold = 0.0f;
  float magnitude_threshold = 0.0f;  // activations with |a| <= this are dropped (0: ReLU zeros)
};

struct GpuFfnSpec {
  int64_t n_embd = 0;
  int64_t n_ff = 0;
  FfnActivation activation = FfnActivation::kSilu;
  std::vector<GpuFfnLayerSpec> layers;
  uint64_t memory_cap = MemoryBudget::kUnlimited;  // --gpu-memory
  // Shared with the engine's other device parts; nullptr: a budget of memory_cap of its own.
  // Must outlive the executor.
  MemoryBudget* budget = nullptr;
  // The session's queue (engine/gpu/queue.h), shared with its GPU layers; nullptr: one of its
  // own. Must outlive the executor.
  Queue* queue = nullptr;
  int device = 0;
};

// The host's half of a resident-mode layer, in host memory: valid until the next
// EnqueueResident.
struct HostPart {
  const float* xn = nullptr;        // (n_embd) the FFN input after ffn_norm
  const int32_t* active = nullptr;  // the host's neurons predicted active, ascending
  int64_t n_active = 0;
  float* partial = nullptr;  // (n_embd) where the host writes its partial sum
};

class GpuFfnExecutor {
 public:
  virtual ~GpuFfnExecutor() = default;

  // Starts the device part of `layer` for one token and returns at once. xn: (n_embd), the FFN
  // input after ffn_norm; copied before return, so the caller may reuse it. active: the device
  // neurons to compute (neuron ids, each one of the layer's device_neurons), or null to let the
  // GPU predictor choose among the device neurons (all of them when the layer has no predictor).
  virtual absl::Status Launch(int layer, const float* xn, const int32_t* active,
                              int64_t n_active) = 0;
  // Blocks until the launched work is done. out: (n_embd) = Σ over the computed device neurons
  // of act · down_t row. n_predicted / n_fired (optional): neurons computed and neurons with a
  // nonzero activation after the magnitude threshold.
  virtual absl::Status Wait(float* out, int64_t* n_predicted, int64_t* n_fired) = 0;

  // Device bytes held (weights + scratch), within the cap.
  virtual uint64_t device_bytes() const = 0;

  // ---- Resident mode: a hybrid layer of GPU layers on the same queue, its xn on the device ----
  // Per token and layer, the GPU layers call, in this order:
  //   EnqueueResident(layer, xn, x): on the queue, the predictor over every neuron of the layer
  //     (needs one: rank > 0, else every neuron is active), then one copy of xn and of the host
  //     neurons predicted active to host memory, then the device part's FFN added into the
  //     residual x. xn, x: (n_embd) in the device's memory. Returns at once.
  //   WaitHostPart(): blocks until that copy has landed (the one host sync of the layer) and
  //     returns the host's half; the device part runs on meanwhile.
  //   EnqueueAddHostPart(x): on the queue, x += the partial sum the host wrote into
  //     HostPart::partial (one copy up). Returns at once; the next WaitHostPart (or the queue's
  //     end of the token) orders it before the buffer is written again.
  // Only the host's partial sum crosses back; the residual never leaves the device.
  // Whether `layer` can run resident: it has device neurons (a layer without any holds nothing on
  // the device, not even its predictor; the GPU layers run it in the non-resident form).
  virtual bool RunsResident(int layer) const = 0;
  virtual absl::Status EnqueueResident(int layer, const float* xn, float* x) = 0;
  virtual absl::StatusOr<HostPart> WaitHostPart() = 0;
  virtual absl::Status EnqueueAddHostPart(float* x) = 0;
};

// Uploads every layer's device part. UnavailableError without a CUDA device,
// ResourceExhaustedError when the device part does not fit under spec.memory_cap,
// InvalidArgumentError for bad shapes, types without CUDA kernels or neuron ids out of range.
absl::StatusOr<std::unique_ptr<GpuFfnExecutor>> CreateGpuFfnExecutor(const GpuFfnSpec& spec);

}  // namespace thermocline::gpu
