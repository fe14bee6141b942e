// The models the daemon serves: loaded in the background at start-up (the HTTP front end is up
// meanwhile and answers 503 "loading"), then immutable and shared by every slot. The
// lifecycle is an explicit state; health and the model list derive from it.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model/llama_model.h"
#include "server/chat_template.h"
#include "server/config.h"
#include "server/prompt_encoder.h"

namespace thermocline::server {

enum class ModelState { kLoading, kReady, kFailed };
const char* ModelStateName(ModelState s);

// One served model. Fields other than `state` are written once by the loader before `state`
// becomes kReady (release) and only read after (acquire).
struct ServedModel {
  ModelConfig config;
  int index = 0;        // position in the registry; slots keep one session per index
  int64_t created = 0;  // unix seconds when it became ready
  std::atomic<ModelState> state{ModelState::kLoading};
  std::string error;  // when kFailed

  std::unique_ptr<LlamaModel> model;
  std::unique_ptr<PromptEncoder> encoder;
  std::optional<ChatTemplate> chat_template;
  std::vector<int32_t> end_of_turn_tokens;  // the template's end-of-turn control token
  int64_t n_ctx = 0;                        // context of each slot's session

  const Tokenizer& tokenizer() const { return model->tokenizer(); }
};

class ModelRegistry {
 public:
  explicit ModelRegistry(const std::vector<ModelConfig>& configs);

  // Loads every model in order (blocking; run it on a loader thread). Returns the first error;
  // the failed model is marked kFailed.
  absl::Status LoadAll();

  // For a request: NotFound for an unknown name, Unavailable while it loads or when it failed.
  absl::StatusOr<const ServedModel*> Find(std::string_view name) const;
  const std::vector<std::unique_ptr<ServedModel>>& models() const { return models_; }
  bool all_ready() const;

 private:
  absl::Status Load(ServedModel* m);
  std::vector<std::unique_ptr<ServedModel>> models_;
};

}  // namespace thermocline::server
