#include "server/model_registry.h"

#include <unistd.h>

#include <chrono>
#include <ctime>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "engine/model/weight_check.h"
#include "offline/sparse_source.h"
#include "server/errors.h"
#include "spdlog/spdlog.h"

namespace thermocline::server {

LoadedModel::LoadedModel(ServedModel* served, std::shared_ptr<ResidentMemory> resident,
                         int64_t bytes)
    : served(served), bytes(bytes), resident_(std::move(resident)) {
  resident_->models.fetch_add(1);
  resident_->bytes.fetch_add(bytes);
}

std::shared_ptr<const Engine> LoadedModel::engine() const {
  std::lock_guard<std::mutex> lock(engine_mu_);
  return engine_;
}

std::shared_ptr<const TokenTrie> LoadedModel::vocab_trie() const {
  std::call_once(trie_once_, [&] { vocab_trie_ = TokenTrie::FromTokenizer(tokenizer()); });
  return vocab_trie_;
}

void LoadedModel::SetEngine(std::shared_ptr<const Engine> engine) const {
  // The sparse copies, less the file's FFN pages they replaced (charged with the weights).
  const int64_t b = static_cast<int64_t>(engine->host_bytes()) -
                    static_cast<int64_t>(engine->released_file_bytes());
  {
    std::lock_guard<std::mutex> lock(engine_mu_);
    engine_ = std::move(engine);  // the old one goes once no slot uses it
  }
  // Charged like the weights: the next load that needs room counts them.
  resident_->bytes.fetch_add(b - engine_bytes_.exchange(b));
}

LoadedModel::~LoadedModel() {
  resident_->models.fetch_sub(1);
  resident_->bytes.fetch_sub(charged_bytes());
  if (!unloaded_.load()) return;  // a load that failed half-way, or the daemon's end
  spdlog::info("model '{}' freed ({} MiB)", served->config.name, bytes >> 20);
  if (served->unloading_.fetch_sub(1) == 1) {
    ModelState expected = ModelState::kUnloading;  // unless it has been loaded again meanwhile
    served->state.compare_exchange_strong(expected, ModelState::kUnloaded);
  }
}

const ModelConfig& LoadedModel::config() const { return served->config; }

ModelLease::ModelLease(std::shared_ptr<const LoadedModel> model)
    : model_(std::move(model)), busy_(model_ != nullptr) {
  if (busy_) model_->leases_.fetch_add(1, std::memory_order_relaxed);
}

ModelLease& ModelLease::operator=(ModelLease&& other) noexcept {
  if (this != &other) {
    Release();
    model_ = std::move(other.model_);
    busy_ = std::exchange(other.busy_, false);
  }
  return *this;
}

void ModelLease::EndUse() {
  if (busy_) {
    model_->idle_since_.store(std::chrono::steady_clock::now().time_since_epoch().count(),
                              std::memory_order_relaxed);
    model_->leases_.fetch_sub(1, std::memory_order_relaxed);
  }
  busy_ = false;
}

void ModelLease::Release() {
  EndUse();
  model_.reset();
}

std::shared_ptr<const LoadedModel> ServedModel::loaded() const {
  std::lock_guard<std::mutex> lock(mu_);
  return loaded_;
}

std::string ServedModel::error() const {
  std::lock_guard<std::mutex> lock(mu_);
  return error_;
}

const char* ServedModel::mode() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (loaded_ != nullptr) {
    return loaded_->engine() != nullptr && loaded_->engine()->sparse_plan() != nullptr ? "sparse"
                                                                                       : "dense";
  }
  return pending_sidecar_.empty() ? "dense" : "sparse";
}

std::string ServedModel::warning() const {
  std::lock_guard<std::mutex> lock(mu_);
  return warning_;
}

std::string ServedModel::sidecar_path() const {
  std::lock_guard<std::mutex> lock(mu_);
  return loaded_ != nullptr ? sidecar_ : pending_sidecar_;
}

ModelRegistry::ModelRegistry(const std::vector<ModelConfig>& configs,
                             const RegistryOptions& options)
    : memory_budget_(options.memory_budget), options_(options) {
  for (const ModelConfig& c : configs) {
    auto m = std::make_unique<ServedModel>();
    m->config = c;
    m->index = static_cast<int>(models_.size());
    models_.push_back(std::move(m));
  }
}

