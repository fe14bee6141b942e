// The models the daemon serves. Models of the config file load in the background at start-up
// (the HTTP front end is up meanwhile and answers 503 "loading"); registered models (added at
// run time by the admin API, server/model_jobs.h) load lazily on their first request. The
// registry only grows: a removed model stops being found but its entry stays, so the pointers
// that jobs and slots hold never dangle. The lifecycle is an explicit state; health and the
// model list derive from it. Each model may carry a sparse source (a validated sidecar) that
// the slots pick up between requests.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model/llama_model.h"
#include "nlohmann/json.hpp"
#include "offline/sidecar/sidecar.h"
#include "server/chat_template.h"
#include "server/config.h"
#include "server/prompt_encoder.h"

namespace thermocline::server {

// kUnloaded: known, weights not in memory (a registered model before its first request).
enum class ModelState { kLoading, kReady, kFailed, kUnloaded };
const char* ModelStateName(ModelState s);

// A sidecar checked against the served model: what the slots build their SparseFfn from.
struct SparseSource {
  offline::Sidecar sidecar;
  std::string path;
  nlohmann::json placement;  // {"gpu_neurons","cpu_neurons","gpu_memory","objective"} or null
  nlohmann::json report;     // {"sparsity","recall","layers"}
};
// The summaries of a sidecar (also what the admin API shows).
nlohmann::json PlacementSummary(const offline::Sidecar& sidecar);
nlohmann::json ReportSummary(const offline::Sidecar& sidecar);

// One served model. `model`, `encoder`, `chat_template`, `end_of_turn_tokens` and `n_ctx` are
// written once by the loader before `state` becomes kReady (release) and only read after
// (acquire); they are never freed while the daemon runs.
struct ServedModel {
  ModelConfig config;
  int index = 0;            // position in the registry; slots keep one session per index
  bool registered = false;  // added through the admin API (lazy), not from the config
  int64_t created = 0;      // unix seconds when it became ready
  std::atomic<ModelState> state{ModelState::kLoading};
  std::atomic<bool> removed{false};
  mutable std::atomic<int64_t> last_used{0};  // unix seconds of the last request
  std::string error;                          // when kFailed

  std::unique_ptr<LlamaModel> model;
  std::unique_ptr<PromptEncoder> encoder;
  std::optional<ChatTemplate> chat_template;
  std::vector<int32_t> end_of_turn_tokens;  // the template's end-of-turn control token
  int64_t n_ctx = 0;                        // context of each slot's session

  const Tokenizer& tokenizer() const { return model->tokenizer(); }
  bool ready() const { return state.load(std::memory_order_acquire) == ModelState::kReady; }

  // Thread-safe. null: served dense.
  std::shared_ptr<const SparseSource> sparse_source() const;
  void set_sparse_source(std::shared_ptr<const SparseSource> source);
  // "sparse" or "dense": how requests are served (an unloaded model: once it loads).
  const char* mode() const;

 private:
  friend class ModelRegistry;
  mutable std::mutex mu_;  // guards sparse_, pending_sidecar_
  std::mutex load_mu_;     // one loader at a time
  std::shared_ptr<const SparseSource> sparse_;
  std::string pending_sidecar_;  // to use when the (unloaded) model loads
};

class ModelRegistry {
 public:
  explicit ModelRegistry(const std::vector<ModelConfig>& configs);

  // Loads every configured model in order (blocking; run it on a loader thread). Returns the
  // first error; the failed model is marked kFailed.
  absl::Status LoadAll();

  // For a request: NotFound for an unknown name, Unavailable while it loads, when it failed,
  // or when it is not loaded (FindOrLoad loads it).
  absl::StatusOr<const ServedModel*> Find(std::string_view name) const;
  // As Find, but loads an unloaded model first on the calling thread (seconds for a large one).
  absl::StatusOr<const ServedModel*> FindOrLoad(std::string_view name);
  // Snapshot of the models not removed, in registry order. Thread-safe.
  std::vector<ServedModel*> models() const;
  // True when every configured model is ready (registered models load on demand).
  bool all_ready() const;

  // Run-time changes (the admin API). Add: AlreadyExists when the name is taken. The model
  // starts kUnloaded and loads on its first request.
  absl::StatusOr<ServedModel*> Add(const ModelConfig& config);
  // Stops finding the model. Its memory stays until the daemon restarts (in-flight requests and
  // slot sessions may still use it).
  absl::Status Remove(std::string_view name);
  // Serves `name` sparse from a sidecar (checked against the model when it is loaded, else when
  // it loads); "" serves it dense again. Slots switch between requests.
  absl::Status UseSidecar(std::string_view name, const std::string& sidecar_path);
  // Any state, removed excluded; null when unknown.
  ServedModel* Lookup(std::string_view name) const;

 private:
  absl::Status Load(ServedModel* m);
  absl::Status LoadOne(ServedModel* m);  // Load + state transitions + log
  // The sidecar a model should use at load: explicit, pending, or beside the model (auto).
  absl::StatusOr<std::shared_ptr<const SparseSource>> ResolveSparse(ServedModel* m);

  mutable std::mutex mu_;  // guards models_ (the vector; entries are stable)
  std::vector<std::unique_ptr<ServedModel>> models_;
};

}  // namespace thermocline::server
