#include "server/model_manager.h"

#include <ctime>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "engine/model/model_support.h"
#include "engine/util/byte_size.h"
#include "server/engine_report.h"
#include "server/errors.h"
#include "server/model_job.h"
#include "spdlog/spdlog.h"

namespace thermocline::server {
namespace {

namespace fs = std::filesystem;

int64_t Now() { return static_cast<int64_t>(std::time(nullptr)); }

// Names become directory names and URL path segments: keep them plain.
bool ValidName(std::string_view name) {
  if (name.empty() || name.size() > 64 || name == "." || name == "..") return false;
  for (char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '_' || c == '-' || c == ':';
    if (!ok) return false;
  }
  return name.front() != '.';
}

nlohmann::json ParseOrNull(const std::string& text) {
  if (text.empty()) return nullptr;
  return nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
}

// How a registered model is served: dense until its job publishes a sidecar; its GPU options,
// else the daemon's.
ModelConfig ServedConfig(const ModelRecord& r, const ServerConfig& daemon) {
  ModelConfig mc;
  mc.path = r.path;
  mc.name = r.name;
  mc.activation = r.activation;
  mc.sparse = "off";
  mc.gpu_memory = r.gpu_memory.empty() ? daemon.gpu_memory : r.gpu_memory;
  mc.gpu_layers = r.gpu_layers.empty() ? daemon.gpu_layers : r.gpu_layers;
  return mc;
}

}  // namespace

// Relays a job's progress into its entry; cancels when asked or when the daemon stops.
class ModelManager::Observer : public ModelJobObserver {
 public:
  Observer(ModelManager* m, std::string name, uint64_t id)
      : m_(m), name_(std::move(name)), id_(id) {}

  bool OnProgress(const std::string& stage, double percent) override {
    std::lock_guard<std::mutex> lock(m_->mu_);
    Entry* e = m_->FindLocked(name_);
    if (e == nullptr || e->id != id_) return false;  // deleted
    const bool new_stage = e->record.stage != stage;
    if (new_stage) {
      ModelRecord next = e->record;
      next.stage = stage;
      // A job whose progress cannot be stored stops (its result could not be stored either).
      if (!m_->CommitJobLocked(*e, std::move(next), "its stage")) {
        m_->BumpLocked(*e);
        return false;
      }
    }
    const double elapsed =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - e->job_start).count();
    // Coalesced: a watcher hears every stage and every half percent, not every callback.
    if (new_stage || percent >= e->percent + 0.5 || percent >= 100) {
      e->percent = percent;
      e->eta_s = percent >= 2 ? elapsed * (100 - percent) / percent : -1;
      m_->BumpLocked(*e);
    }
    return !m_->stopping_ && !e->cancel->load();
  }

  void OnStageDone(const std::string& stage) override {
    spdlog::info("job '{}': stage {} done", name_, stage);
  }

 private:
  ModelManager* m_;
  std::string name_;
  uint64_t id_;
};

ModelManager::ModelManager(const ServerConfig& config, ModelRegistry* registry,
                           std::unique_ptr<RegistryStore> store)
    : config_(config), registry_(registry), store_(std::move(store)) {}

ModelManager::~ModelManager() { Stop(); }

std::string ModelManager::JobDir(const std::string& name) const {
  return (fs::path(store_->dir()) / "models" / name).string();
}

void ModelManager::RemoveArtefacts(const std::string& name) {
  std::error_code ec;
  fs::remove_all(JobDir(name), ec);
  if (ec) spdlog::warn("cannot remove {}: {}", JobDir(name), ec.message());
}

ModelManager::Entry* ModelManager::FindLocked(std::string_view name) {
  auto it = entries_.find(name);
  return it == entries_.end() ? nullptr : &it->second;
}

void ModelManager::BumpLocked(Entry& e) {
  e.version = ++version_;
  changed_.notify_all();
}

absl::Status ModelManager::PersistLocked(Entry& e) {
  e.record.updated_at = Now();
  return store_->Update(e.record);
}