ModelRegistry::~ModelRegistry() { StopIdleUnloader(); }

absl::StatusOr<std::optional<SparsePlan>> ModelRegistry::ResolveSparse(ServedModel* m,
                                                                       const LlamaModel& model,
                                                                       std::string* sidecar) {
  const ModelConfig& c = m->config;
  std::string pending;
  {
    std::lock_guard<std::mutex> lock(m->mu_);
    pending = m->pending_sidecar_;
  }
  offline::SparseRequest request;
  absl::StatusOr<offline::SparseMode> mode = offline::ParseSparseMode(c.sparse, "sparse =");
  if (!mode.ok()) return mode.status();
  // A registered model's job sidecar is served where it pays (auto: its speed check); another
  // pending sidecar as the config's mode says, off excepted.
  request.mode = pending.empty()                      ? *mode
                 : m->registered                      ? offline::SparseMode::kAuto
                 : *mode == offline::SparseMode::kOff ? offline::SparseMode::kOn
                                                      : *mode;
  request.sidecar = pending.empty() ? c.sidecar : pending;
  request.model_path = c.path;
  request.oracle = c.oracle;
  request.target_sparsity = c.target_sparsity;
  // A registration's own job sidecar is checked for speed; one the config names is the user's
  // choice.
  request.check_speed = (c.sidecar.empty() || request.sidecar != c.sidecar) &&
                        c.gpu_layers.empty() && c.gpu_memory.empty();
  absl::StatusOr<offline::MethodChoice> method =
      offline::ParseSparseMethod(c.sparse_method, "sparse_method =");
  if (!method.ok()) return method.status();
  request.method = *method;
  absl::StatusOr<offline::ResolvedSparse> resolved = offline::ResolveSparsePlan(model, request);
  if (!resolved.ok()) {
    // A registered model stays usable dense when its job's sidecar cannot be used.
    if (m->registered) {
      const std::string why =
          absl::StrCat("its sidecar does not load (", resolved.status().message(),
                       "); it is served dense: register it again to profile it anew");
      spdlog::warn("model '{}': {}", c.name, why);
      std::lock_guard<std::mutex> lock(m->mu_);
      m->warning_ = why;
      return std::optional<SparsePlan>();
    }
    return resolved.status();
  }
  if (!resolved->warning.empty()) {
    spdlog::warn("model '{}': {}", c.name, resolved->warning);
    std::lock_guard<std::mutex> lock(m->mu_);
    m->warning_ = resolved->warning;
  }
  if (resolved->plan.has_value()) *sidecar = resolved->plan->sidecar_path;
  return std::move(resolved->plan);
}

absl::StatusOr<std::shared_ptr<const Engine>> ModelRegistry::BuildEngine(
    const ServedModel* m, const LoadedModel& l, std::optional<SparsePlan> plan) {
  EngineOptions options;
  options.n_ctx = l.n_ctx;
  options.max_batch = options_.max_batch;
  options.repack = m->config.repack;
  if (!ParseKvType(m->config.kv_type, &options.kv_type)) {
    return absl::InvalidArgumentError(
        absl::StrCat("kv_type '", m->config.kv_type, "' is not one of f16, f32"));
  }
  if (absl::Status s = ApplyGpuConfig(m->config, &options.gpu_memory, &options.gpu_layers);
      !s.ok()) {
    return s;
  }
  ThreadPool pool(std::max(1, options_.build_threads));
  absl::StatusOr<std::shared_ptr<const Engine>> engine =
      Engine::Create(*l.model, std::move(plan), options, pool);
  if (!engine.ok()) return engine.status();
  const EnginePlacement p = (*engine)->placement();
  if (p.gpu_requested) {
    if (p.device.empty()) {
      spdlog::warn("model '{}': no GPU ({}); serving from the CPU", m->config.name, p.note);
    } else {
      spdlog::info("model '{}': {}", m->config.name, DescribePlacement(p));
    }
  }
  return engine;
}

