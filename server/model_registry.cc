#include "server/model_registry.h"

#include <chrono>
#include <ctime>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "offline/sparse_loader.h"
#include "server/errors.h"
#include "spdlog/spdlog.h"

namespace thermocline::server {

const char* ModelStateName(ModelState s) {
  switch (s) {
    case ModelState::kLoading:
      return "loading";
    case ModelState::kReady:
      return "ready";
    case ModelState::kFailed:
      return "failed";
    case ModelState::kUnloading:
      return "unloading";
    case ModelState::kUnloaded:
      return "unloaded";
  }
  return "?";
}

nlohmann::json PlacementSummary(const offline::Sidecar& sidecar) {
  int64_t gpu = 0;
  for (const offline::SidecarLayer& l : sidecar.layers) gpu += l.n_gpu;
  const int64_t total = sidecar.n_layer * sidecar.n_ff;
  const offline::SidecarPlacement& p = sidecar.placement;
  return {{"gpu_neurons", gpu},
          {"cpu_neurons", total - gpu},
          {"gpu_memory", p.present ? p.gpu_bytes : 0},
          {"objective", p.present ? nlohmann::json(p.objective) : nlohmann::json(nullptr)},
          {"hardware", p.present ? nlohmann::json(p.hardware) : nlohmann::json(nullptr)},
          {"solved", p.present}};
}

nlohmann::json ReportSummary(const offline::Sidecar& sidecar) {
  double sparsity = 0, recall = 0;
  for (const offline::SidecarLayer& l : sidecar.layers) {
    sparsity += l.sparsity;
    recall += l.recall;
  }
  const double n = std::max<double>(1, static_cast<double>(sidecar.layers.size()));
  return {{"sparsity", sparsity / n},
          {"recall", recall / n},
          {"layers", sidecar.layers.size()},
          {"tokens", sidecar.tokens},
          {"corpus", sidecar.corpus_kind}};
}

LoadedModel::LoadedModel(ServedModel* served, std::shared_ptr<ResidentMemory> resident,
                         int64_t bytes)
    : served(served), bytes(bytes), resident_(std::move(resident)) {
  resident_->models.fetch_add(1);
  resident_->bytes.fetch_add(bytes);
}

absl::StatusOr<std::shared_ptr<const SparseWeights>> LoadedModel::SparseWeightsFor(
    const std::shared_ptr<const SparseSource>& source, ThreadPool& pool) const {
  std::lock_guard<std::mutex> lock(sparse_mu_);
  if (sparse_for_ != source || sparse_weights_ == nullptr) {
    sparse_weights_.reset();  // the old copy goes once no slot uses it
    resident_->bytes.fetch_sub(sparse_bytes_.exchange(0));
    sparse_for_ = source;
    auto plan = offline::SparsePlanFromSidecar(source->sidecar, *model);
    if (!plan.ok()) return plan.status();
    auto weights = SparseWeights::Build(*model, *std::move(plan), pool);
    if (!weights.ok()) return weights.status();
    sparse_weights_ = *std::move(weights);
    // Charged like the weights: the next load that needs room counts them.
    const int64_t b = static_cast<int64_t>(sparse_weights_->bytes());
    resident_->bytes.fetch_add(b - sparse_bytes_.exchange(b));
    spdlog::info("model '{}': sparse rows in firing order, {} MiB", served->config.name,
                 sparse_weights_->bytes() >> 20);
  }
  return sparse_weights_;
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
  if (busy_) model_->leases_.fetch_sub(1, std::memory_order_relaxed);
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

std::shared_ptr<const SparseSource> ServedModel::sparse_source() const {
  std::lock_guard<std::mutex> lock(mu_);
  return sparse_;
}

void ServedModel::set_sparse_source(std::shared_ptr<const SparseSource> source) {
  std::lock_guard<std::mutex> lock(mu_);
  sparse_ = std::move(source);
}

const char* ServedModel::mode() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (sparse_ != nullptr) return "sparse";
  const ModelState s = state.load(std::memory_order_acquire);
  const bool unloaded = s == ModelState::kUnloaded || s == ModelState::kUnloading;
  if (unloaded && !pending_sidecar_.empty()) return "sparse";
  return "dense";
}

ModelRegistry::ModelRegistry(const std::vector<ModelConfig>& configs, int64_t memory_budget)
    : memory_budget_(memory_budget) {
  for (const ModelConfig& c : configs) {
    auto m = std::make_unique<ServedModel>();
    m->config = c;
    m->index = static_cast<int>(models_.size());
    models_.push_back(std::move(m));
  }
}

namespace {

absl::StatusOr<std::shared_ptr<const SparseSource>> LoadSource(const std::string& path,
                                                               const LlamaModel& model) {
  auto sidecar = offline::LoadSidecarFor(path, model);
  if (!sidecar.ok()) return sidecar.status();
  // Built once here so that a sidecar the engine cannot use fails now, not in a slot.
  auto plan = offline::SparsePlanFromSidecar(*sidecar, model);
  if (!plan.ok()) return plan.status();
  auto source = std::make_shared<SparseSource>();
  source->placement = PlacementSummary(*sidecar);
  source->report = ReportSummary(*sidecar);
  source->sidecar = std::move(*sidecar);
  source->path = path;
  return std::shared_ptr<const SparseSource>(std::move(source));
}

}  // namespace

absl::StatusOr<std::shared_ptr<const SparseSource>> ModelRegistry::ResolveSparse(
    ServedModel* m, const LlamaModel& model) {
  const ModelConfig& c = m->config;
  std::string path;
  {
    std::lock_guard<std::mutex> lock(m->mu_);
    path = m->pending_sidecar_;
  }
  if (path.empty() && c.sparse == "off") return std::shared_ptr<const SparseSource>();
  bool explicit_path = !path.empty() || !c.sidecar.empty();
  if (path.empty()) path = c.sidecar;
  if (path.empty()) {
    const std::string beside = c.path + ".thermo.gguf";
    std::error_code ec;
    if (std::filesystem::exists(beside, ec)) path = beside;
  }
  if (path.empty()) {
    if (c.sparse == "on") {
      return absl::InvalidArgumentError(absl::StrCat(
          "sparse = \"on\" needs a sidecar: set `sidecar` (or --sidecar FILE), or put ", c.path,
          ".thermo.gguf beside the model (thermocline profile makes one)"));
    }
    return std::shared_ptr<const SparseSource>();
  }
  auto source = LoadSource(path, model);
  if (!source.ok()) {
    // A configured model whose sidecar was named fails; a registered one stays usable dense.
    if ((c.sparse == "auto" && !explicit_path) || m->registered) {
      spdlog::warn("model '{}': ignoring {} ({}); serving dense", c.name, path,
                   std::string(source.status().message()));
      return std::shared_ptr<const SparseSource>();
    }
    return absl::Status(source.status().code(),
                        absl::StrCat("sidecar ", path, ": ", source.status().message()));
  }
  return source;
}

namespace {

// What a model costs against the budget: its GGUF file is mapped, weights and all.
int64_t ModelFileBytes(const std::string& path) {
  std::error_code ec;
  const uintmax_t size = std::filesystem::file_size(path, ec);
  return ec ? 0 : static_cast<int64_t>(size);
}

}  // namespace

absl::StatusOr<std::shared_ptr<LoadedModel>> ModelRegistry::Load(ServedModel* m) {
  ModelOptions options;
  if (!m->config.activation.empty()) {
    auto act = ParseActivation(m->config.activation);
    if (!act.ok()) return act.status();
    options.activation = *act;
  }
  auto model = LlamaModel::Load(m->config.path, options);
  if (!model.ok()) return model.status();
  for (const std::string& w : (*model)->warnings()) {
    spdlog::warn("model '{}': {}", m->config.name, w);
  }
  const int64_t file_bytes = ModelFileBytes(m->config.path);
  auto l = std::make_shared<LoadedModel>(
      m, resident_, file_bytes > 0 ? file_bytes : static_cast<int64_t>((*model)->weight_bytes()));
  l->model = std::move(*model);
  const Tokenizer& tok = l->model->tokenizer();
  l->encoder = std::make_unique<PromptEncoder>(tok);

  auto template_text = l->model->gguf().GetString("tokenizer.chat_template", "");
  if (!template_text.ok()) return template_text.status();
  ChatSpecialTexts specials;
  if (tok.bos_id() >= 0) specials.bos = tok.token_text(tok.bos_id());
  if (tok.eos_id() >= 0) specials.eos = tok.token_text(tok.eos_id());
  auto chat = ChatTemplate::Create(m->config.chat_template, *template_text, specials);
  if (!chat.ok()) return chat.status();
  l->chat_template = std::move(*chat);
  if (!l->chat_template->end_of_turn().empty()) {
    const int32_t id = l->encoder->FindControl(l->chat_template->end_of_turn());
    if (id >= 0) l->end_of_turn_tokens.push_back(id);
  }
  if (l->chat_template->is_fallback() && !template_text->empty()) {
    spdlog::warn("model '{}': chat template not recognised; using the plain fallback",
                 m->config.name);
  }

  const int64_t train_ctx = l->model->hparams().n_ctx_train;
  l->n_ctx = m->config.n_ctx > 0 ? m->config.n_ctx : train_ctx;
  if (l->n_ctx <= 0) l->n_ctx = 2048;
  return l;
}

absl::Status ModelRegistry::LoadOneLocked(ServedModel* m) {
  const auto start = std::chrono::steady_clock::now();
  m->state.store(ModelState::kLoading, std::memory_order_release);
  absl::StatusOr<std::shared_ptr<LoadedModel>> l = Load(m);
  absl::StatusOr<std::shared_ptr<const SparseSource>> sparse =
      l.ok() ? ResolveSparse(m, *(*l)->model) : l.status();
  if (!sparse.ok()) {
    const absl::Status& s = sparse.status();
    {
      std::lock_guard<std::mutex> lock(m->mu_);
      m->error_ = std::string(s.message());
    }
    m->state.store(ModelState::kFailed, std::memory_order_release);
    return absl::Status(s.code(), absl::StrCat("model '", m->config.name, "' (", m->config.path,
                                               "): ", s.message()));
  }
  (*l)->created = static_cast<int64_t>(std::time(nullptr));
  const std::shared_ptr<const LoadedModel> loaded = std::move(*l);
  {
    std::lock_guard<std::mutex> lock(m->mu_);
    m->loaded_ = loaded;
    m->sparse_ = *sparse;
  }
  m->state.store(ModelState::kReady, std::memory_order_release);
  const auto& source = *sparse;
  spdlog::info(
      "model '{}' ready: {} layers, vocab {}, context {}, chat template {}, {}{}, {} MiB "
      "({:.2f} s)",
      m->config.name, loaded->model->hparams().n_layer, loaded->model->hparams().n_vocab,
      loaded->n_ctx, loaded->chat_template->name(), m->mode(),
      source ? absl::StrCat(" (", source->path, ", ", source->placement.dump(), ")") : "",
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
    if (m->sparse_ != nullptr && m->pending_sidecar_.empty())
      m->pending_sidecar_ = m->sparse_->path;
    m->sparse_.reset();
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

bool ModelRegistry::MakeRoomLocked(const ServedModel* keep, int64_t need) {
  if (memory_budget_ <= 0) return false;
  bool unloaded = false;
  while (true) {
    int64_t used = 0;
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
    if (used + need <= memory_budget_) break;
    if (victim == nullptr) {
      spdlog::warn(
          "model '{}' alone ({} bytes) exceeds registry.model_memory_budget ({} bytes); loading "
          "it anyway",
          keep->config.name, need, memory_budget_);
      break;
    }
    UnloadLocked(victim, victim_busy ? "memory budget; every other model is busy"
                                     : "least recently used, memory budget");
    unloaded = true;
  }
  return unloaded;
}

void ModelRegistry::NotifyUnloaded() {
  if (unload_listener_) unload_listener_();
}

void ModelRegistry::EnsureLoadedLocked(ServedModel* m) {
  if (MakeRoomLocked(m, ModelFileBytes(m->config.path))) NotifyUnloaded();
  if (absl::Status s = LoadOneLocked(m); !s.ok()) spdlog::error("{}", std::string(s.message()));
}

absl::Status ModelRegistry::LoadAll() {
  for (ServedModel* m : models()) {
    if (m->registered) continue;
    std::lock_guard<std::mutex> lock(load_mu_);
    if (absl::Status s = LoadOneLocked(m); !s.ok()) return s;
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

absl::StatusOr<ModelLease> ModelRegistry::FindOrLoad(std::string_view name) {
  ServedModel* m = Lookup(name);
  if (m == nullptr) return Unservable(name, nullptr);
  std::shared_ptr<const LoadedModel> l = m->loaded();
  if (l == nullptr && started_.load(std::memory_order_acquire)) {
    // Not in memory (registered, unloaded, or failed: its file may have been fixed).
    std::lock_guard<std::mutex> lock(load_mu_);
    l = m->loaded();
    if (l == nullptr && !m->removed.load()) {
      EnsureLoadedLocked(m);
      l = m->loaded();
    }
  }
  if (l == nullptr) return Unservable(name, m);
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
  m->removed.store(true);
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
  std::lock_guard<std::mutex> load_lock(load_mu_);
  {
    std::lock_guard<std::mutex> lock(m->mu_);
    m->pending_sidecar_ = sidecar_path;
  }
  const std::shared_ptr<const LoadedModel> l = m->loaded();
  if (l == nullptr) return absl::OkStatus();  // used when it loads
  if (sidecar_path.empty()) {
    m->set_sparse_source(nullptr);
    return absl::OkStatus();
  }
  auto source = LoadSource(sidecar_path, *l->model);
  if (!source.ok()) return source.status();
  m->set_sparse_source(std::move(*source));
  spdlog::info("model '{}' now served sparse from {}", m->config.name, sidecar_path);
  return absl::OkStatus();
}

}  // namespace thermocline::server
