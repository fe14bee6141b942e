// The models the daemon serves. Models of the config file are checked (loaded) at start-up (the
// HTTP front end is up meanwhile and answers 503 "loading"); registered models (added at run time
// by the admin API, server/model_manager.h) load lazily on their first request. Under a memory
// budget (registry.model_memory_budget) loading a model first unloads the least recently used
// others, idle ones before busy ones; any unloaded model loads again on its next request.
// A load reads its file with no registry-wide lock held (the state lock only marks the model
// loading and reserves its bytes, then publishes or drops the result), so a slow file holds up
// only its own model's requests, which wait for its one load.
//
// Ownership: a ServedModel is the stable registry entry (never freed while the daemon runs; a
// removed one stops being found). What one load produced (weights, tokenizer, prompt format) is
// a LoadedModel, shared: the registry holds it while the model is loaded, every request holds a
// ModelLease on it and every slot session a shared_ptr. Unloading only drops the registry's
// reference and asks the slots to drop their idle sessions, so the memory is freed when the last
// request on it ends, never under one. The lifecycle is an explicit state; health, the model
// list and the metrics derive from it. Each load holds the model's engine (engine/runtime/
// engine.h: dense or sparse, and where its parts run), which the slots pick up between requests.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model/llama_model.h"
#include "engine/runtime/engine.h"
#include "engine/sampling/token_trie.h"
#include "engine/sparse/sparse_plan.h"
#include "engine/util/thread_pool.h"
#include "nlohmann/json.hpp"
#include "server/chat_template.h"
#include "server/config.h"
#include "server/model_state.h"
#include "server/prompt_encoder.h"

namespace thermocline::server {

// ServedModel::state takes kLoading, kReady, kFailed, kUnloading, kUnloaded (server/
// model_state.h). kUnloaded: known, weights not in memory (a registered model before its first
// request, or one the memory budget unloaded). kUnloading: unloaded by the registry while
// requests still run on it; it becomes kUnloaded when the last of them ends and its memory is
// freed.

struct ServedModel;

// Models and bytes in memory: loaded ones and unloaded ones that requests still hold.
struct ResidentMemory {
  std::atomic<int64_t> models{0};
  std::atomic<int64_t> bytes{0};
  std::atomic<int64_t> unloads{0};  // models the registry has unloaded (budget or delete)
};

// One load of a served model. Immutable once published (the loader writes it before the
// registry publishes it); freed when the registry and every request and slot session let go.
struct LoadedModel {
  ServedModel* served = nullptr;  // its registry entry (outlives it)
  std::unique_ptr<LlamaModel> model;
  std::unique_ptr<PromptEncoder> encoder;  // over model's tokenizer: declared after it
  std::optional<ChatTemplate> chat_template;
  std::vector<int32_t> end_of_turn_tokens;  // the template's end-of-turn control token
  int64_t n_ctx = 0;                        // context of each slot's session
  uint64_t header_hash = 0;  // FNV-1a of the file's GGUF header region (its first MiB at most)
  int64_t created = 0;       // unix seconds when it became ready
  int64_t bytes = 0;         // charged against the budget: the GGUF file's size (it is mapped)
  // What the budget counts: bytes plus the engine's sparse FFN copies.
  int64_t charged_bytes() const { return bytes + engine_bytes_.load(std::memory_order_relaxed); }

  LoadedModel(ServedModel* served, std::shared_ptr<ResidentMemory> resident, int64_t bytes);
  ~LoadedModel();  // the served model turns kUnloaded when this was its unloaded instance
  LoadedModel(const LoadedModel&) = delete;
  LoadedModel& operator=(const LoadedModel&) = delete;

  const Tokenizer& tokenizer() const { return model->tokenizer(); }
  const ModelConfig& config() const;
  // True once the registry has unloaded it: slots drop their sessions of it. Lock-free.
  bool unloaded() const { return unloaded_.load(std::memory_order_acquire); }
  // Requests using it now: leases not ended (the LRU prefers to unload a model with none).
  int leases() const { return leases_.load(std::memory_order_relaxed); }
  // When it last became idle (its last lease ended, or it loaded), on the steady clock.
  std::chrono::steady_clock::time_point idle_since() const {
    return std::chrono::steady_clock::time_point(
        std::chrono::steady_clock::duration(idle_since_.load(std::memory_order_relaxed)));
  }
  // The engine requests run on (engine/runtime/engine.h): dense or sparse, with its device
  // placement; its sparse copies are shared by every slot. Replaced when the model's sidecar
  // changes (ModelRegistry::UseSidecar); a slot picks up the new one between jobs, and the old
  // one is freed when the last slot has let go of it. Never null once published. Thread-safe.
  std::shared_ptr<const Engine> engine() const;
  // The vocabulary as a byte trie for grammar-constrained requests, built on first use (once;
  // thread-safe) and shared by all of them.
  std::shared_ptr<const TokenTrie> vocab_trie() const;