namespace {

// What a model costs against the budget: its GGUF file is mapped, weights and all.
int64_t ModelFileBytes(const std::string& path) {
  std::error_code ec;
  const uintmax_t size = std::filesystem::file_size(path, ec);
  return ec ? 0 : static_cast<int64_t>(size);
}

// FNV-1a 64 of the file's header region (its first MiB at most): with the stamp, who the file
// is.
uint64_t HeaderHash(const GgufFile& file) {
  std::string_view bytes = file.header_bytes();
  bytes = bytes.substr(0, size_t{1} << 20);
  uint64_t h = 14695981039346656037ull;
  for (char c : bytes) {
    h ^= static_cast<unsigned char>(c);
    h *= 1099511628211ull;
  }
  return h;
}

// How `now` differs from the file as it was opened, in words; "" when it does not.
std::string FileChange(const GgufFileStamp& was, const GgufFileStamp& now) {
  if (now.device != was.device || now.inode != was.inode) return "it was replaced by another file";
  if (now.size != was.size) {
    return absl::StrCat("its size changed from ", was.size, " to ", now.size,
                        " bytes (truncated or rewritten)");
  }
  if (now.mtime_ns != was.mtime_ns) return "it was modified (its modification time changed)";
  return "";
}

// Why the file `l` was loaded from can no longer be served; "" when it can. One stat.
std::string FileProblem(const LoadedModel& l) {
  const GgufFile& f = l.model->gguf();
  if (f.faulted()) {
    return "reading it failed while it was served (the file was truncated or its disk failed)";
  }
  const absl::StatusOr<GgufFileStamp> now = GgufFileStamp::Of(f.path());
  if (!now.ok()) return "it was deleted or can no longer be read";
  return FileChange(f.stamp(), *now);
}

// Bytes of physical memory; 0 when unknown.
uint64_t PhysicalMemory() {
  const long pages = ::sysconf(_SC_PHYS_PAGES);
  const long page = ::sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? static_cast<uint64_t>(pages) * static_cast<uint64_t>(page) : 0;
}

// The context of each slot's session: the configured n_ctx, else the training context capped at
// `max_context`; refused when one session's KV cache could not fit in this machine's memory.
absl::StatusOr<int64_t> ChooseContext(const ModelConfig& c, const LlamaHparams& h,
                                      int64_t max_context) {
  int64_t n_ctx = c.n_ctx;
  if (n_ctx <= 0) {
    n_ctx = h.n_ctx_train > 0 ? h.n_ctx_train : 2048;
    if (n_ctx > max_context) {
      spdlog::warn(
          "model '{}': its training context of {} positions is served as {} "
          "(scheduler.max_context; set n_ctx in its [[models]] entry for more)",
          c.name, n_ctx, max_context);
      n_ctx = max_context;
    }
  }
  KvType kv_type = KvType::kF16;
  ParseKvType(c.kv_type, &kv_type);  // validated by FinalizeConfig
  const uint64_t kv_bytes = KvCacheBytes(h, n_ctx, kv_type);
  const uint64_t memory = PhysicalMemory();
  if (memory > 0 && kv_bytes > memory) {
    return absl::ResourceExhaustedError(
        absl::StrCat("a context of ", n_ctx, " positions needs ", kv_bytes >> 20,
                     " MiB of KV cache per slot, more than this machine's ", memory >> 20,
                     " MiB of memory; set a smaller n_ctx"));
  }
  return n_ctx;
}

}  // namespace

