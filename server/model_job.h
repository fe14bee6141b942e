// One registered model's background job, as a function of its inputs: load → profile →
// predictors → solve (for this machine's hardware profile) → sidecar. Stage artefacts live in
// the model's job directory under the state directory (never beside the user's model), so a
// job started again after an interruption resumes after its last finished stage:
//   DIR/profiled.thermo.gguf  profile + predictors, no placement (after "predictors")
//   DIR/report.json           the profile report (after "predictors")
//   DIR/NAME.thermo.gguf      the final sidecar with the placement (after "sidecar")
// It knows nothing of the registry or HTTP: progress and finished stages go to an observer.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "engine/model/session.h"
#include "nlohmann/json.hpp"
#include "offline/solver/hardware.h"

namespace thermocline::server {

struct ModelJobSpec {
  std::string name;
  std::string path;
  std::string activation;  // "" = from the file
  std::string corpus;      // "" = self-generated text
  int64_t profile_tokens = 4096;
  // SwiGLU models: also calibrate the sparsity for this perplexity increase (0: off).
  double target_ppl_increase = 0;
  bool speed_check = true;  // measure dense and sparse decode here (offline/speed_check.h)
  std::string dir;          // the job directory (created when missing)
  offline::HardwareProfile hardware;
  // The cap the placement is solved for: the model's gpu_memory when it has one, else the
  // hardware profile's GPU memory (0).
  uint64_t gpu_memory = 0;
  int64_t context = 0;            // KV cache length the placement budgets (0: the model's)
  int64_t max_batch = 64;         // the sessions' prefill chunk (the GPU layers' scratch)
  KvType kv_type = KvType::kF16;  // the sessions' KV cache (the GPU layers' too)
  double solve_time_limit_s = 10;
  int threads = 1;
  int stage_delay_ms = 0;  // debug: sleep after each finished stage
};

class ModelJobObserver {
 public:
  virtual ~ModelJobObserver() = default;
  // stage: "load", "profile", "predictors", "solve", "sidecar"; percent of the whole job.
  // Returns false to cancel (the job then ends with a Cancelled status).
  virtual bool OnProgress(const std::string& stage, double percent) = 0;
  // `stage` has finished and its artefact is on disk (persist it before returning).
  virtual void OnStageDone(const std::string& stage) = 0;
};

struct ModelJobResult {
  std::string sidecar_path;
  nlohmann::json placement;  // PlacementSummary of the sidecar
  nlohmann::json report;     // ReportSummary of the sidecar
  bool resumed = false;      // the profile came from an earlier run's artefact
};

absl::StatusOr<ModelJobResult> RunModelJob(const ModelJobSpec& spec, ModelJobObserver& observer);

// The solver's hardware profile for this machine. `file` (configs/hardware/*.toml) when given,
// its CPU bandwidth measured when it has none; else STATE_DIR/hardware.toml, measured (CPU
// bandwidth; GPU figures from the defaults) and written there on first use.
absl::StatusOr<offline::HardwareProfile> HardwareProfileFor(const std::string& state_dir,
                                                            const std::string& file, int threads);

}  // namespace thermocline::server