bool ModelManager::CommitJobLocked(Entry& e, ModelRecord next, std::string_view what) {
  next.updated_at = Now();
  if (absl::Status s = store_->Update(next); !s.ok()) {
    e.store_error = absl::StrCat(ToAbsl(what), " could not be stored (", s.message(), ")");
    spdlog::error("model '{}': the job stopped: {}", e.record.name, e.store_error);
    return false;
  }
  e.record = std::move(next);
  e.store_error.clear();
  return true;
}

void ModelManager::QueueLocked(Entry& e) {
  e.queued = true;
  e.percent = 0;
  e.eta_s = -1;
  queue_.emplace_back(e.record.name, e.id);
  changed_.notify_all();
}

ModelInfo ModelManager::InfoLocked(const Entry& e) const {
  ModelInfo info;
  const ModelRecord& r = e.record;
  info.name = r.name;
  info.path = r.path;
  info.activation = r.activation;
  info.state = r.state;
  info.stage = r.stage;
  info.percent = r.state == ModelState::kReady ? 100 : e.percent;
  info.eta_s = e.running ? e.eta_s : -1;
  info.last_error = r.last_error;
  info.sidecar_path = r.sidecar_path;
  info.created_at = r.created_at;
  info.updated_at = r.updated_at;
  info.placement = ParseOrNull(r.placement_json);
  info.report = ParseOrNull(r.report_json);
  info.version = e.version;
  info.gpu_memory = r.gpu_memory;
  info.gpu_layers = r.gpu_layers;
  if (!e.store_error.empty()) {
    info.state = ModelState::kFailed;
    info.last_error =
        absl::StrCat("the job stopped: ", e.store_error, "; the registry database still says ",
                     ModelStateName(r.state),
                     IsSettled(r.state) ? ""
                                        : ", so the job runs again at the next start (or delete "
                                          "the model and register it again)");
  }
  info.mode = "dense";
  if (const ServedModel* m = registry_->Lookup(r.name)) {
    info.mode = m->mode();
    info.warning = m->warning();
    // Served, it failed: its file changed under it, or it does not load. The job's state says
    // nothing of that, so the served model's failure shows through.
    if (m->state.load(std::memory_order_acquire) == ModelState::kFailed &&
        r.state != ModelState::kUnloading) {
      info.state = ModelState::kFailed;
      if (const std::string error = m->error(); !error.empty()) info.last_error = error;
    }
    const std::shared_ptr<const LoadedModel> l = m->loaded();
    info.loaded = l != nullptr;
    if (l != nullptr) info.runs_on = RunsOnJson(l->engine()->placement());
  }
  return info;
}

absl::Status ModelManager::Start() {
  auto records = store_->LoadAll();
  if (!records.ok()) return records.status();
  std::lock_guard<std::mutex> lock(mu_);
  for (ModelRecord& r : *records) {
    if (r.state == ModelState::kUnloading) {  // a delete that did not finish
      if (absl::Status s = store_->Delete(r.name); !s.ok()) return s;
      RemoveArtefacts(r.name);
      continue;
    }
    if (auto added = registry_->Add(ServedConfig(r, config_)); !added.ok()) {
      spdlog::error("registered model '{}' is not served: {}", r.name,
                    std::string(added.status().message()));
      continue;
    }
    Entry& e = entries_[r.name];
    e.id = next_id_++;
    e.record = r;
    std::error_code ec;
    if (r.state == ModelState::kReady) {
      if (!r.sidecar_path.empty() && fs::exists(r.sidecar_path, ec)) {
        if (absl::Status s = registry_->UseSidecar(r.name, r.sidecar_path); !s.ok()) {
          spdlog::warn("model '{}': {}", r.name, std::string(s.message()));
        }
      } else {
        spdlog::warn("model '{}': its sidecar {} is gone; profiling it again", r.name,
                     r.sidecar_path);
        e.record.state = ModelState::kRegistered;
        e.record.stage = "";
        e.record.sidecar_path = "";
        if (absl::Status s = PersistLocked(e); !s.ok()) return s;
        QueueLocked(e);
      }
    } else if (r.state == ModelState::kRegistered || r.state == ModelState::kProfiling) {
      spdlog::info("model '{}': its job was interrupted (state {}, stage '{}'); resuming", r.name,
                   ModelStateName(r.state), r.stage);
      QueueLocked(e);
    }
    BumpLocked(e);
  }
  spdlog::info("registry: {} registered model(s) in {}", entries_.size(), store_->dir());
  for (int i = 0; i < config_.jobs; ++i) workers_.emplace_back([this] { WorkerMain(); });
  return absl::OkStatus();
}