absl::StatusOr<std::shared_ptr<LoadedModel>> ModelRegistry::Load(ServedModel* m,
                                                                 std::string* sidecar) {
  if (options_.before_load) options_.before_load(m->config);
  {
    std::lock_guard<std::mutex> lock(m->mu_);
    m->warning_.clear();
  }
  ModelOptions options;
  if (!m->config.activation.empty()) {
    auto act = ParseActivation(m->config.activation);
    if (!act.ok()) return act.status();
    options.activation = *act;
  }
  auto model = LlamaModel::Load(m->config.path, options);
  if (!model.ok()) return model.status();
  const uint64_t header_hash = HeaderHash((*model)->gguf());
  {
    std::lock_guard<std::mutex> lock(m->mu_);
    if (m->pinned_.has_value()) {
      std::string change = FileChange(m->pinned_->stamp, (*model)->gguf().stamp());
      if (change.empty() && header_hash != m->pinned_->header_hash) {
        change = "its header changed";
      }
      if (!change.empty()) {
        return absl::FailedPreconditionError(
            absl::StrCat("the model file changed since it was first loaded (", change,
                         "); this name serves no other weights: ",
                         m->registered ? "delete the model and register it again"
                                       : "restart the daemon to serve the new file"));
      }
    }
  }
  if (absl::Status s = CheckWeightsFinite((*model)->gguf()); !s.ok()) return s;
  absl::StatusOr<int64_t> n_ctx =
      ChooseContext(m->config, (*model)->hparams(), options_.max_context);
  if (!n_ctx.ok()) return n_ctx.status();
  for (const std::string& w : (*model)->warnings()) {
    spdlog::warn("model '{}': {}", m->config.name, w);
  }
  const int64_t file_bytes = ModelFileBytes(m->config.path);
  auto l = std::make_shared<LoadedModel>(
      m, resident_, file_bytes > 0 ? file_bytes : static_cast<int64_t>((*model)->weight_bytes()));
  l->model = std::move(*model);
  l->header_hash = header_hash;
  l->n_ctx = *n_ctx;
  const Tokenizer& tok = l->model->tokenizer();
  l->encoder = std::make_unique<PromptEncoder>(tok);

  auto template_text = l->model->gguf().GetString("tokenizer.chat_template", "");
  if (!template_text.ok()) return template_text.status();
  ChatSpecialTexts specials;
  if (tok.bos_id() >= 0) specials.bos = tok.token_text(tok.bos_id());
  if (tok.eos_id() >= 0) specials.eos = tok.token_text(tok.eos_id());
  auto tool_use_text = l->model->gguf().GetString("tokenizer.chat_template.tool_use", "");
  if (!tool_use_text.ok()) return tool_use_text.status();
  auto chat =
      ChatTemplate::Create(m->config.chat_template, *template_text, specials, *tool_use_text);
  if (!chat.ok()) return chat.status();
  l->chat_template = std::move(*chat);
  for (const std::string& text : l->chat_template->end_of_turn_texts()) {
    const int32_t id = l->encoder->FindControl(text);
    if (id >= 0) l->end_of_turn_tokens.push_back(id);
  }
  absl::StatusOr<std::optional<SparsePlan>> plan = ResolveSparse(m, *l->model, sidecar);
  if (!plan.ok()) return plan.status();
  absl::StatusOr<std::shared_ptr<const Engine>> engine = BuildEngine(m, *l, *std::move(plan));
  if (!engine.ok()) return engine.status();
  l->SetEngine(*std::move(engine));
  return l;
}

