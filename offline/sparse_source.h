// The one place a sparse plan is chosen (engine/sparse/sparse_plan.h): off / on / auto, a sidecar
// given or found beside the model, a PowerInfer file's own predictors, the oracle. The CLI
// (tools/common.cc) and the daemon's registry both call ResolveSparsePlan, so a file runs the
// same way under `generate` and `serve`. The offline side depends on the engine, never the
// reverse: this is the bridge from sidecars to the engine's plan.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model/llama_model.h"
#include "engine/sparse/sparse_plan.h"
#include "offline/sidecar/sidecar.h"

namespace thermocline::offline {

enum class SparseMode { kOff, kOn, kAuto };
// "off", "on", "auto"; InvalidArgument naming `what` (the flag or config key) otherwise.
absl::StatusOr<SparseMode> ParseSparseMode(const std::string& text, const std::string& what);

// How SwiGLU layers skip work (engine/sparse/sparse_plan.h's SparseMethod). predicted (the
// default): the predictors, whatever they save. gate-first: every layer gate-first.
// input-sparse: every layer input-sparse (its q/k/v, gate/up and down inputs thresholded by
// magnitude). auto: the method that decoded fastest in the sidecar's speed check when it was
// measured on this machine at the levels loaded (offline/speed_check.h); otherwise per layer,
// the method that reads the fewest weight bytes of q/k/v and the FFN by the profile (the
// predictor's measured predicted-active share and firing rate against gate-first and
// input-sparse at their sparsities). They drop different activations at the same sparsity, so
// their quality differs (docs/sparse.md). The ReLU family is always predicted.
enum class MethodChoice { kAuto, kPredicted, kGateFirst, kInputSparse };
// "auto", "predicted", "gate-first", "input-sparse"; InvalidArgument naming `what` otherwise.
absl::StatusOr<MethodChoice> ParseSparseMethod(const std::string& text, const std::string& what);
// The name ParseSparseMethod reads.
const char* MethodChoiceName(MethodChoice method);

struct SparseRequest {
  SparseMode mode = SparseMode::kAuto;
  std::string sidecar;     // a sidecar to use; "" = look for MODEL.thermo.gguf beside the model
  std::string model_path;  // where the model was loaded from (for the sidecar beside it)
  bool oracle = false;     // exact active sets (dense gate/up) instead of the predictors
  // > 0: recalibrate every layer's threshold to drop this fraction of activations (predicted:
  // of |act|, gate-first: of |silu(gate)|, input-sparse: of each projection's input, from the
  // profile's quantiles; SwiGLU). 0: the sparsity the sidecar calibrated for a perplexity
  // target (offline/sparsity_calibration.h), else the sidecar's thresholds (gate-first and
  // input-sparse: the profile's target sparsity).
  double target_sparsity = 0;
  MethodChoice method = MethodChoice::kPredicted;
  // Auto mode: serve dense when the sidecar's speed check measured the plan slower than dense
  // on this machine (offline/speed_check.h). Callers clear it for a sidecar the user named
  // (--sidecar, `sidecar =`: theirs to choose) and when the engine will use a device (the check
  // measured the CPU alone).
  bool check_speed = true;
};

struct ResolvedSparse {
  std::optional<SparsePlan> plan;  // std::nullopt: dense
  // A sidecar found beside the model that does not belong to it or cannot be read: auto mode
  // serves dense and says why here (a sidecar that was asked for is an error instead).
  std::string warning;
};

// In this order: off → dense; an asked-for sidecar → its plan; MODEL.thermo.gguf beside the model
// → its plan (in auto mode with check_speed, dense instead when the sidecar's speed check
// measured the plan slower than dense on this machine: offline/speed_check.h); a model that carries
// predictors (PowerInfer) → their plan; on with oracle → the oracle plan (no predictors); else
// dense (auto) or InvalidArgument (on).
absl::StatusOr<ResolvedSparse> ResolveSparsePlan(const LlamaModel& model,
                                                 const SparseRequest& request);

// The plan of a sidecar that belongs to `model` (CheckSidecarMatches); else its error.
// Gate-first needs the sidecar's |silu(gate)| quantiles, input-sparse its quantiles of the
// projections' inputs: asked for without them, FailedPrecondition (profile the model again);
// auto then leaves that method out. Either asked for on a ReLU-family or mixture-of-experts
// model: InvalidArgument.
absl::StatusOr<SparsePlan> SparsePlanFromSidecar(const Sidecar& sidecar, const LlamaModel& model,
                                                 double target_sparsity = 0,
                                                 MethodChoice method = MethodChoice::kPredicted);
// Whether a sidecar layer has gate-first's statistics (the score's quantiles and scales).
bool HasGateFirstStatistics(const SidecarLayer& layer, int64_t n_ff);
// Whether a sidecar layer has input-sparse's statistics (the quantiles of |x| entering q/k/v
// and gate/up, beside those of |act|).
bool HasInputSparseStatistics(const SidecarLayer& layer);
// The methods a sidecar's plan can use for this model: predicted; gate-first and input-sparse
// each for a SwiGLU model (gated by magnitude, not a mixture of experts) whose every layer has
// that method's statistics.
std::vector<MethodChoice> SidecarMethods(const Sidecar& sidecar, const LlamaModel& model);
// The sparsity a method's thresholds sit at when the sidecar loads with `target_sparsity` (0: none
// asked): that one, else the level calibrated for a perplexity target, else the profile's
// target (gate-first and input-sparse: 0.5 when the profile has none).
double SidecarLevel(const Sidecar& sidecar, double target_sparsity, MethodChoice method);
// The plan of the sidecar at `path` for `model`.
absl::StatusOr<SparsePlan> LoadSparsePlan(const std::string& path, const LlamaModel& model,
                                          double target_sparsity = 0,
                                          MethodChoice method = MethodChoice::kPredicted);

// The summaries of a sidecar.
PlacementSummary SummarizePlacement(const Sidecar& sidecar);
ProfileSummary SummarizeProfile(const Sidecar& sidecar);

}  // namespace thermocline::offline