void ModelManager::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    changed_.notify_all();
  }
  for (std::thread& t : workers_) t.join();
  workers_.clear();
}

absl::StatusOr<ModelInfo> ModelManager::Register(const RegisterSpec& spec) {
  if (!ValidName(spec.name)) {
    return InvalidRequest("name",
                          spec.name.empty() ? "missing_required_parameter" : "invalid_value",
                          "'name' must be 1-64 characters of letters, digits, '.', '_', '-', ':' "
                          "(not starting with '.')");
  }
  if (spec.path.empty()) {
    return InvalidRequest("path", "missing_required_parameter",
                          "'path' must name the GGUF model file");
  }
  if (!spec.activation.empty()) {
    if (auto act = ParseActivation(spec.activation); !act.ok()) {
      return InvalidRequest("activation", "invalid_value",
                            "'activation' must be one of relu, drelu, silu");
    }
  }
  {
    ModelConfig gpu;
    gpu.name = spec.name;
    gpu.gpu_memory = spec.gpu_memory;
    gpu.gpu_layers = spec.gpu_layers;
    uint64_t bytes = 0;
    int64_t layers = 0;
    if (absl::Status s = ApplyGpuConfig(gpu, &bytes, &layers); !s.ok()) {
      const bool memory = !spec.gpu_memory.empty() && !ParseByteSize(spec.gpu_memory).ok();
      return InvalidRequest(memory ? "gpu_memory" : "gpu_layers", "invalid_value",
                            memory ? "'gpu_memory' must be a byte count such as \"8G\" or "
                                     "\"512M\""
                                   : "'gpu_layers' must be \"auto\" or a number of layers");
    }
  }
  if (spec.profile_tokens < 0 || spec.profile_tokens > (int64_t{1} << 30)) {
    return InvalidRequest("profile_tokens", "invalid_value",
                          "'profile_tokens' must be in [0, 2^30] (0: the daemon's default)");
  }
  if (!(spec.target_ppl_increase >= 0 && spec.target_ppl_increase < 10)) {
    return InvalidRequest("target_ppl_increase", "invalid_value",
                          "'target_ppl_increase' must be in [0, 10) (0.02 = +2%; 0: the "
                          "daemon's default)");
  }
  std::error_code ec;
  std::string corpus;
  if (!spec.corpus.empty()) {
    corpus = fs::absolute(spec.corpus, ec).lexically_normal().string();
    if (!fs::is_regular_file(corpus, ec)) {
      return InvalidRequest("corpus", "invalid_value",
                            absl::StrCat("the corpus ", spec.corpus,
                                         " is not a readable file; give a text file or omit it "
                                         "(the model then profiles text it samples itself)"));
    }
  }
  ModelRecord r;
  r.name = spec.name;
  r.path = fs::absolute(spec.path, ec).lexically_normal().string();
  if (auto id = IdentifyFile(r.path); id.ok()) {
    r.identity = *id;
    // A GGUF file we can parse: an architecture, tokenizer or tensor the engine cannot run is
    // refused now, before a job starts on it. A missing or unreadable file fails in its job (the
    // job's error says why; a file can appear or be fixed later).
    if (absl::StatusOr<std::unique_ptr<GgufFile>> file = GgufFile::Open(r.path); file.ok()) {
      ModelOptions mo;
      if (!spec.activation.empty()) mo.activation = *ParseActivation(spec.activation);
      if (absl::StatusOr<ModelSupport> support = CheckModelSupported(**file, mo); !support.ok()) {
        return InvalidRequest("path", "unsupported_model",
                              absl::StrCat(spec.path, ": ", support.status().message()));
      }
    }
  }
  r.activation = spec.activation;
  r.corpus = corpus;
  r.profile_tokens = spec.profile_tokens > 0 ? spec.profile_tokens : config_.profile_tokens;
  r.gpu_memory = spec.gpu_memory;
  r.gpu_layers = spec.gpu_layers;
  r.target_ppl_increase = spec.target_ppl_increase;
  r.created_at = r.updated_at = Now();

  std::lock_guard<std::mutex> lock(mu_);
  if (FindLocked(spec.name) != nullptr || registry_->Lookup(spec.name) != nullptr) {
    return absl::AlreadyExistsError(absl::StrCat("a model named '", spec.name,
                                                 "' already exists; delete it first or pick "
                                                 "another name"));
  }
  if (undeleted_rows_.contains(r.name)) {  // a delete of this name left its row behind
    if (absl::Status s = store_->Delete(r.name); !s.ok() && !absl::IsNotFound(s)) return s;
    undeleted_rows_.erase(r.name);
  }
  RemoveArtefacts(r.name);  // of an earlier model of this name
  if (absl::Status s = store_->Insert(r); !s.ok()) return s;
  if (auto added = registry_->Add(ServedConfig(r, config_)); !added.ok()) {
    store_->Delete(r.name).IgnoreError();
    return added.status();
  }
  Entry& e = entries_[r.name];
  e.id = next_id_++;
  e.record = r;
  QueueLocked(e);
  BumpLocked(e);
  spdlog::info("model '{}' registered ({}); job queued", r.name, r.path);
  return InfoLocked(e);
}