 private:
  friend class ModelRegistry;
  friend class ModelLease;
  mutable std::atomic<int> leases_{0};
  mutable std::atomic<std::chrono::steady_clock::rep> idle_since_{
      std::chrono::steady_clock::now().time_since_epoch().count()};
  mutable std::atomic<bool> unloaded_{false};
  std::shared_ptr<ResidentMemory> resident_;
  // Replaces the engine (the one part of a published load that changes) and charges its host
  // bytes.
  void SetEngine(std::shared_ptr<const Engine> engine) const;
  mutable std::mutex engine_mu_;  // guards engine_
  mutable std::shared_ptr<const Engine> engine_;
  mutable std::atomic<int64_t> engine_bytes_{0};  // engine_->host_bytes(), charged
  mutable std::once_flag trie_once_;
  mutable std::shared_ptr<const TokenTrie> vocab_trie_;
};

// A request's hold on a loaded model: keeps it in memory and counts it as busy until EndUse.
// Move-only.
class ModelLease {
 public:
  ModelLease() = default;
  explicit ModelLease(std::shared_ptr<const LoadedModel> model);
  ModelLease(ModelLease&& other) noexcept
      : model_(std::move(other.model_)), busy_(std::exchange(other.busy_, false)) {}
  ModelLease& operator=(ModelLease&& other) noexcept;
  ModelLease(const ModelLease&) = delete;
  ModelLease& operator=(const ModelLease&) = delete;
  ~ModelLease() { Release(); }

  const LoadedModel* get() const { return model_.get(); }
  const LoadedModel* operator->() const { return model_.get(); }
  const LoadedModel& operator*() const { return *model_; }
  explicit operator bool() const { return model_ != nullptr; }
  const std::shared_ptr<const LoadedModel>& shared() const { return model_; }
  // The request has stopped computing on the model (its generation is over; the answer may
  // still read the tokenizer): it no longer counts as busy, the memory is still held.
  void EndUse();

 private:
  void Release();
  std::shared_ptr<const LoadedModel> model_;
  bool busy_ = false;
};

// One served model: the registry's stable entry. `config`, `index` and `registered` never change.
struct ServedModel {
  ModelConfig config;
  int index = 0;            // position in the registry; slots keep one session per index
  bool registered = false;  // added through the admin API (lazy), not from the config
  std::atomic<ModelState> state{ModelState::kLoading};
  std::atomic<bool> removed{false};
  std::atomic<uint64_t> last_use{0};  // the registry's use counter at its last request (LRU)
  // How long the model stays loaded once idle (Ollama's keep_alive), in milliseconds; < 0:
  // until the memory budget or a delete unloads it (the default). ModelRegistry::SetKeepAlive.
  std::atomic<int64_t> keep_alive_ms{-1};

  // The loaded instance; null when it is not loaded. Thread-safe.
  std::shared_ptr<const LoadedModel> loaded() const;
  bool ready() const { return state.load(std::memory_order_acquire) == ModelState::kReady; }
  // Why it failed to load (kFailed). Thread-safe.
  std::string error() const;
  // "sparse" or "dense": how requests are served (an unloaded model: once it loads).
  // Thread-safe.
  const char* mode() const;
  // The sidecar the model is served from, or will be once it loads; "" when none. Thread-safe.
  std::string sidecar_path() const;
  // What deserves a word although the model serves (its sidecar did not load: served dense);
  // "" when nothing. Thread-safe.
  std::string warning() const;