absl::Status ModelRegistry::LoadLocked(std::unique_lock<std::mutex>& lock, ServedModel* m,
                                       int64_t need, bool make_room) {
  const auto start = std::chrono::steady_clock::now();
  m->loading_ = true;
  m->drop_load_ = false;
  m->state.store(ModelState::kLoading, std::memory_order_release);
  if (make_room) {
    bool unloaded = false;
    // Waiting for another model's load to end (when the budget needs its room) releases the lock.
    while (!MakeRoomLocked(m, need, &unloaded) && !m->removed.load() && !m->drop_load_) {
      load_cv_.wait(lock);
    }
    if (unloaded) NotifyUnloaded();
  }
  loading_bytes_ += need;  // reserved until the load ends

  absl::StatusOr<std::shared_ptr<LoadedModel>> l = absl::CancelledError("");
  std::string sidecar;
  if (!m->removed.load() && !m->drop_load_) {
    lock.unlock();  // the file's I/O blocks nobody else
    l = Load(m, &sidecar);
    lock.lock();
  }
  loading_bytes_ -= need;
  m->loading_ = false;
  ++m->loads_ended_;
  load_cv_.notify_all();
  if (m->removed.load() || m->drop_load_) {
    // Deleted or unloaded while it loaded: what the load made is freed (outside the lock) and
    // its reservation is gone; nothing was published.
    if (!m->removed.load()) {
      // kUnloaded, or kUnloading while an instance unloaded before still serves requests (its
      // end makes it kUnloaded).
      m->state.store(ModelState::kUnloading, std::memory_order_release);
      ModelState expected = ModelState::kUnloading;
      if (m->unloading_.load() == 0) {
        m->state.compare_exchange_strong(expected, ModelState::kUnloaded);
      }
    }
    lock.unlock();
    l = absl::CancelledError("");
    lock.lock();
    spdlog::info("model '{}': its load was dropped ({} meanwhile)", m->config.name,
                 m->removed.load() ? "deleted" : "unloaded");
    return absl::CancelledError(absl::StrCat("model '", m->config.name, "' was ",
                                             m->removed.load() ? "deleted" : "unloaded",
                                             " while it loaded"));
  }
  if (!l.ok()) {
    const absl::Status& s = l.status();
    {
      std::lock_guard<std::mutex> model_lock(m->mu_);
      m->error_ = std::string(s.message());
    }
    m->state.store(ModelState::kFailed, std::memory_order_release);
    return absl::Status(s.code(), absl::StrCat("model '", m->config.name, "' (", m->config.path,
                                               "): ", s.message()));
  }
  (*l)->created = static_cast<int64_t>(std::time(nullptr));
  (*l)->idle_since_.store(std::chrono::steady_clock::now().time_since_epoch().count());
  const std::shared_ptr<const LoadedModel> loaded = *std::move(l);
  const std::shared_ptr<const Engine> engine = loaded->engine();
  {
    std::lock_guard<std::mutex> model_lock(m->mu_);
    m->loaded_ = loaded;
    m->sidecar_ = sidecar;
    m->error_.clear();
    if (!m->pinned_.has_value()) {
      m->pinned_ = ServedModel::Pin{loaded->model->gguf().stamp(), loaded->header_hash};
    }
  }
  m->state.store(ModelState::kReady, std::memory_order_release);
  const SparsePlan* sparse = engine->sparse_plan();
  spdlog::info(
      "model '{}' ready: {} layers, vocab {}, context {}, chat template {}, {}{}, {} MiB "
      "({:.2f} s)",
      m->config.name, loaded->model->hparams().n_layer, loaded->model->hparams().n_vocab,
      loaded->n_ctx, loaded->chat_template->name(), m->mode(),
      sparse != nullptr
          ? absl::StrCat(" (", SparseSourceName(sparse->source), sidecar.empty() ? "" : " ",
                         sidecar, ", ", engine->host_bytes() >> 20,
                         " MiB of sparse copies replacing ", engine->released_file_bytes() >> 20,
                         " MiB of the file's FFN)")
          : "",
      loaded->bytes >> 20,
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  return absl::OkStatus();
}

void ModelRegistry::UnloadLocked(ServedModel* m, const char* why) {
  std::shared_ptr<const LoadedModel> l;
  {
    std::lock_guard<std::mutex> lock(m->mu_);
    l = std::move(m->loaded_);
    // Loaded again, it is served as now (the sidecar is read again then).
    if (!m->sidecar_.empty() && m->pending_sidecar_.empty()) m->pending_sidecar_ = m->sidecar_;
    m->sidecar_.clear();
  }
  if (l == nullptr) return;
  m->unloading_.fetch_add(1);
  l->unloaded_.store(true, std::memory_order_release);
  m->state.store(ModelState::kUnloading, std::memory_order_release);
  resident_->unloads.fetch_add(1);
  const int leases = l->leases();
  spdlog::info("model '{}' unloaded ({}){}", m->config.name, why,
               leases > 0 ? absl::StrCat("; freed once its ", leases, " request(s) in flight end")
                          : std::string());
  l.reset();  // freed here, or by the last slot session or request that holds it
}

bool ModelRegistry::MakeRoomLocked(const ServedModel* keep, int64_t need, bool* unloaded) {
  if (memory_budget_ <= 0) return true;
  while (true) {
    int64_t used = loading_bytes_;
    ServedModel* victim = nullptr;
    bool victim_busy = false;
    uint64_t victim_use = 0;
    for (ServedModel* m : models()) {
      const std::shared_ptr<const LoadedModel> l = m->loaded();
      if (l == nullptr) continue;
      used += l->charged_bytes();
      if (m == keep) continue;
      // Idle before busy (a busy model's memory is only freed when its requests end), then
      // least recently used.
      const bool busy = l->leases() > 0;
      const uint64_t use = m->last_use.load();
      if (victim == nullptr || (victim_busy && !busy) ||
          (victim_busy == busy && use < victim_use)) {
        victim = m;
        victim_busy = busy;
        victim_use = use;
      }
    }
    if (used + need <= memory_budget_) return true;
    if (victim == nullptr) {
      // What loads now becomes a victim once loaded: wait for it.
      if (loading_bytes_ > 0) return false;
      spdlog::warn(
          "model '{}' alone ({} bytes) exceeds registry.model_memory_budget ({} bytes); loading "
          "it anyway",
          keep->config.name, need, memory_budget_);
      return true;
    }
    UnloadLocked(victim, victim_busy ? "memory budget; every other model is busy"
                                     : "least recently used, memory budget");
    *unloaded = true;
  }
}

void ModelRegistry::NotifyUnloaded() {
  if (unload_listener_) unload_listener_();
}

absl::Status ModelRegistry::LoadAll() {
  for (ServedModel* m : models()) {
    if (m->registered) continue;
    const int64_t need = ModelFileBytes(m->config.path);
    std::unique_lock<std::mutex> lock(load_mu_);
    if (absl::Status s = LoadLocked(lock, m, need, /*make_room=*/false); !s.ok()) return s;
    // Checked; under a budget that the models loaded before it fill, it waits for a request.
    int64_t used = 0;
    for (ServedModel* o : models()) {
      if (auto l = o->loaded()) used += l->charged_bytes();
    }
    const std::shared_ptr<const LoadedModel> l = m->loaded();
    if (memory_budget_ > 0 && used > memory_budget_ && used > l->charged_bytes()) {
      UnloadLocked(m, "it loads again on its first request: registry.model_memory_budget");
    }
  }
  started_.store(true, std::memory_order_release);
  return absl::OkStatus();
}

ServedModel* ModelRegistry::Lookup(std::string_view name) const {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& m : models_) {
    if (m->config.name == name && !m->removed.load()) return m.get();
  }
  return nullptr;
}