absl::StatusOr<ModelInfo> ModelManager::Get(std::string_view name) {
  std::lock_guard<std::mutex> lock(mu_);
  const Entry* e = FindLocked(name);
  if (e == nullptr) {
    return NotFound("model_not_found", absl::StrCat("no registered model named '", ToAbsl(name),
                                                    "'; GET /admin/models lists them"));
  }
  return InfoLocked(*e);
}

std::vector<ModelInfo> ModelManager::List() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<ModelInfo> out;
  for (const auto& [name, e] : entries_) out.push_back(InfoLocked(e));
  std::sort(out.begin(), out.end(), [](const ModelInfo& a, const ModelInfo& b) {
    return a.created_at != b.created_at ? a.created_at < b.created_at : a.name < b.name;
  });
  return out;
}

absl::Status ModelManager::Delete(std::string_view name) {
  bool running = false;
  std::string key(name);
  {
    std::lock_guard<std::mutex> lock(mu_);
    Entry* e = FindLocked(name);
    if (e == nullptr) {
      return NotFound("model_not_found",
                      absl::StrCat("no registered model named '", ToAbsl(name), "'"));
    }
    // Durable first: a crash after this finishes the delete at the next start. When it cannot
    // be written (a full disk), nothing has changed, in memory either.
    const ModelRecord before = e->record;
    e->record.state = ModelState::kUnloading;
    if (absl::Status s = PersistLocked(*e); !s.ok()) {
      e->record = before;
      return s;
    }
    running = e->running;
    if (e->cancel) e->cancel->store(true);
    std::erase_if(queue_, [&](const auto& q) { return q.first == key; });
    registry_->Remove(name).IgnoreError();
    // The delete is decided (the row says unloading): when the row itself cannot be removed
    // now, the next start-up removes it, and a registration of the name first retries.
    if (absl::Status s = store_->Delete(key); !s.ok()) {
      spdlog::warn("model '{}': its registry row is removed at the next start ({})", key,
                   std::string(s.message()));
      undeleted_rows_.insert(key);
    }
    entries_.erase(entries_.find(name));
    changed_.notify_all();
  }
  // A running job notices the cancel at its next progress report and removes its artefacts.
  if (!running) RemoveArtefacts(key);
  spdlog::info("model '{}' deleted", key);
  return absl::OkStatus();
}