 private:
  friend class ModelRegistry;
  friend struct LoadedModel;
  // guards loaded_, sidecar_, pending_sidecar_, error_, warning_, pinned_; a leaf lock
  mutable std::mutex mu_;
  std::shared_ptr<const LoadedModel> loaded_;
  std::string sidecar_;          // the loaded engine's sidecar ("" dense or not from a sidecar)
  std::string pending_sidecar_;  // to use when the (unloaded) model loads
  std::string error_;
  std::string warning_;
  // The file its first load read: a later load (after an unload) must find the same file, or
  // the name would silently serve other weights.
  struct Pin {
    GgufFileStamp stamp;
    uint64_t header_hash = 0;
  };
  std::optional<Pin> pinned_;
  std::atomic<int> unloading_{0};  // unloaded instances still alive (in use)
  // A load in flight, guarded by ModelRegistry::load_mu_ (the load itself reads the file without
  // it): whether it is to be dropped when it ends (the model was unloaded meanwhile), and how
  // many loads have ended (their waiters wake on it).
  bool loading_ = false;
  bool drop_load_ = false;
  uint64_t loads_ended_ = 0;
  // One sidecar switch at a time (UseSidecar); taken before ModelRegistry::load_mu_.
  std::mutex switch_mu_;
};

// How the registry builds each model's engine.
struct RegistryOptions {
  int64_t memory_budget = 0;  // bytes of models loaded at once (0: unlimited)
  int64_t max_batch = 64;     // prefill chunk of every session
  int build_threads = 1;      // threads that build the sparse copies at load
  // Context of a model that sets no n_ctx: its training context, at most this (a file may claim
  // millions of positions, whose KV cache no machine holds).
  int64_t max_context = 32768;
  // Test seam: runs on the loading thread, with no registry lock held, before a load opens the
  // model's file (the daemon's [debug] load_delay_ms sleeps here). Null: nothing.
  std::function<void(const ModelConfig&)> before_load;
};

class ModelRegistry {
 public:
  explicit ModelRegistry(const std::vector<ModelConfig>& configs,
                         const RegistryOptions& options = {});
  ~ModelRegistry();  // StopIdleUnloader()

  // Loads every configured model in order (blocking; run it on a loader thread); under a memory
  // budget the ones that do not fit are unloaded again once checked. Returns the first error;
  // the failed model is marked kFailed. Lazy loads wait until it has run.
  absl::Status LoadAll();

  // For a request: the model's lease, loading it first (on the calling thread, seconds for a
  // large one) when it is not in memory, unloading the least recently used others when the
  // budget needs room. A request that finds the model loading waits for that load instead of
  // loading it again. NotFound for an unknown name (or one deleted during its load),
  // Unavailable while the configured models load or when it fails to load.
  absl::StatusOr<ModelLease> FindOrLoad(std::string_view name);
  // Snapshot of the models not removed, in registry order. Thread-safe.
  std::vector<ServedModel*> models() const;
  // True once the configured models have been loaded (registered models load on demand).
  bool all_ready() const { return started_.load(std::memory_order_acquire); }

  // Run-time changes (the admin API). Add: AlreadyExists when the name is taken. The model
  // starts kUnloaded and loads on its first request.
  absl::StatusOr<ServedModel*> Add(const ModelConfig& config);
  // Stops finding the model and unloads it (requests in flight finish on it first); a load of
  // it in flight is dropped when it ends.
  absl::Status Remove(std::string_view name);
  // Serves `name` sparse from a sidecar (checked against the model when it is loaded, else when
  // it loads); "" serves it dense again. Slots switch between requests. Waits for a load of the
  // model in flight (and blocks only other switches of this model); reads the sidecar and builds
  // the engine with no registry lock held.
  absl::Status UseSidecar(std::string_view name, const std::string& sidecar_path);
  // Any state, removed excluded; null when unknown.
  ServedModel* Lookup(std::string_view name) const;
  // Checks the files of the loaded models (a stat each): one that was truncated, rewritten,
  // replaced or deleted since it was loaded, or whose mapping faulted, is unloaded and marked
  // kFailed with why. FindOrLoad does it for the model it serves; the model lists call it.
  void CheckFiles();

  // Idle unloading (Ollama's keep_alive): `m` stays loaded for `keep_alive` after it becomes
  // idle (no request on it), then unloads; it loads again on its next request. A negative
  // duration: no idle unloading (the default). The first finite one starts the idle unloader's
  // thread. Thread-safe.
  void SetKeepAlive(ServedModel* m, std::chrono::milliseconds keep_alive);
  // When `m` unloads if it stays idle; nullopt when it is not loaded or has no keep_alive.
  std::optional<std::chrono::steady_clock::time_point> ExpiresAt(const ServedModel& m) const;
  // Unloads `m` now (requests in flight finish on it first); a load of it in flight is dropped
  // when it ends. False when it was neither loaded nor loading.
  bool Unload(ServedModel* m, const char* why);
  // Stops and joins the idle unloader (before the unload listener's target goes away).
  void StopIdleUnloader();