std::vector<ServedModel*> ModelRegistry::models() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<ServedModel*> out;
  out.reserve(models_.size());
  for (const auto& m : models_) {
    if (!m->removed.load()) out.push_back(m.get());
  }
  return out;
}

absl::Status ModelRegistry::Unservable(std::string_view name, const ServedModel* m) const {
  if (m != nullptr) {
    if (m->state.load(std::memory_order_acquire) == ModelState::kFailed) {
      return Unavailable("model_failed",
                         absl::StrCat("model '", ToAbsl(name), "' failed to load: ", m->error()));
    }
    return Unavailable("model_loading",
                       absl::StrCat("model '", ToAbsl(name), "' is loading; retry shortly"));
  }
  std::string known;
  for (const ServedModel* o : models()) {
    absl::StrAppend(&known, known.empty() ? "" : ", ", o->config.name);
  }
  return NotFound(
      "model_not_found",
      absl::StrCat("model '", ToAbsl(name), "' does not exist; this server has: ",
                   known.empty() ? "no models (register one: POST /admin/models)" : known));
}

bool ModelRegistry::FailIfFileChanged(ServedModel* m, const std::shared_ptr<const LoadedModel>& l) {
  const std::string problem = FileProblem(*l);
  if (problem.empty()) return false;
  std::lock_guard<std::mutex> lock(load_mu_);
  if (m->loaded() != l) return true;  // unloaded meanwhile (by another request's check too)
  const std::string why =
      absl::StrCat("its file ", m->config.path, " changed while it was loaded: ", problem,
                   "; the model is unloaded (",
                   m->registered ? "delete it and register it again"
                                 : "restart the daemon to serve the new file",
                   ")");
  spdlog::error("model '{}': {}", m->config.name, why);
  UnloadLocked(m, "its file changed");
  {
    std::lock_guard<std::mutex> model_lock(m->mu_);
    m->error_ = why;
  }
  // After UnloadLocked's kUnloading: the freed instance leaves kFailed as it is.
  m->state.store(ModelState::kFailed, std::memory_order_release);
  NotifyUnloaded();
  return true;
}