absl::Status ModelManager::Cancel(std::string_view name) {
  std::lock_guard<std::mutex> lock(mu_);
  Entry* e = FindLocked(name);
  if (e == nullptr) {
    return NotFound("model_not_found",
                    absl::StrCat("no registered model named '", ToAbsl(name), "'"));
  }
  if (e->running) {
    e->cancel->store(true);
    return absl::OkStatus();
  }
  if (e->queued) {
    const ModelRecord before = e->record;
    e->record.state = ModelState::kFailed;
    e->record.last_error =
        "cancelled before it started; the model is served dense (register it again to profile)";
    if (absl::Status s = PersistLocked(*e); !s.ok()) {
      e->record = before;  // still queued, as the database says
      return s;
    }
    const std::string key(name);
    std::erase_if(queue_, [&](const auto& q) { return q.first == key; });
    e->queued = false;
    BumpLocked(*e);
    return absl::OkStatus();
  }
  return absl::FailedPreconditionError(absl::StrCat("model '", ToAbsl(name),
                                                    "' has no running or queued job (state ",
                                                    ModelStateName(e->record.state), ")"));
}

absl::StatusOr<ModelInfo> ModelManager::WaitForChange(std::string_view name, int64_t after_version,
                                                      std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    const Entry* e = FindLocked(name);
    if (e == nullptr) {
      return NotFound("model_not_found",
                      absl::StrCat("no registered model named '", ToAbsl(name), "'"));
    }
    if (e->version > after_version || stopping_) return InfoLocked(*e);
    if (changed_.wait_until(lock, deadline) == std::cv_status::timeout) {
      e = FindLocked(name);
      if (e == nullptr) {
        return NotFound("model_not_found",
                        absl::StrCat("no registered model named '", ToAbsl(name), "'"));
      }
      return InfoLocked(*e);
    }
  }
}

void ModelManager::WorkerMain() {
  while (true) {
    std::pair<std::string, uint64_t> job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      changed_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (stopping_) return;
      job = queue_.front();
      queue_.pop_front();
    }
    RunJob(job.first, job.second);
  }
}

