#include "server/front_end_ops.h"

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "server/errors.h"

namespace thermocline::server {

absl::StatusOr<ModelLease> ResolveModel(ModelRegistry& registry, std::string_view name) {
  if (!name.empty()) return registry.FindOrLoad(name);
  const std::vector<ServedModel*> models = registry.models();
  if (models.empty()) {
    return NotFound("model_not_found", "no model is served: register one or name it in 'model'");
  }
  return registry.FindOrLoad(models.front()->config.name);
}

absl::Status CheckTokenizeSize(size_t bytes, const ServerConfig& config) {
  if (bytes <= static_cast<size_t>(config.max_tokenize_bytes)) return absl::OkStatus();
  return InvalidRequest(
      "content", "text_too_long",
      absl::StrCat("the text is ", bytes, " bytes; a tokenize call takes at most ",
                   config.max_tokenize_bytes, " (server.max_tokenize_bytes): split it"));
}

std::vector<int32_t> TokenizeText(const LoadedModel& model, std::string_view text,
                                  bool add_special) {
  return model.encoder->Encode(text, add_special && model.tokenizer().add_bos());
}

absl::StatusOr<std::string> DetokenizeIds(const LoadedModel& model, absl::Span<const int64_t> ids) {
  const Tokenizer& tok = model.tokenizer();
  std::vector<int32_t> checked;
  checked.reserve(ids.size());
  for (int64_t id : ids) {
    if (id < 0 || id >= tok.vocab_size()) {
      return InvalidRequest(
          "tokens", "invalid_value",
          absl::StrCat("token id ", id, " is outside the vocabulary [0, ", tok.vocab_size(), ")"));
    }
    checked.push_back(static_cast<int32_t>(id));
  }
  return tok.Decode(checked);
}

absl::StatusOr<std::shared_ptr<Job>> PrepareJob(const GenerationSpec& spec,
                                                const SubmitContext& context) {
  auto model = context.registry->FindOrLoad(spec.model);
  if (!model.ok()) return model.status();
  if (context.draining) return Unavailable("shutting_down", "the server is shutting down");
  if (context.scheduler == nullptr) {
    return Unavailable("model_loading", "the server is starting; retry shortly");
  }
  auto request = BuildRequest(spec, **model, *context.config);
  if (!request.ok()) return request.status();
  auto job = std::make_shared<Job>();
  job->model = std::move(*model);
  job->request = std::move(*request);
  if (context.config->request_timeout_s > 0) {
    job->deadline =
        job->arrival + std::chrono::duration_cast<Clock::duration>(
                           std::chrono::duration<double>(context.config->request_timeout_s));
  }
  job->deadline = std::min(job->deadline, context.call_deadline);
  return job;
}

}  // namespace thermocline::server
