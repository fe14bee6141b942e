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

struct SparseRequest {
  SparseMode mode = SparseMode::kAuto;
  std::string sidecar;     // a sidecar to use; "" = look for MODEL.thermo.gguf beside the model
  std::string model_path;  // where the model was loaded from (for the sidecar beside it)
  bool oracle = false;     // exact active sets (dense gate/up) instead of the predictors
  // > 0: recalibrate every layer's magnitude threshold to drop this fraction of activations
  // (from the profile's |act| quantiles; SwiGLU). 0: the sidecar's thresholds.
  double target_sparsity = 0;
};

struct ResolvedSparse {
  std::optional<SparsePlan> plan;  // std::nullopt: dense
  // A sidecar found beside the model that does not belong to it or cannot be read: auto mode
  // serves dense and says why here (a sidecar that was asked for is an error instead).
  std::string warning;
};

// In this order: off → dense; an asked-for sidecar → its plan; MODEL.thermo.gguf beside the model
// → its plan; a model that carries predictors (PowerInfer) → their plan; on with oracle → the
// oracle plan (no predictors); else dense (auto) or InvalidArgument (on).
absl::StatusOr<ResolvedSparse> ResolveSparsePlan(const LlamaModel& model,
                                                 const SparseRequest& request);

// The plan of a sidecar that belongs to `model` (CheckSidecarMatches); else its error.
absl::StatusOr<SparsePlan> SparsePlanFromSidecar(const Sidecar& sidecar, const LlamaModel& model,
                                                 double target_sparsity = 0);
// The plan of the sidecar at `path` for `model`.
absl::StatusOr<SparsePlan> LoadSparsePlan(const std::string& path, const LlamaModel& model,
                                          double target_sparsity = 0);

// The summaries of a sidecar.
PlacementSummary SummarizePlacement(const Sidecar& sidecar);
ProfileSummary SummarizeProfile(const Sidecar& sidecar);

}  // namespace thermocline::offline