void ModelManager::RunJob(const std::string& name, uint64_t id) {
  ModelJobSpec spec;
  {
    std::lock_guard<std::mutex> lock(mu_);
    Entry* e = FindLocked(name);
    if (e == nullptr || e->id != id) return;
    e->queued = false;
    e->percent = 0;
    e->eta_s = -1;
    ModelRecord next = e->record;
    next.state = ModelState::kProfiling;
    next.last_error = "";
    if (!CommitJobLocked(*e, std::move(next), "its start")) {  // not started: nothing to undo
      BumpLocked(*e);
      return;
    }
    e->running = true;
    e->cancel = std::make_shared<std::atomic<bool>>(false);
    e->job_start = std::chrono::steady_clock::now();
    BumpLocked(*e);
    spec.name = name;
    spec.path = e->record.path;
    spec.activation = e->record.activation;
    spec.corpus = e->record.corpus;
    spec.profile_tokens = e->record.profile_tokens;
    spec.target_ppl_increase = e->record.target_ppl_increase;
    // Solved for the cap it will run under.
    const ModelConfig served = ServedConfig(e->record, config_);
    int64_t ignored = 0;
    if (!ApplyGpuConfig(served, &spec.gpu_memory, &ignored).ok()) spec.gpu_memory = 0;
    spec.context = served.n_ctx;
    if (!ParseKvType(served.kv_type, &spec.kv_type)) spec.kv_type = KvType::kF16;
  }
  spec.max_batch = config_.max_batch;
  spec.dir = JobDir(name);
  spec.solve_time_limit_s = config_.solve_time_limit_s;
  if (spec.target_ppl_increase <= 0) spec.target_ppl_increase = config_.target_ppl_increase;
  spec.speed_check = config_.speed_check;
  spec.threads = config_.threads_per_slot;
  spec.stage_delay_ms = config_.job_stage_delay_ms;

  // The file must still be the one registered.
  absl::StatusOr<ModelJobResult> result = absl::UnknownError("");
  auto identity = IdentifyFile(spec.path);
  FileIdentity registered;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (Entry* e = FindLocked(name); e != nullptr && e->id == id) registered = e->record.identity;
  }
  if (!identity.ok()) {
    result = identity.status();
  } else if (!registered.hash.empty() && !(*identity == registered)) {
    result = absl::FailedPreconditionError(
        absl::StrCat("the model file ", spec.path,
                     " changed since it was registered; delete the model and register it again"));
  } else {
    absl::Status hw_status;
    {
      std::lock_guard<std::mutex> hw_lock(hardware_mu_);
      if (!have_hardware_) {
        auto hw = HardwareProfileFor(store_->dir(), config_.hardware, spec.threads);
        if (hw.ok()) {
          hardware_ = *hw;
          have_hardware_ = true;
        } else {
          hw_status = hw.status();
        }
      }
      spec.hardware = hardware_;
    }
    if (!hw_status.ok()) {
      result = hw_status;
    } else {
      Observer observer(this, name, id);
      result = RunModelJob(spec, observer);
    }
  }

  std::unique_lock<std::mutex> lock(mu_);
  Entry* e = FindLocked(name);
  if (e == nullptr || e->id != id) {  // deleted meanwhile (and not registered again)
    if (e == nullptr) RemoveArtefacts(name);
    return;
  }
  e->running = false;
  // Stopped because its stage could not be stored: it ends failed, saying so.
  const std::string store_error = e->store_error;
  ModelRecord next = e->record;
  if (identity.ok() && next.identity.hash.empty()) next.identity = *identity;
  if (result.ok()) {
    next.sidecar_path = result->sidecar_path;
    next.placement_json = result->placement.dump();
    next.report_json = result->report.dump();
    next.stage = "done";
    next.state = ModelState::kReady;
  } else if (absl::IsCancelled(result.status()) && stopping_ && store_error.empty()) {
    // The daemon is stopping: leave the job resumable at the next start.
    spdlog::info("job '{}' interrupted by shutdown; it resumes at the next start", name);
    return;
  } else {
    next.state = ModelState::kFailed;
    if (!store_error.empty()) {
      next.last_error = absl::StrCat("the job stopped: ", store_error);
    } else if (absl::IsCancelled(result.status())) {
      next.last_error = "cancelled; the model is served dense (register it again to profile it)";
    } else {
      next.last_error = std::string(result.status().message());
    }
  }
  // Not stored, the result is not applied either (the model stays dense; the next start runs
  // the job again): memory says what the database says, and the API says why.
  if (!CommitJobLocked(*e, std::move(next), result.ok() ? "its result" : "its failure")) {
    if (!store_error.empty()) e->store_error = store_error;  // the first cause
    BumpLocked(*e);
    return;
  }
  if (result.ok()) {
    e->percent = 100;
    e->eta_s = 0;
    // Switch the served model to sparse; slots pick it up between requests.
    lock.unlock();
    absl::Status s = registry_->UseSidecar(name, result->sidecar_path);
    lock.lock();
    e = FindLocked(name);
    if (e == nullptr || e->id != id) return;
    if (!s.ok()) {
      ModelRecord failed = e->record;
      failed.state = ModelState::kFailed;
      failed.last_error = absl::StrCat("the sidecar does not load: ", s.message());
      CommitJobLocked(*e, std::move(failed), "the failure of its sidecar");
    }
    spdlog::info("model '{}' ready{}: placement {}", name,
                 result->resumed ? " (resumed after the profile)" : "", result->placement.dump());
  } else {
    spdlog::warn("model '{}': job failed: {}", name, e->record.last_error);
  }
  BumpLocked(*e);
}

}  // namespace thermocline::server
