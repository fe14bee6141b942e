// The one account of the device memory of a hybrid placement: what the CUDA backend allocates
// for the FFN executor of a spec, and the linear bounds the placement solver plans with. CUDA-
// free; read by the runtime (the CPU stand-in device reserves exactly ComputeGpuFfnMemory; a
// [cuda] test checks the CUDA executor's device_bytes equals it), by the solver
// (offline/solver/placement.cc) and by the engine's front door, so that a placement solved for a
// cap fits under it when it runs. The whole layers' part is gpu_layers.h's
// ComputeGpuLayersMemory.
#pragma once

#include <cstdint>

#include "engine/gpu/axpy_splits.h"
#include "engine/gpu/gpu_ffn_executor.h"
#include "engine/gpu/gpu_layers.h"
#include "engine/model/llama_model.h"

namespace thermocline::gpu {

// Device bytes CreateGpuFfnExecutor allocates for `spec`, each allocation rounded as
// MemoryBudget accounts it.
uint64_t ComputeGpuFfnMemory(const GpuFfnSpec& spec);

// One layer's FFN device part for the solver: n device neurons take at most
// n * per_neuron + fixed bytes (rounding included), fixed only when n > 0.
struct FfnLayerBytes {
  double per_neuron = 0;  // gate row + up row + down_t row (its stored type) + table entries
  double fixed = 0;       // the neuron map and the predictor (fc1, fc2 of every neuron, biases)
};
// gate, up, down: the model's; down_t's type is TransposeWeight's (weight_layout.h).
// predictor_rank 0: none; predictor_type: the type of fc1 and fc2 (a sidecar's: F16).
FfnLayerBytes FfnLayerDeviceBytes(const LayerWeights& layer, int64_t n_embd, int64_t n_ff,
                                  int64_t predictor_rank, GgmlType predictor_type);
// The executor's scratch for layers of at most max_device neurons and predictors of at most
// max_rank (an upper bound: max_device = n_ff).
uint64_t FfnScratchBytes(int64_t n_embd, int64_t n_ff, int64_t max_device, int64_t max_rank);

// One expert of a mixture-of-experts layer as a unit of the placement: the bytes
// ComputeGpuFfnMemory accounts for an executor layer holding all n_ff_exp of its neurons with no
// predictor (gate, up and down_t rows, down_t of TransposeWeight's type, and the tables). Exact,
// not a bound: every expert of a layer is one executor layer of the placed MoE FFN
// (engine/sparse/moe_ffn.h), whose scratch is FfnScratchBytes(n_embd, n_ff_exp, n_ff_exp, 0).
uint64_t ExpertDeviceBytes(const LayerWeights& layer, int64_t expert, int64_t n_embd,
                           int64_t n_ff_exp);

// The memory of hybrid GPU layers (attention, norms, the KV cache of n_ctx positions of
// kv_type; the FFN through the host) of `model`, per layer, with the output head and the scratch.
GpuLayersMemory ComputeHybridLayersMemory(const LlamaModel& model, int64_t n_ctx, int64_t max_batch,
                                          bool output, KvType kv_type);

}  // namespace thermocline::gpu