void ModelRegistry::CheckFiles() {
  for (ServedModel* m : models()) {
    if (const std::shared_ptr<const LoadedModel> l = m->loaded()) FailIfFileChanged(m, l);
  }
}

absl::StatusOr<ModelLease> ModelRegistry::FindOrLoad(std::string_view name) {
  ServedModel* m = Lookup(name);
  if (m == nullptr) return Unservable(name, nullptr);
  std::shared_ptr<const LoadedModel> l = m->loaded();
  // A stat per request: a file truncated or rewritten under its mapping is never computed on.
  if (l != nullptr && FailIfFileChanged(m, l)) return Unservable(name, m);
  if (l == nullptr && started_.load(std::memory_order_acquire)) {
    // Not in memory (registered, unloaded, or failed: its file may have been fixed).
    const int64_t need = ModelFileBytes(m->config.path);  // a stat: before the lock
    std::unique_lock<std::mutex> lock(load_mu_);
    if (m->loading_) {
      // Another request loads it: this one takes that load's outcome (the wait releases the lock).
      const uint64_t ended = m->loads_ended_;
      load_cv_.wait(lock, [&] { return m->loads_ended_ != ended; });
    } else if (m->loaded() == nullptr && !m->removed.load()) {
      if (absl::Status s = LoadLocked(lock, m, need, /*make_room=*/true);
          !s.ok() && !absl::IsCancelled(s)) {
        spdlog::error("{}", std::string(s.message()));
      }
    }
    l = m->loaded();
  }
  if (l == nullptr) return Unservable(name, m->removed.load() ? nullptr : m);
  m->last_use.store(use_clock_.fetch_add(1) + 1);
  return ModelLease(std::move(l));
}

absl::StatusOr<ServedModel*> ModelRegistry::Add(const ModelConfig& config) {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& m : models_) {
    if (m->config.name == config.name && !m->removed.load()) {
      return absl::AlreadyExistsError(absl::StrCat(
          "a model named '", config.name, "' already exists; pick another name or delete it"));
    }
  }
  auto m = std::make_unique<ServedModel>();
  m->config = config;
  m->registered = true;
  m->index = static_cast<int>(models_.size());
  m->state.store(ModelState::kUnloaded);
  models_.push_back(std::move(m));
  return models_.back().get();
}

absl::Status ModelRegistry::Remove(std::string_view name) {
  ServedModel* m = Lookup(name);
  if (m == nullptr) {
    return absl::NotFoundError(absl::StrCat("model '", ToAbsl(name), "' does not exist"));
  }
  std::lock_guard<std::mutex> lock(load_mu_);
  m->removed.store(true);  // a load in flight sees it when it ends, and drops what it made
  if (m->loaded() != nullptr) {
    UnloadLocked(m, "deleted");
    NotifyUnloaded();
  }
  return absl::OkStatus();
}

absl::Status ModelRegistry::UseSidecar(std::string_view name, const std::string& sidecar_path) {
  ServedModel* m = Lookup(name);
  if (m == nullptr) {
    return absl::NotFoundError(absl::StrCat("model '", ToAbsl(name), "' does not exist"));
  }
  std::lock_guard<std::mutex> switch_lock(m->switch_mu_);
  auto set_pending = [&] {
    std::lock_guard<std::mutex> lock(m->mu_);
    m->pending_sidecar_ = sidecar_path;
  };
  std::shared_ptr<const LoadedModel> l;
  {
    std::unique_lock<std::mutex> lock(load_mu_);
    set_pending();
    // A load in flight may have read the sidecar it replaces: switch what it publishes.
    load_cv_.wait(lock, [&] { return !m->loading_; });
    l = m->loaded();
  }
  if (l == nullptr) return absl::OkStatus();  // used when it loads
  std::optional<SparsePlan> plan;
  if (!sidecar_path.empty()) {
    absl::StatusOr<offline::MethodChoice> method =
        offline::ParseSparseMethod(m->config.sparse_method, "sparse_method =");
    if (!method.ok()) return method.status();
    absl::StatusOr<SparsePlan> p =
        offline::LoadSparsePlan(sidecar_path, *l->model, m->config.target_sparsity, *method);
    if (!p.ok()) return p.status();
    plan = *std::move(p);
  }
  absl::StatusOr<std::shared_ptr<const Engine>> engine = BuildEngine(m, *l, std::move(plan));
  if (!engine.ok()) return engine.status();
  {
    std::lock_guard<std::mutex> lock(load_mu_);
    if (m->loaded() != l) {
      set_pending();  // unloaded meanwhile (which kept its old sidecar): used when it loads
      return absl::OkStatus();
    }
    l->SetEngine(*std::move(engine));
    std::lock_guard<std::mutex> model_lock(m->mu_);
    m->sidecar_ = sidecar_path;
  }
  if (sidecar_path.empty()) {
    spdlog::info("model '{}' now served dense", m->config.name);
  } else {
    spdlog::info("model '{}' now served sparse from {}", m->config.name, sidecar_path);
  }
  return absl::OkStatus();
}

}  // namespace thermocline::server

