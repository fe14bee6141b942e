// The neuron placement problem: per layer, which frequency-ordered buckets of FFN neurons live
// on the GPU, whether the layer's attention (with its KV cache) does, and whether the output
// head does — under a GPU memory budget. This file holds the problem data and a plain
// evaluator (memory, feasibility, modelled time, firing mass) that the ILP is checked against.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model/llama_model.h"
#include "engine/model/session.h"
#include "offline/sidecar/sidecar.h"
#include "offline/solver/hardware.h"

namespace thermocline::offline {

enum class Objective { kTime, kFrequency };
const char* ObjectiveName(Objective o);
absl::StatusOr<Objective> ParseObjective(const std::string& name);

struct LayerCosts {
  std::vector<std::vector<int32_t>> buckets;  // neuron ids, most frequent bucket first
  std::vector<double> bucket_freq;            // expected firings per token of each bucket
  std::vector<double> bucket_work;  // expected neurons computed per token (firings / precision)
  // Device bytes per GPU neuron (gate, up and down_t rows, table entries) and, once per layer
  // that holds any, for its predictor and neuron map: engine/gpu/device_memory.h's bounds.
  double bytes_per_neuron = 0;
  double attn_bytes = 0;     // attention weights (memory and time)
  double kv_bytes = 0;       // the rest of a hybrid layer's memory: its F32 KV cache and norms
  double kv_read_bytes = 0;  // KV read per token (time)
  double predictor_bytes = 0;
  int64_t n_ff = 0;
  int64_t bucket_neurons(size_t b) const { return static_cast<int64_t>(buckets[b].size()); }
};

struct PlacementProblem {
  std::vector<LayerCosts> layers;
  double output_bytes = 0;   // output norm, head and logits
  double budget_bytes = 0;   // the cap less scratch_bytes
  double scratch_bytes = 0;  // the GPU layers' and the FFN executor's scratch
  int64_t min_neurons = 0;   // a layer whose FFN uses the GPU holds at least this many there
  double gpu_bytes_per_s = 1;
  double cpu_bytes_per_s = 1;
  double sync_s = 0;    // per layer that uses the GPU
  int64_t context = 0;  // KV cache length the memory figures are for
  // A mixture of experts (BuildExpertPlacementProblem): bucket b of a layer is one whole expert,
  // its neuron ids e * n_ff_exp ... (e + 1) * n_ff_exp - 1; attention and the head stay on the
  // CPU (the placed MoE FFN has no GPU layers).
  bool experts = false;
  int64_t n_ff_exp = 0;
  // The minimum-neurons rule as applied to layer l (at least 1, at most the layer's size).
  int64_t MinNeurons(size_t l) const;
};

struct Placement {
  std::vector<std::vector<uint8_t>> gpu_bucket;  // [layer][bucket]
  std::vector<uint8_t> attention_gpu;            // [layer]
  bool output_gpu = false;
  static Placement AllCpu(const PlacementProblem& p);
  int64_t GpuNeurons(const PlacementProblem& p, size_t layer) const;
};

double PlacementGpuBytes(const PlacementProblem& p, const Placement& x);
// Memory within the budget and the minimum-neurons rule on every layer.
bool PlacementFeasible(const PlacementProblem& p, const Placement& x);
// Modelled seconds per decoded token: per layer attention + max(GPU FFN, CPU FFN) + sync when
// the layer uses the GPU, plus the output head.
double PlacementSeconds(const PlacementProblem& p, const Placement& x);
// Expected firings per token that land on the GPU.
double PlacementFiringMass(const PlacementProblem& p, const Placement& x);
double TotalFiringMass(const PlacementProblem& p);
// The value the solver maximises: -seconds for kTime; for kFrequency the firing mass, plus a
// tie-break far below one firing that gives leftover memory to attention and the output head.
double PlacementObjective(const PlacementProblem& p, const Placement& x, Objective o);
constexpr double kFrequencyTieBreak = 1e-6;

// One layer's modelled decode time under a placement (what PlacementSeconds adds up).
struct ModelledLayer {
  bool attention_gpu = false;
  int64_t gpu_neurons = 0;
  double attention_s = 0;
  double gpu_ffn_s = 0;
  double cpu_ffn_s = 0;
  double sync_s = 0;  // when the layer uses the GPU
};
// The per-layer times of the placement a sidecar holds (its neuron tables and attention flags,
// ApplyPlacement's), on the problem's costs; the output head's time in *output_s.
std::vector<ModelledLayer> ModelledLayerTimes(const PlacementProblem& p, const Sidecar& sidecar,
                                              double* output_s);

// The smallest budget that can hold anything useful: one layer's attention and KV cache, one
// layer's minimum neuron set and predictor, or the output head.
double MinimumUsefulBudget(const PlacementProblem& p);

struct ProblemOptions {
  int64_t bucket_size = 64;
  int64_t min_neurons = -1;       // -1: derived from the hardware (a sync must pay for itself)
  int64_t context = 0;            // KV cache length; 0: the model's training context
  int64_t max_batch = 64;         // the sessions' prefill chunk (the GPU layers' scratch)
  KvType kv_type = KvType::kF16;  // the sessions' KV cache (EngineOptions' default)
  double budget_bytes = 0;        // the whole cap (--gpu-memory); scratch is taken off it
};

// A mixture of experts is built by BuildExpertPlacementProblem.
absl::StatusOr<PlacementProblem> BuildPlacementProblem(const LlamaModel& model,
                                                       const Sidecar& sidecar,
                                                       const HardwareProfile& hw,
                                                       const ProblemOptions& options);

// The experts of a mixture of experts as units: per layer one bucket per expert, hottest first,
// of n_ff_exp "neurons" whose bytes are engine/gpu/device_memory.h's ExpertDeviceBytes (so a
// placement solved under a cap fits the runtime's budget), its frequency and work the expert's
// routing frequency (tokens routed / tokens) times n_ff_exp rows computed. Under the time
// objective an expert's value is what moving its expected rows off the CPU saves; under the
// frequency objective its routing frequency. The minimum per GPU-using layer is one expert.
absl::StatusOr<PlacementProblem> BuildExpertPlacementProblem(const LlamaModel& model,
                                                             const Sidecar& sidecar,
                                                             const HardwareProfile& hw,
                                                             const ProblemOptions& options);
// The experts of layer l a placement puts on the GPU, ascending.
std::vector<int32_t> GpuExperts(const PlacementProblem& p, const Placement& x, size_t l);

}  // namespace thermocline::offline
