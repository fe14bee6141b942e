#include "server/model_registry.h"

#include <ctime>

#include "absl/strings/str_cat.h"
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
  }
  return "?";
}

ModelRegistry::ModelRegistry(const std::vector<ModelConfig>& configs) {
  for (const ModelConfig& c : configs) {
    auto m = std::make_unique<ServedModel>();
    m->config = c;
    m->index = static_cast<int>(models_.size());
    models_.push_back(std::move(m));
  }
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
  return absl::OkStatus();
}

absl::Status ModelRegistry::LoadAll() {
  for (auto& m : models_) {
    const auto start = std::chrono::steady_clock::now();
    absl::Status s = Load(m.get());
    if (!s.ok()) {
      m->error = std::string(s.message());
      m->state.store(ModelState::kFailed, std::memory_order_release);
      return absl::Status(s.code(), absl::StrCat("model '", m->config.name, "' (", m->config.path,
                                                 "): ", s.message()));
    }
    m->created = static_cast<int64_t>(std::time(nullptr));
    m->state.store(ModelState::kReady, std::memory_order_release);
    spdlog::info("model '{}' ready: {} layers, vocab {}, context {}, chat template {} ({:.2f} s)",
                 m->config.name, m->model->hparams().n_layer, m->model->hparams().n_vocab, m->n_ctx,
                 m->chat_template->name(),
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return absl::OkStatus();
}

absl::StatusOr<const ServedModel*> ModelRegistry::Find(std::string_view name) const {
  for (const auto& m : models_) {
    if (m->config.name != name) continue;
    switch (m->state.load(std::memory_order_acquire)) {
      case ModelState::kReady:
        return m.get();
      case ModelState::kLoading:
        return Unavailable("model_loading",
                           absl::StrCat("model '", ToAbsl(name), "' is loading; retry shortly"));
      case ModelState::kFailed:
        return Unavailable("model_failed",
                           absl::StrCat("model '", ToAbsl(name), "' failed to load: ", m->error));
    }
  }
  std::string known;
  for (const auto& m : models_) absl::StrAppend(&known, known.empty() ? "" : ", ", m->config.name);
  return NotFound("model_not_found", absl::StrCat("model '", ToAbsl(name),
                                                  "' does not exist; this server has: ", known));
}

bool ModelRegistry::all_ready() const {
  for (const auto& m : models_) {
    if (m->state.load(std::memory_order_acquire) != ModelState::kReady) return false;
  }
  return true;
}

}  // namespace thermocline::server
