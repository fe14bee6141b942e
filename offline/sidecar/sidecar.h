// The sidecar (`<model>.thermo.gguf`): everything the offline pipeline learns about one model —
// activation statistics, predictors, thresholds, and the GPU/CPU placement — as a GGUF file with
// keys under `thermocline.*` and per-layer tensors `blk.N.*`. docs/offline.md lists every key.
// A sidecar is bound to its model by an identity hash and the shapes; one that does not belong
// (another model, other shapes, another format version) is refused with an error saying so.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/gguf/gguf.h"
#include "engine/model/llama_model.h"
#include "offline/predictor/predictor.h"

namespace thermocline::offline {

// Version 2 added the experts section (thermocline.experts.*, blk.N.expert_route_count,
// blk.N.expert_gpu); version 1 files, which have none, still load.
constexpr uint32_t kSidecarFormatVersion = 2;
constexpr uint32_t kOldestSidecarFormatVersion = 1;
constexpr int kQuantileLevels = 101;  // |act| quantiles at 0.00, 0.01, ..., 1.00

struct SidecarLayer {
  // Profile.
  std::vector<int32_t> fire_count;       // (n_ff) tokens on which each neuron fired
  std::vector<float> act_abs_mean;       // (n_ff) mean |act| per neuron
  std::vector<float> act_abs_quantiles;  // (kQuantileLevels) of |act| over all neurons
  // SwiGLU (empty otherwise, and in sidecars written before them): a gate-first layer's
  // calibration. Neuron i's score is |silu(gate_i)| · gate_scale[i] (its mean |up|); the
  // quantiles of the score over all neurons give the threshold for any target sparsity.
  std::vector<float> gate_scale;            // (n_ff)
  std::vector<float> gate_score_quantiles;  // (kQuantileLevels)
  // SwiGLU (empty otherwise, and in sidecars written before them): an input-sparse layer's
  // calibration, the quantiles of |x| over every element of the normed inputs of attention's
  // q/k/v (after attn_norm) and of the FFN's gate/up (after ffn_norm); with act_abs_quantiles
  // (down's input) they give its three thresholds for any target sparsity.
  std::vector<float> attn_in_quantiles;  // (kQuantileLevels)
  std::vector<float> ffn_in_quantiles;   // (kQuantileLevels)
  float magnitude_threshold = 0.0f;      // fired iff |act| > this (0 for ReLU family)
  double sparsity = 0;                   // mean fraction of neurons not firing per token
  double skew80 = 0;                     // fraction of neurons carrying 80% of firings
  // Predictor (rank 0: none).
  Predictor predictor;
  double recall = 0;
  double precision = 0;
  double predicted_active = 0;
  // Placement (neuron_order empty: none). GPU neurons are neuron_order[0, n_gpu), CPU neurons
  // the rest; both lists ascending by neuron id within their part.
  bool attention_gpu = false;
  int64_t n_gpu = 0;
  std::vector<int32_t> neuron_order;  // (n_ff)
  // Mixture of experts (empty otherwise; the neuron statistics above are then empty too).
  std::vector<int32_t> expert_route_count;  // (n_expert) tokens the router sent to each expert
  std::vector<int32_t> expert_gpu;          // (n_expert) placement: 1 on the GPU, 0 on the CPU
};

struct SidecarPlacement {
  bool present = false;
  std::string objective;  // "time" or "frequency"
  std::string hardware;   // the hardware profile's name
  uint64_t gpu_budget_bytes = 0;
  uint64_t gpu_bytes = 0;  // what the placement puts on the GPU
  int64_t bucket_size = 0;
  int64_t min_neurons = 0;
  int64_t context = 0;  // KV cache length the memory was computed for
  bool output_gpu = false;
  double gpu_neuron_fraction = 0;
  double gpu_mass_fraction = 0;       // of all firings
  double tokens_per_s = 0;            // modelled, for this placement
  double tokens_per_s_time = 0;       // modelled, best placement of objective "time"
  double tokens_per_s_frequency = 0;  // modelled, best placement of objective "frequency"
};

// The sparsity that keeps perplexity within a stated increase over dense, per SwiGLU method
// (offline/sparsity_calibration.h): loading without a --target-sparsity uses it.
struct SidecarCalibration {
  bool present = false;
  double max_ppl_increase = 0;  // the target: 0.02 = perplexity at most 2% above dense
  bool held_out = false;        // the text was not part of what the profile read
  int64_t n_ctx = 0;
  int64_t tokens_scored = 0;
  double dense_ppl = 0;
  // Per method: the largest target sparsity tried whose perplexity met the target (0 when none
  // did; then the smallest threshold) and that perplexity (0: not measured). gate_first_* only
  // when the profile has gate-first statistics, input_sparse_* when it has input-sparse's.
  double predicted_sparsity = 0, predicted_ppl = 0;
  bool gate_first = false;
  double gate_first_sparsity = 0, gate_first_ppl = 0;
  bool input_sparse = false;
  double input_sparse_sparsity = 0, input_sparse_ppl = 0;
};

// Decode speed of the sidecar's sparse plans against dense, measured on the machine that
// profiled (offline/speed_check.h): loading on the same CPU, `auto` serves what was fastest.
struct SidecarSpeed {
  bool present = false;
  std::string cpu;  // HostCpu() of the machine that measured
  int64_t threads = 0;
  double dense_tokens_per_s = 0;
  // Per method at the sparsity it was measured at (the level a load without --target-sparsity
  // uses); tokens_per_s 0: not measured (no predictors, or no gate-first or input-sparse
  // statistics).
  double predicted_tokens_per_s = 0, predicted_sparsity = 0;
  double gate_first_tokens_per_s = 0, gate_first_sparsity = 0;
  double input_sparse_tokens_per_s = 0, input_sparse_sparsity = 0;
};

struct Sidecar {
  uint32_t format_version = kSidecarFormatVersion;
  std::string model_identity;
  std::string model_name;
  int64_t n_layer = 0, n_embd = 0, n_ff = 0;
  int64_t n_expert = 0, n_expert_used = 0;  // 0: not a mixture of experts
  std::string activation;                   // ActivationName()
  std::string corpus_kind;
  std::string corpus_hash;
  int64_t tokens = 0;
  double target_recall = 0;
  double target_sparsity = 0;  // SwiGLU calibration target (magnitude_threshold)
  std::vector<SidecarLayer> layers;
  SidecarPlacement placement;
  SidecarCalibration calibration;
  SidecarSpeed speed;
};

// Hash of the model file's tensor names, shapes, types and data sizes (hex).
std::string ModelIdentity(const GgufFile& model_file);

absl::Status WriteSidecar(const Sidecar& sidecar, const std::string& path);
// Reads and checks the sidecar's own consistency; does not check it against a model.
absl::StatusOr<Sidecar> ReadSidecar(const std::string& path);
// OK when the sidecar belongs to this model; else FailedPrecondition naming the mismatch.
absl::Status CheckSidecarMatches(const Sidecar& sidecar, const LlamaModel& model);
// ReadSidecar + CheckSidecarMatches.
absl::StatusOr<Sidecar> LoadSidecarFor(const std::string& path, const LlamaModel& model);

}  // namespace thermocline::offline
