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
  if (s == ModelState::kUnloaded && !pending_sidecar_.empty()) return "sparse";
  return "dense";
}

ModelRegistry::ModelRegistry(const std::vector<ModelConfig>& configs) {
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

absl::StatusOr<std::shared_ptr<const SparseSource>> ModelRegistry::ResolveSparse(ServedModel* m) {
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
  auto source = LoadSource(path, *m->model);
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

absl::Status ModelRegistry::Load(ServedModel* m) {
  ModelOptions options;
  if (!m->config.activation.empty()) {
    auto act = ParseActivation(m->config.activation);
    if (!act.ok()) return act.status();
    options.activation = *act;
  }
  auto model = LlamaModel::Load(m->config.path, options);
  if (!model.ok()) return model.status();
  m->model = std::move(*model);
  const Tokenizer& tok = m->model->tokenizer();
  m->encoder = std::make_unique<PromptEncoder>(tok);

  auto template_text = m->model->gguf().GetString("tokenizer.chat_template", "");
  if (!template_text.ok()) return template_text.status();
  ChatSpecialTexts specials;
  if (tok.bos_id() >= 0) specials.bos = tok.token_text(tok.bos_id());
  if (tok.eos_id() >= 0) specials.eos = tok.token_text(tok.eos_id());
  auto chat = ChatTemplate::Create(m->config.chat_template, *template_text, specials);
  if (!chat.ok()) return chat.status();
  m->chat_template = std::move(*chat);
  if (!m->chat_template->end_of_turn().empty()) {
    const int32_t id = m->encoder->FindControl(m->chat_template->end_of_turn());
    if (id >= 0) m->end_of_turn_tokens.push_back(id);
  }
  if (m->chat_template->is_fallback() && !template_text->empty()) {
    spdlog::warn("model '{}': chat template not recognised; using the plain fallback",
                 m->config.name);
  }

  const int64_t train_ctx = m->model->hparams().n_ctx_train;
  m->n_ctx = m->config.n_ctx > 0 ? m->config.n_ctx : train_ctx;
  if (m->n_ctx <= 0) m->n_ctx = 2048;

  auto sparse = ResolveSparse(m);
  if (!sparse.ok()) return sparse.status();
  m->set_sparse_source(std::move(*sparse));
  return absl::OkStatus();
}

absl::Status ModelRegistry::LoadOne(ServedModel* m) {
  const auto start = std::chrono::steady_clock::now();
  m->state.store(ModelState::kLoading, std::memory_order_release);
  absl::Status s = Load(m);
  if (!s.ok()) {
    m->error = std::string(s.message());
    m->state.store(ModelState::kFailed, std::memory_order_release);
    return absl::Status(s.code(), absl::StrCat("model '", m->config.name, "' (", m->config.path,
                                               "): ", s.message()));
  }
  m->created = static_cast<int64_t>(std::time(nullptr));
  m->state.store(ModelState::kReady, std::memory_order_release);
  const auto source = m->sparse_source();
  spdlog::info(
      "model '{}' ready: {} layers, vocab {}, context {}, chat template {}, {}{} ({:.2f} s)",
      m->config.name, m->model->hparams().n_layer, m->model->hparams().n_vocab, m->n_ctx,
      m->chat_template->name(), m->mode(),
      source ? absl::StrCat(" (", source->path, ", ", source->placement.dump(), ")") : "",
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  return absl::OkStatus();
}

absl::Status ModelRegistry::LoadAll() {
  for (ServedModel* m : models()) {
    if (m->registered) continue;
    if (absl::Status s = LoadOne(m); !s.ok()) return s;
  }
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

absl::StatusOr<const ServedModel*> ModelRegistry::Find(std::string_view name) const {
  if (const ServedModel* m = Lookup(name)) {
    switch (m->state.load(std::memory_order_acquire)) {
      case ModelState::kReady:
        return m;
      case ModelState::kLoading:
      case ModelState::kUnloaded:
        return Unavailable("model_loading",
                           absl::StrCat("model '", ToAbsl(name), "' is loading; retry shortly"));
      case ModelState::kFailed:
        return Unavailable("model_failed",
                           absl::StrCat("model '", ToAbsl(name), "' failed to load: ", m->error));
    }
  }
  std::string known;
  for (const ServedModel* m : models()) {
    absl::StrAppend(&known, known.empty() ? "" : ", ", m->config.name);
  }
  return NotFound(
      "model_not_found",
      absl::StrCat("model '", ToAbsl(name), "' does not exist; this server has: ",
                   known.empty() ? "no models (register one: POST /admin/models)" : known));
}

absl::StatusOr<const ServedModel*> ModelRegistry::FindOrLoad(std::string_view name) {
  ServedModel* m = Lookup(name);
  if (m != nullptr && m->registered && !m->ready()) {
    std::lock_guard<std::mutex> lock(m->load_mu_);
    const ModelState s = m->state.load(std::memory_order_acquire);
    // A registered model that failed may load now (its file may have been fixed).
    if (s == ModelState::kUnloaded || s == ModelState::kFailed) {
      if (absl::Status st = LoadOne(m); !st.ok()) spdlog::error("{}", std::string(st.message()));
    }
  }
  auto found = Find(name);
  if (found.ok()) {
    (*found)->last_used.store(static_cast<int64_t>(std::time(nullptr)));
  }
  return found;
}

bool ModelRegistry::all_ready() const {
  for (const ServedModel* m : models()) {
    if (!m->registered && !m->ready()) return false;
  }
  return true;
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
  m->removed.store(true);
  return absl::OkStatus();
}

absl::Status ModelRegistry::UseSidecar(std::string_view name, const std::string& sidecar_path) {
  ServedModel* m = Lookup(name);
  if (m == nullptr) {
    return absl::NotFoundError(absl::StrCat("model '", ToAbsl(name), "' does not exist"));
  }
  std::lock_guard<std::mutex> load_lock(m->load_mu_);
  {
    std::lock_guard<std::mutex> lock(m->mu_);
    m->pending_sidecar_ = sidecar_path;
  }
  if (!m->ready()) return absl::OkStatus();  // used when it loads
  if (sidecar_path.empty()) {
    m->set_sparse_source(nullptr);
    return absl::OkStatus();
  }
  auto source = LoadSource(sidecar_path, *m->model);
  if (!source.ok()) return source.status();
  m->set_sparse_source(std::move(*source));
  spdlog::info("model '{}' now served sparse from {}", m->config.name, sidecar_path);
  return absl::OkStatus();
}

}  // namespace thermocline::server