  // Called after models were unloaded (before the model that needed the room loads), so that the
  // owner of the slot sessions drops those of the unloaded models (Scheduler::ReleaseUnloaded)
  // and their memory is freed. It runs under the registry's state lock: it must not call back
  // into the registry, nor block. Set it before requests arrive.
  void set_unload_listener(std::function<void()> listener) {
    unload_listener_ = std::move(listener);
  }

  int64_t memory_budget() const { return memory_budget_; }
  // Models and bytes in memory, unloaded ones still in use included; models unloaded so far.
  const ResidentMemory& resident() const { return *resident_; }

 private:
  // NotFound or Unavailable (loading, failed) for a model that cannot serve now.
  absl::Status Unservable(std::string_view name, const ServedModel* m) const;
  // Everything a load reads: the file (opened, mapped, parsed, its weights checked), the chat
  // template, the sidecar, the engine built over them. No registry lock held.
  absl::StatusOr<std::shared_ptr<LoadedModel>> Load(ServedModel* m, std::string* sidecar);
  // Unloads `l`, m's loaded instance, and marks m kFailed when its file changed under it (see
  // CheckFiles). True when it did.
  bool FailIfFileChanged(ServedModel* m, const std::shared_ptr<const LoadedModel>& l);
  // Loads `m` (neither loaded nor loading), `need` bytes: marks it loading and reserves the bytes
  // (first making room when `make_room`), releases `lock` (load_mu_) for Load, then takes it
  // again to publish the instance, or to drop it when m was removed or unloaded meanwhile.
  absl::Status LoadLocked(std::unique_lock<std::mutex>& lock, ServedModel* m, int64_t need,
                          bool make_room);
  // Unloads the least recently used models other than `keep` until `need` more bytes fit the
  // budget beside the loaded models and the loads in flight; sets *unloaded when it unloaded
  // any. False when `need` fits only once a load in flight has ended. load_mu_ held.
  bool MakeRoomLocked(const ServedModel* keep, int64_t need, bool* unloaded);
  // Drops the registry's reference to m's instance. load_mu_ held.
  void UnloadLocked(ServedModel* m, const char* why);
  void NotifyUnloaded();
  // The idle unloader's thread: unloads idle models whose keep_alive has run out.
  void IdleUnloaderMain();
  // The sparse plan a model should use at load: its pending sidecar (from its job), the config's
  // (offline::ResolveSparsePlan: explicit, beside the model, a PowerInfer file's own), or dense.
  absl::StatusOr<std::optional<SparsePlan>> ResolveSparse(ServedModel* m, const LlamaModel& model,
                                                          std::string* sidecar);
  // The model's engine over `plan`, with the config's GPU options.
  absl::StatusOr<std::shared_ptr<const Engine>> BuildEngine(const ServedModel* m,
                                                            const LoadedModel& l,
                                                            std::optional<SparsePlan> plan);

  const int64_t memory_budget_;
  const RegistryOptions options_;
  const std::shared_ptr<ResidentMemory> resident_ = std::make_shared<ResidentMemory>();
  std::atomic<uint64_t> use_clock_{0};
  std::atomic<bool> started_{false};
  std::function<void()> unload_listener_;
  // The registry's state lock: what is loaded, the loads in flight and their reserved bytes,
  // unloads. Held only to read or change that state, never across file I/O (a load reads its
  // file without it), so one slow file blocks nothing but its own model's requests. Taken before
  // mu_ and ServedModel::mu_.
  std::mutex load_mu_;
  std::condition_variable load_cv_;  // a load ended (ServedModel::loads_ended_)
  int64_t loading_bytes_ = 0;        // reserved by the loads in flight; load_mu_
  mutable std::mutex mu_;            // guards models_ (the vector; entries are stable)
  std::vector<std::unique_ptr<ServedModel>> models_;

  std::mutex idle_mu_;  // guards the three below; a leaf lock
  std::condition_variable idle_cv_;
  std::thread idle_thread_;
  bool idle_stop_ = false;
};

}  // namespace thermocline::server
