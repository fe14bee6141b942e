// The model-admin contract shared by the admin front ends (HTTP /admin/models, the gRPC admin
// service, the CLI's `models` verbs): register a model, watch its background job (profile →
// predictors → solve → sidecar) and its lifecycle, delete it. The registry implements it; the
// front ends only call it and translate ModelInfo / absl::Status to their wire format.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "server/model_state.h"

namespace thermocline::server {

// What a registration asks for. `name` and `path` are required; `activation` ("relu", "drelu",
// "silu"; "" = from the file), `corpus` (a text file to profile on; "" = the model samples its
// own text) and `profile_tokens` (0 = the pipeline's default) are optional.
// `gpu_memory` ("8G") and `gpu_layers` ("auto", a count) are the GPU options of ModelConfig
// ("" = the daemon's defaults, `serve --gpu-memory/--gpu-layers`). `target_ppl_increase` (a
// SwiGLU model's job calibrates its sparsity for it; 0 = `registry.target_ppl_increase`).
struct RegisterSpec {
  std::string path, name, activation, corpus;
  int64_t profile_tokens = 0;
  double target_ppl_increase = 0;
  std::string gpu_memory, gpu_layers;
};

// A snapshot of one registered model.
struct ModelInfo {
  std::string name, path, activation;
  ModelState state = ModelState::kRegistered;  // kRegistered, kProfiling, kReady, kFailed,
                                               // kUnloading (server/model_state.h)
  std::string stage;   // current/last job stage: "", "load", "profile", "predictors", "solve",
                       // "sidecar", "done"
  double percent = 0;  // job progress 0..100
  double eta_s = -1;   // -1 unknown
  std::string last_error;
  std::string warning;  // the model serves, but not as asked (a sidecar that does not load)
  std::string sidecar_path;
  std::string mode;                        // "dense" | "sparse" (how requests are served now)
  bool loaded = false;                     // weights in memory
  int64_t created_at = 0, updated_at = 0;  // unix seconds
  nlohmann::json placement;  // {"gpu_neurons","cpu_neurons","gpu_memory","objective"} or null
  nlohmann::json report;     // profile summary {"sparsity","recall","layers"} or null
  nlohmann::json runs_on;    // where its parts run (server/engine_report.h RunsOnJson) or null
  std::string gpu_memory, gpu_layers;  // the registration's GPU options ("" = the daemon's)
  int64_t version = 0;                 // increases on every change (for watchers)
};

// The HTTP/CLI JSON shape of one model: an object with every field of ModelInfo under the same
// names (eta_s null when unknown, last_error/warning/sidecar_path null when empty).
nlohmann::json ModelInfoJson(const ModelInfo& info);

// Thread-safe. Errors carry canonical codes: InvalidArgument (bad spec), AlreadyExists
// (duplicate name), NotFound (unknown name); messages say what to do.
class ModelAdmin {
 public:
  virtual ~ModelAdmin() = default;
  // Records the model and queues its background job. InvalidArgument, AlreadyExists.
  virtual absl::StatusOr<ModelInfo> Register(const RegisterSpec& spec) = 0;
  virtual absl::StatusOr<ModelInfo> Get(std::string_view name) = 0;  // NotFound
  virtual std::vector<ModelInfo> List() = 0;
  // Cancels its job, unloads it (in-flight requests finish first) and forgets it. NotFound.
  virtual absl::Status Delete(std::string_view name) = 0;
  // Cancels its running or queued job; the model stays usable dense (state kFailed,
  // last_error "cancelled"). NotFound; FailedPrecondition when no job is running or queued.
  virtual absl::Status Cancel(std::string_view name) = 0;
  // Blocks until the model's version > after_version or the timeout passes; returns the
  // current info (NotFound once it is deleted). Watchers poll this in a loop.
  virtual absl::StatusOr<ModelInfo> WaitForChange(std::string_view name, int64_t after_version,
                                                  std::chrono::milliseconds timeout) = 0;
};

}  // namespace thermocline::server
