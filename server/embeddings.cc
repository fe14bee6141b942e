#include "server/embeddings.h"

#include <charconv>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "server/errors.h"
#include "server/json_text.h"

namespace thermocline::server {
namespace {

using nlohmann::json;

absl::Status WrongType(const std::string& param, const char* expected) {
  return InvalidRequest(param, "invalid_type", absl::StrCat("'", param, "' must be ", expected));
}

// One array of token ids; false when `v` is not one.
bool TokenArray(const json& v, std::vector<int64_t>* out) {
  if (!v.is_array() || v.empty()) return false;
  for (const json& t : v) {
    if (!t.is_number_integer()) return false;
    out->push_back(t.get<int64_t>());
  }
  return true;
}

absl::Status Inputs(const json& input, EmbeddingSpec* spec) {
  const std::string& param = spec->input_field;
  if (input.is_string()) {
    spec->texts.push_back(input.get<std::string>());
    return absl::OkStatus();
  }
  const char* expected = "a string, an array of strings, or token ids";
  if (!input.is_array()) return WrongType(param, expected);
  if (input.size() > kMaxEmbeddingInputs) {
    return InvalidRequest(param, "invalid_value",
                          absl::StrCat("'", param, "' has ", input.size(), " inputs; at most ",
                                       kMaxEmbeddingInputs, " are allowed"));
  }
  if (!input.empty() && input[0].is_number_integer()) {
    std::vector<int64_t> ids;
    if (!TokenArray(input, &ids)) return WrongType(param, "an array of integer token ids");
    spec->ids.push_back(std::move(ids));
    return absl::OkStatus();
  }
  for (size_t i = 0; i < input.size(); ++i) {
    const json& v = input[i];
    if (v.is_string() && spec->ids.empty()) {
      spec->texts.push_back(v.get<std::string>());
    } else if (v.is_array() && spec->texts.empty()) {
      std::vector<int64_t> ids;
      if (!TokenArray(v, &ids)) {
        return WrongType(absl::StrCat(param, "[", i, "]"), "a non-empty array of token ids");
      }
      spec->ids.push_back(std::move(ids));
    } else {
      return WrongType(absl::StrCat(param, "[", i, "]"),
                       "of the same kind as the others: all strings or all token arrays");
    }
  }
  return absl::OkStatus();
}

constexpr char kBase64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

}  // namespace

absl::Status ParsePoolingField(const json& body, Pooling* pooling) {
  auto it = body.find("pooling");
  if (it == body.end() || it->is_null()) return absl::OkStatus();
  if (!it->is_string()) return WrongType("pooling", "a string: \"mean\" or \"last\"");
  const std::optional<Pooling> p = ParsePooling(it->get<std::string>());
  if (!p) {
    return InvalidRequest("pooling", "invalid_value",
                          absl::StrCat("pooling '", it->get<std::string>(),
                                       "' is not supported; use \"mean\" or \"last\""));
  }
  *pooling = *p;
  return absl::OkStatus();
}

absl::StatusOr<EmbeddingSpec> EmbeddingSpecFromOpenAi(const json& body, bool* base64) {
  EmbeddingSpec spec;
  auto model = body.find("model");
  if (model == body.end() || model->is_null()) {
    return InvalidRequest("model", "missing_required_parameter", "'model' is required");
  }
  if (!model->is_string()) return WrongType("model", "a string");
  spec.model = model->get<std::string>();
  auto input = body.find("input");
  if (input == body.end() || input->is_null()) {
    return InvalidRequest("input", "missing_required_parameter", "'input' is required");
  }
  if (absl::Status s = Inputs(*input, &spec); !s.ok()) return s;
  if (spec.texts.empty() && spec.ids.empty()) {
    return InvalidRequest("input", "invalid_value", "'input' must not be empty");
  }
  *base64 = false;
  if (auto f = body.find("encoding_format"); f != body.end() && !f->is_null()) {
    if (!f->is_string()) return WrongType("encoding_format", "a string");
    if (*f == "base64") {
      *base64 = true;
    } else if (*f != "float") {
      return InvalidRequest("encoding_format", "invalid_value",
                            absl::StrCat("encoding_format '", f->get<std::string>(),
                                         "' is not supported; use \"float\" or \"base64\""));
    }
  }
  if (auto d = body.find("dimensions"); d != body.end() && !d->is_null()) {
    if (!d->is_number_integer()) return WrongType("dimensions", "an integer");
    spec.dimensions = d->get<int64_t>();
  }
  if (absl::Status s = ParsePoolingField(body, &spec.pooling); !s.ok()) return s;
  return spec;
}

absl::StatusOr<std::shared_ptr<Job>> PrepareEmbeddingJob(const EmbeddingSpec& spec,
                                                         const SubmitContext& context) {
  auto model = context.registry->FindOrLoad(spec.model);
  if (!model.ok()) return model.status();
  if (context.draining) return Unavailable("shutting_down", "the server is shutting down");
  if (context.scheduler == nullptr) {
    return Unavailable("model_loading", "the server is starting; retry shortly");
  }
  const LoadedModel& m = **model;
  const int64_t n_embd = m.model->hparams().n_embd;
  if (spec.dimensions && *spec.dimensions != n_embd) {
    return InvalidRequest("dimensions", "unsupported_value",
                          absl::StrCat("model '", m.config().name, "' has ", n_embd,
                                       " dimensions and cannot shorten them; omit 'dimensions' "
                                       "or send ",
                                       n_embd));
  }
  GenerationRequest r;
  r.kind = ApiKind::kEmbedding;
  r.model = m.config().name;
  r.embed.pooling = spec.pooling;
  r.embed.normalize = spec.normalize;
  const Tokenizer& tok = m.tokenizer();
  const size_t n = spec.texts.size() + spec.ids.size();
  for (size_t i = 0; i < n; ++i) {
    const std::string param =
        n == 1 ? spec.input_field : absl::StrCat(spec.input_field, "[", i, "]");
    std::vector<int32_t> tokens;
    if (i < spec.texts.size()) {
      if (spec.texts[i].empty()) {
        return InvalidRequest(param, "invalid_value", absl::StrCat("'", param, "' is empty"));
      }
      if (absl::Status s = CheckTokenizeSize(spec.texts[i].size(), *context.config); !s.ok()) {
        return InvalidRequest(param, "text_too_long", std::string(s.message()));
      }
      tokens = m.encoder->Encode(spec.texts[i], tok.add_bos());
    } else {
      for (int64_t id : spec.ids[i - spec.texts.size()]) {
        if (id < 0 || id >= tok.vocab_size()) {
          return InvalidRequest(param, "invalid_value",
                                absl::StrCat("token id ", id, " is outside the vocabulary [0, ",
                                             tok.vocab_size(), ")"));
        }
        tokens.push_back(static_cast<int32_t>(id));
      }
    }
    if (tokens.empty()) {
      return InvalidRequest(param, "invalid_value", absl::StrCat("'", param, "' is empty"));
    }
    if (static_cast<int64_t>(tokens.size()) > m.n_ctx) {
      if (!spec.truncate) {
        return ContextExceeded(absl::StrCat("'", param, "' has ", tokens.size(),
                                            " tokens but the context of model '", m.config().name,
                                            "' is ", m.n_ctx, " tokens; shorten it"));
      }
      tokens.resize(static_cast<size_t>(m.n_ctx));
    }
    r.inputs.push_back(std::move(tokens));
  }
  auto job = std::make_shared<Job>();
  job->model = std::move(*model);
  job->request = std::move(r);
  if (context.config->request_timeout_s > 0) {
    job->deadline =
        job->arrival + std::chrono::duration_cast<Clock::duration>(
                           std::chrono::duration<double>(context.config->request_timeout_s));
  }
  job->deadline = std::min(job->deadline, context.call_deadline);
  return job;
}

void EmbeddingSink::OnEmbedding(size_t index, std::vector<float> vector) {
  std::lock_guard<std::mutex> lock(mu_);
  if (index < vectors_.size()) vectors_[index] = std::move(vector);
}

void EmbeddingSink::OnFinish(StopReason reason, CancelReason cancel, const GenerationStats& stats,
                             const absl::Status& error) {
  std::lock_guard<std::mutex> lock(mu_);
  reason_ = reason;
  cancel_ = cancel;
  stats_ = stats;
  error_ = error;
  done_ = true;
  done_cv_.notify_all();
}

bool EmbeddingSink::WaitFor(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  return done_cv_.wait_for(lock, timeout, [&] { return done_; });
}

absl::Status EmbeddingOutcome(const EmbeddingSink& sink) {
  switch (sink.reason()) {
    case StopReason::kError:
      return absl::InternalError(absl::StrCat("embedding failed: ", sink.error().message()));
    case StopReason::kCancelled:
      if (sink.cancel() == CancelReason::kDeadline) {
        return Unavailable("deadline", "the request ran past scheduler.request_timeout_s");
      }
      return Unavailable("shutting_down", "the server shut down before the end");
    default:
      return absl::OkStatus();
  }
}

void AppendFloatArray(const std::vector<float>& v, std::string* out) {
  out->push_back('[');
  char buf[32];
  for (size_t i = 0; i < v.size(); ++i) {
    if (i > 0) out->push_back(',');
    // Shortest round-trip text; JSON has no NaN or infinity (a finite model gives neither).
    const float x = std::isfinite(v[i]) ? v[i] : 0.0f;
    const auto r = std::to_chars(buf, buf + sizeof(buf), x);
    out->append(buf, r.ptr);
  }
  out->push_back(']');
}

std::string Base64Floats(const std::vector<float>& v) {
  std::string bytes(v.size() * sizeof(float), '\0');
  std::memcpy(bytes.data(), v.data(), bytes.size());  // x86-64 and ARM64: little-endian
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 3 <= bytes.size(); i += 3) {
    const uint32_t n = (uint32_t{static_cast<uint8_t>(bytes[i])} << 16) |
                       (uint32_t{static_cast<uint8_t>(bytes[i + 1])} << 8) |
                       static_cast<uint8_t>(bytes[i + 2]);
    for (int s = 18; s >= 0; s -= 6) out.push_back(kBase64[(n >> s) & 63]);
  }
  const size_t rest = bytes.size() - i;
  if (rest > 0) {
    uint32_t n = uint32_t{static_cast<uint8_t>(bytes[i])} << 16;
    if (rest == 2) n |= uint32_t{static_cast<uint8_t>(bytes[i + 1])} << 8;
    out.push_back(kBase64[(n >> 18) & 63]);
    out.push_back(kBase64[(n >> 12) & 63]);
    out.push_back(rest == 2 ? kBase64[(n >> 6) & 63] : '=');
    out.push_back('=');
  }
  return out;
}

std::string OpenAiEmbeddingBody(const std::string& model, const EmbeddingSink& sink, bool base64) {
  std::string out = "{\"object\":\"list\",\"data\":[";
  const auto& vectors = sink.vectors();
  for (size_t i = 0; i < vectors.size(); ++i) {
    if (i > 0) out.push_back(',');
    out.append("{\"object\":\"embedding\",\"index\":");
    AppendInt(&out, static_cast<int64_t>(i));
    out.append(",\"embedding\":");
    if (base64) {
      AppendJsonString(&out, Base64Floats(vectors[i]));
    } else {
      AppendFloatArray(vectors[i], &out);
    }
    out.push_back('}');
  }
  out.append("],\"model\":");
  AppendJsonString(&out, model);
  out.append(",\"usage\":{\"prompt_tokens\":");
  AppendInt(&out, sink.stats().prompt_tokens);
  out.append(",\"total_tokens\":");
  AppendInt(&out, sink.stats().prompt_tokens);
  out.append("}}");
  return out;
}

}  // namespace thermocline::server