namespace thermocline::server {

void ModelRegistry::SetKeepAlive(ServedModel* m, std::chrono::milliseconds keep_alive) {
  m->keep_alive_ms.store(keep_alive.count() < 0 ? -1 : keep_alive.count());
  if (keep_alive.count() < 0) return;
  std::lock_guard<std::mutex> lock(idle_mu_);
  if (!idle_thread_.joinable() && !idle_stop_) {
    idle_thread_ = std::thread([this] { IdleUnloaderMain(); });
  }
  idle_cv_.notify_all();
}

std::optional<std::chrono::steady_clock::time_point> ModelRegistry::ExpiresAt(
    const ServedModel& m) const {
  const int64_t ms = m.keep_alive_ms.load();
  const std::shared_ptr<const LoadedModel> l = m.loaded();
  if (ms < 0 || l == nullptr) return std::nullopt;
  const auto from = l->leases() > 0 ? std::chrono::steady_clock::now() : l->idle_since();
  return from + std::chrono::milliseconds(ms);
}

bool ModelRegistry::Unload(ServedModel* m, const char* why) {
  std::lock_guard<std::mutex> lock(load_mu_);
  if (m->loading_) {
    m->drop_load_ = true;  // the load drops what it made when it ends
    return true;
  }
  if (m->loaded() == nullptr) return false;
  UnloadLocked(m, why);
  NotifyUnloaded();
  return true;
}

void ModelRegistry::StopIdleUnloader() {
  std::thread t;
  {
    std::lock_guard<std::mutex> lock(idle_mu_);
    idle_stop_ = true;
    idle_cv_.notify_all();
    t = std::move(idle_thread_);
  }
  if (t.joinable()) t.join();
}

void ModelRegistry::IdleUnloaderMain() {
  // How often the idle models are looked at: a keep_alive ends at most this late.
  constexpr auto kTick = std::chrono::milliseconds(100);
  std::unique_lock<std::mutex> lock(idle_mu_);
  while (!idle_stop_) {
    lock.unlock();
    bool any = false;
    for (ServedModel* m : models()) {
      if (m->keep_alive_ms.load() < 0) continue;
      any = true;  // looked at while unloaded too: a request may load it again
      const std::optional<std::chrono::steady_clock::time_point> end = ExpiresAt(*m);
      if (!end) continue;
      if (std::chrono::steady_clock::now() < *end) continue;
      std::lock_guard<std::mutex> load_lock(load_mu_);
      const std::shared_ptr<const LoadedModel> l = m->loaded();
      // Looked at again under the load lock: a request may have taken it meanwhile.
      if (l == nullptr || l->leases() > 0 || m->keep_alive_ms.load() < 0) continue;
      const auto again = ExpiresAt(*m);
      if (again && std::chrono::steady_clock::now() < *again) continue;
      UnloadLocked(m, "keep_alive ran out");
      NotifyUnloaded();
    }
    lock.lock();
    if (any) {
      idle_cv_.wait_for(lock, kTick, [&] { return idle_stop_; });
    } else {
      idle_cv_.wait(lock);  // until a keep_alive is set, or the stop
    }
  }
}

}  // namespace thermocline::server
