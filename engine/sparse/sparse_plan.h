// What the engine needs to run a model sparse: per layer the predictor, thresholds and the
// placement's device neurons, plus where the placement puts attention and the output head and a
// typed summary of the placement and the profile it came from. Built by offline/sparse_source.h
// (from a sidecar, a PowerInfer file's own predictors, or the oracle) and read by the engine's
// front door (engine/runtime/engine.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model/llama_model.h"
#include "engine/ops/weight_layout.h"

namespace thermocline {

// How a layer's FFN skips work.
//   kPredicted: the predictor picks the candidate neurons; gate and up rows of those, down rows
//     of the ones that fire (the ReLU family's way: its zeros are exact and predictable).
//   kGateFirst (CATS-style): no predictor; every gate row, then up and down rows only of the
//     neurons whose score |act(gate_i)| · gate_scale[i] > gate_threshold (gate_scale: the
//     neuron's mean |up| in the profile, so that the score ranks neurons as |act| does on
//     average). For SwiGLU, whose activations are never exactly zero and which a predictor
//     marks nearly all active: at sparsity s the FFN reads (1 + 2(1 - s)) / 3 of its bytes.
//   kInputSparse (TEAL-style): no predictor; the inputs of the projections are thresholded by
//     magnitude, and only the weight columns of the entries kept are read, over transposed
//     copies (a column of W is a row of Wᵀ: the axpy form). q/k/v read the columns of the
//     entries of the normed attention input with |x_i| > attn_in_threshold, gate and up those
//     of the normed FFN input with |x_i| > ffn_in_threshold, down those of the activation with
//     |act_i| > magnitude_threshold. Attention's projections skip work too.
enum class SparseMethod { kPredicted, kGateFirst, kInputSparse };
// "predicted", "gate-first", "input-sparse".
const char* SparseMethodName(SparseMethod method);
struct SparseLayerPlan;
// The methods of a plan's layers: "gate-first", or with several their layer counts
// ("gate-first 20, predicted 2"). A mixture of experts' layers count as predicted.
std::string SparseMethodsOf(const std::vector<SparseLayerPlan>& layers);

// One layer's sparse FFN.
struct SparseLayerPlan {
  SparseMethod method = SparseMethod::kPredicted;
  int64_t rank = 0;                     // 0: no predictor, every neuron is a candidate
  OwnedWeight fc1;                      // (rank, n_embd), any type with kernels
  std::vector<float> b1;                // (rank)
  OwnedWeight fc2;                      // (n_ff, rank)
  std::vector<float> b2;                // (n_ff)
  float threshold = 0.0f;               // predicted active iff logit > threshold
  float magnitude_threshold = 0;        // fired iff |act| > this
  float gate_threshold = 0;             // kGateFirst: up and down iff the score > this
  float attn_in_threshold = 0;          // kInputSparse: q/k/v columns of |x_i| > this
  float ffn_in_threshold = 0;           // kInputSparse: gate/up columns of |x_i| > this
  std::vector<float> gate_scale;        // kGateFirst: (n_ff) the score's per-neuron scale
  std::vector<int32_t> device_neurons;  // the placement's device part (empty: all host)
  std::vector<int32_t> fire_count;      // (n_ff) firings in the profile (empty: none)
  // Mixture of experts: the placement's experts on the device, ascending (empty: all on the
  // host), and the profile's tokens routed to each expert (n_expert, empty: none). Such a
  // layer has no predictor and no neuron lists: whole experts are the units.
  std::vector<int32_t> device_experts;
  std::vector<int32_t> route_count;
};

// The solved placement as its sidecar states it.
struct PlacementSummary {
  bool solved = false;
  int64_t gpu_neurons = 0;  // FFN neurons the placement puts on the GPU, all layers
  int64_t gpu_experts = 0;  // experts the placement puts on the GPU, all layers
  int64_t cpu_neurons = 0;
  uint64_t gpu_memory = 0;  // device bytes the placement uses
  std::string objective;    // "time" or "frequency"; "" when not solved
  std::string hardware;     // the hardware profile it was solved for
  double modelled_tokens_per_s = 0;
};

// The activation profile the predictors were trained on.
struct ProfileSummary {
  double sparsity = 0;  // mean over layers
  double recall = 0;    // the predictors' mean held-out recall
  int64_t layers = 0;
  int64_t tokens = 0;
  std::string corpus;  // "corpus" or "self-generated"; "" when there is no profile
};

struct SparsePlan {
  enum class Source {
    kSidecar,          // a sidecar of ours (thermocline profile)
    kModelPredictors,  // a PowerInfer file's own predictors (blk.N.fc1/fc2)
    kOracle,           // no predictors: the exact active set from dense gate/up
  };
  Source source = Source::kSidecar;
  std::string sidecar_path;  // kSidecar
  // Exact active sets (dense gate/up) instead of the predictors; always for kOracle.
  bool oracle = false;
  std::vector<SparseLayerPlan> layers;  // (n_layer)
  std::vector<uint8_t> attention_gpu;   // (n_layer) 1: the placement puts attention on the GPU
  bool output_gpu = false;              // the placement puts the output head on the GPU
  PlacementSummary placement;
  ProfileSummary profile;
  // SwiGLU: where the magnitude thresholds come from, for the user ("gate-first at sparsity
  // 0.253, calibrated for at most +2.00% perplexity"); "" for the ReLU family.
  std::string thresholds;
  // The sidecar's speed check (offline/speed_check.h) when it was measured on this machine at
  // this plan's levels: decode tokens/s of dense and of this plan's method, and the whole
  // measurement for the user; 0 and "" otherwise.
  double checked_dense_tokens_per_s = 0;
  double checked_tokens_per_s = 0;
  std::string speed;
};
// "sidecar", "powerinfer", "oracle".
const char* SparseSourceName(SparsePlan::Source source);

// The plan of a model that carries its predictors (a PowerInfer file: blk.N.fc1/fc2, no
// biases, threshold powerinfer.sparse_threshold); the views point into the model.
// FailedPrecondition when it carries none.
absl::StatusOr<std::vector<SparseLayerPlan>> SparsePlanFromModel(const LlamaModel& model);

}  // namespace thermocline
