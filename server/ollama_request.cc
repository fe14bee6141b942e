// Ollama request bodies (server/ollama_api.h): /api/chat, /api/generate, /api/embed and
// /api/embeddings into the native specs; options and keep_alive.
#include <cmath>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "server/errors.h"
#include "server/ollama_api.h"

namespace thermocline::server {
namespace {

using nlohmann::json;

absl::Status WrongType(const std::string& param, const char* expected) {
  return InvalidRequest(param, "invalid_type", absl::StrCat("'", param, "' must be ", expected));
}

absl::Status Unsupported(const std::string& param, std::string_view why) {
  return InvalidRequest(param, "unsupported_parameter",
                        absl::StrCat("'", param, "' is not supported: ", ToAbsl(why)));
}

const json* Field(const json& body, const char* key) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return nullptr;
  return &*it;
}

absl::Status GetString(const json& body, const char* key, std::string* out) {
  const json* v = Field(body, key);
  if (v == nullptr) return absl::OkStatus();
  if (!v->is_string()) return WrongType(key, "a string");
  *out = v->get<std::string>();
  return absl::OkStatus();
}

absl::Status GetBool(const json& body, const char* key, bool* out) {
  const json* v = Field(body, key);
  if (v == nullptr) return absl::OkStatus();
  if (!v->is_boolean()) return WrongType(key, "a boolean");
  *out = v->get<bool>();
  return absl::OkStatus();
}

// Go's time.ParseDuration: a sign, then decimal numbers each with a unit (ns, us, µs, ms, s, m,
// h); "0" alone needs none.
std::optional<double> GoDurationSeconds(std::string_view s) {
  double sign = 1;
  if (!s.empty() && (s[0] == '-' || s[0] == '+')) {
    sign = s[0] == '-' ? -1 : 1;
    s.remove_prefix(1);
  }
  if (s == "0") return 0.0;
  if (s.empty()) return std::nullopt;
  double total = 0;
  while (!s.empty()) {
    size_t i = 0;
    while (i < s.size() && (std::isdigit(static_cast<unsigned char>(s[i])) || s[i] == '.')) ++i;
    double value = 0;
    if (i == 0 || !absl::SimpleAtod(ToAbsl(s.substr(0, i)), &value)) return std::nullopt;
    s.remove_prefix(i);
    static const std::pair<const char*, double> kUnits[] = {
        {"ns", 1e-9}, {"us", 1e-6}, {"\xC2\xB5s", 1e-6}, {"\xCE\xBCs", 1e-6},
        {"ms", 1e-3}, {"s", 1},     {"m", 60},           {"h", 3600}};
    bool found = false;
    for (const auto& [unit, scale] : kUnits) {
      if (absl::StartsWith(ToAbsl(s), unit)) {
        total += value * scale;
        s.remove_prefix(std::string_view(unit).size());
        found = true;
        break;
      }
    }
    if (!found) return std::nullopt;
  }
  return sign * total;
}

// Options as Ollama names them: the sampling ones map to the spec; num_ctx must fit the model
// (checked by the handler against the loaded model: *num_ctx); the load-time ones (num_gpu,
// num_thread, ...) are decided when a model is registered and are accepted without effect.
absl::Status Options(const json& body, GenerationSpec* spec, std::optional<int64_t>* num_ctx) {
  const json* options = Field(body, "options");
  if (options == nullptr) return absl::OkStatus();
  if (!options->is_object()) return WrongType("options", "an object");
  static const char* const kLoadTime[] = {"num_gpu",  "main_gpu",   "num_thread", "num_batch",
                                          "use_mmap", "use_mlock",  "numa",       "low_vram",
                                          "f16_kv",   "vocab_only", "num_keep"};
  for (const auto& [key, v] : options->items()) {
    const std::string param = "options." + key;
    if (v.is_null()) continue;
    bool load_time = false;
    for (const char* k : kLoadTime) load_time |= key == k;
    if (load_time) continue;
    auto number = [&](std::optional<double>* out) -> absl::Status {
      if (!v.is_number()) return WrongType(param, "a number");
      *out = v.get<double>();
      return absl::OkStatus();
    };
    auto integer = [&](std::optional<int64_t>* out) -> absl::Status {
      // A float must be whole and within int64 (converting one past it is undefined).
      if (!v.is_number_integer() &&
          !(v.is_number_float() && v.get<double>() == std::floor(v.get<double>()) &&
            std::abs(v.get<double>()) < 9e15)) {
        return WrongType(param, "an integer");
      }
      *out = v.is_number_unsigned() ? static_cast<int64_t>(v.get<uint64_t>())
                                    : static_cast<int64_t>(v.get<double>());
      return absl::OkStatus();
    };
    absl::Status s;
    if (key == "temperature") {
      s = number(&spec->temperature);
    } else if (key == "top_p") {
      s = number(&spec->top_p);
    } else if (key == "min_p") {
      s = number(&spec->min_p);
    } else if (key == "top_k") {
      s = integer(&spec->top_k);
    } else if (key == "seed") {
      s = integer(&spec->seed);
      if (s.ok() && *spec->seed < 0) spec->seed.reset();  // Ollama: -1 is a random seed
    } else if (key == "repeat_penalty") {
      s = number(&spec->repeat_penalty);
    } else if (key == "presence_penalty") {
      s = number(&spec->presence_penalty);
    } else if (key == "frequency_penalty") {
      s = number(&spec->frequency_penalty);
    } else if (key == "repeat_last_n") {
      s = integer(&spec->penalty_last_n);
    } else if (key == "num_predict") {
      std::optional<int64_t> n;
      s = integer(&n);
      // -1: until the end of generation; -2: until the context is full.
      if (s.ok() && *n > 0) spec->max_tokens = *n;
      if (s.ok() && (*n == 0 || *n < -2)) {
        s = InvalidRequest(param, "invalid_value",
                           "'options.num_predict' must be at least 1, or -1 / -2 for no limit");
      }
    } else if (key == "num_ctx") {
      s = integer(num_ctx);
    } else if (key == "stop") {
      if (v.is_string()) {
        spec->stop.push_back(v.get<std::string>());
      } else if (v.is_array()) {
        for (const json& x : v) {
          if (!x.is_string()) return WrongType(param, "an array of strings");
          spec->stop.push_back(x.get<std::string>());
        }
      } else {
        s = WrongType(param, "an array of strings");
      }
    } else if ((key == "mirostat" && v == 0) || (key == "typical_p" && v == 1) ||
               (key == "tfs_z" && v == 1) || key == "penalize_newline") {
      continue;  // the neutral values of samplers this server does not have
    } else if (key == "mirostat" || key == "mirostat_tau" || key == "mirostat_eta" ||
               key == "typical_p" || key == "tfs_z") {
      s = Unsupported(param, "this server has no such sampler");
    } else {
      s = InvalidRequest(param, "unknown_parameter",
                         absl::StrCat("'", param, "' is not an option this server knows"));
    }
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status KeepAliveField(const json& body, std::optional<std::chrono::milliseconds>* out) {
  const json* v = Field(body, "keep_alive");
  if (v == nullptr) return absl::OkStatus();
  auto d = ParseKeepAlive(*v);
  if (!d.ok()) return d.status();
  *out = *d;
  return absl::OkStatus();
}

absl::Status Refuse(const json& body, const char* key, std::string_view why) {
  const json* v = Field(body, key);
  if (v == nullptr) return absl::OkStatus();
  if ((v->is_array() || v->is_string() || v->is_object()) && v->empty()) return absl::OkStatus();
  if (v->is_boolean() && !v->get<bool>()) return absl::OkStatus();
  return Unsupported(key, why);
}

absl::Status Messages(const json& body, GenerationSpec* spec) {
  const json* msgs = Field(body, "messages");
  if (msgs == nullptr) return absl::OkStatus();
  if (!msgs->is_array()) return WrongType("messages", "an array");
  for (size_t i = 0; i < msgs->size(); ++i) {
    const json& m = (*msgs)[i];
    const std::string p = absl::StrCat("messages[", i, "]");
    if (!m.is_object()) return WrongType(p, "an object");
    ChatMessage msg;
    if (absl::Status s = GetString(m, "role", &msg.role); !s.ok())
      return WrongType(p + ".role", "a string");
    if (msg.role.empty()) {
      return InvalidRequest(p + ".role", "missing_required_parameter",
                            absl::StrCat("'", p, ".role' is required"));
    }
    if (absl::Status s = NormalizeChatRole(p + ".role", &msg.role); !s.ok()) return s;
    const json* content = Field(m, "content");
    if (content != nullptr && !content->is_string()) return WrongType(p + ".content", "a string");
    msg.content_is_null = content == nullptr;
    if (content != nullptr) msg.content = content->get<std::string>();
    if (const json* images = Field(m, "images"); images != nullptr && !images->empty()) {
      return Unsupported(p + ".images", "the served models read text only");
    }
    if (absl::Status s = GetString(m, "tool_name", &msg.name); !s.ok()) return s;
    if (const json* calls = Field(m, "tool_calls"); calls != nullptr) {
      if (!calls->is_array()) return WrongType(p + ".tool_calls", "an array");
      for (const json& c : *calls) {
        const json* f = c.is_object() ? Field(c, "function") : nullptr;
        if (f == nullptr || !f->is_object()) {
          return WrongType(p + ".tool_calls", "an array of {\"function\": {...}}");
        }
        ChatToolCall call;
        call.type = "function";
        if (const json* name = Field(*f, "name"); name != nullptr && name->is_string()) {
          call.name = name->get<std::string>();
        }
        if (const json* args = Field(*f, "arguments"); args != nullptr) {
          call.arguments = args->is_string() ? args->get<std::string>() : args->dump();
        }
        msg.tool_calls.push_back(std::move(call));
      }
    }
    spec->messages.push_back(std::move(msg));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ModelField(const json& body, const ModelRegistry& registry,
                                       std::string* as_sent) {
  if (absl::Status s = GetString(body, "model", as_sent); !s.ok()) return s;
  if (as_sent->empty()) {
    if (absl::Status s = GetString(body, "name", as_sent); !s.ok()) return s;  // older clients
  }
  if (as_sent->empty()) {
    return InvalidRequest("model", "missing_required_parameter", "'model' is required");
  }
  return OllamaModelName(registry, *as_sent);
}

}  // namespace

absl::StatusOr<std::chrono::milliseconds> ParseKeepAlive(const json& value) {
  std::optional<double> seconds;
  if (value.is_number()) {
    seconds = value.get<double>();
  } else if (value.is_string()) {
    const std::string& s = value.get_ref<const std::string&>();
    double plain = 0;
    seconds = absl::SimpleAtod(s, &plain) ? std::optional<double>(plain) : GoDurationSeconds(s);
  }
  if (!seconds || !std::isfinite(*seconds)) {
    return InvalidRequest("keep_alive", "invalid_value",
                          "'keep_alive' must be a duration such as \"5m\", \"30s\", \"1h\", a "
                          "number of seconds, or -1 (never unload)");
  }
  if (*seconds < 0) return std::chrono::milliseconds(-1);
  // Beyond ~292 years Ollama's own duration overflows; cap at 100 years.
  return std::chrono::milliseconds(
      static_cast<int64_t>(std::min(*seconds, 100.0 * 365 * 86400) * 1000.0 + 0.5));
}

namespace {

// "format": "json" (Ollama's JSON mode; a JSON object, as OpenAI's json_object) or a JSON
// schema, through the same constrained decoding as response_format; "" or absent: free text.
absl::Status FormatField(const json& body, GenerationSpec* spec) {
  const auto it = body.find("format");
  if (it == body.end() || it->is_null() || (it->is_string() && it->get<std::string>().empty())) {
    return absl::OkStatus();
  }
  if (it->is_string() && it->get<std::string>() == "json") {
    spec->response_format = "json_object";
    return absl::OkStatus();
  }
  if (it->is_object()) {
    spec->response_format = "json_schema";
    spec->json_schema = nlohmann::ordered_json::parse(it->dump());
    spec->json_schema_strict = true;
    return absl::OkStatus();
  }
  return InvalidRequest("format", "invalid_value",
                        "'format' must be \"json\" or a JSON schema object");
}

}  // namespace

absl::StatusOr<OllamaGeneration> OllamaGenerationRequest(const json& body, bool chat,
                                                         const ModelRegistry& registry) {
  OllamaGeneration g;
  g.chat = chat;
  auto name = ModelField(body, registry, &g.model);
  if (!name.ok()) return name.status();
  GenerationSpec& spec = g.spec;
  spec.model = *name;
  spec.kind = ApiKind::kChat;
  for (const auto& [key, why] : std::initializer_list<std::pair<const char*, const char*>>{
           {"images", "the served models read text only"},
           {"tools", "tool calls are not parsed from the output on the Ollama routes yet"},
           {"suffix", "fill-in-the-middle is not supported"},
           {"template", "the prompt format is the model's chat template"},
           {"context", "send the conversation again (the server caches no context tokens)"},
           {"think", "the served models have no thinking mode"}}) {
    if (absl::Status s = Refuse(body, key, why); !s.ok()) return s;
  }
  if (absl::Status s = FormatField(body, &spec); !s.ok()) return s;
  spec.stream = true;  // Ollama streams unless told not to
  if (absl::Status s = GetBool(body, "stream", &spec.stream); !s.ok()) return s;
  if (absl::Status s = KeepAliveField(body, &g.keep_alive); !s.ok()) return s;
  std::optional<int64_t> num_ctx;
  if (absl::Status s = Options(body, &spec, &num_ctx); !s.ok()) return s;
  if (num_ctx && *num_ctx < 1) {
    return InvalidRequest("options.num_ctx", "invalid_value", "'options.num_ctx' must be >= 1");
  }
  g.num_ctx = num_ctx;
  if (chat) {
    if (absl::Status s = Messages(body, &spec); !s.ok()) return s;
    g.empty = spec.messages.empty();
    return g;
  }
  std::string prompt, system;
  bool raw = false;
  if (absl::Status s = GetString(body, "prompt", &prompt); !s.ok()) return s;
  if (absl::Status s = GetString(body, "system", &system); !s.ok()) return s;
  if (absl::Status s = GetBool(body, "raw", &raw); !s.ok()) return s;
  g.empty = prompt.empty();
  if (raw) {
    if (!system.empty()) {
      return InvalidRequest("system", "invalid_value",
                            "'system' has no effect with 'raw': true (the prompt is sent as is)");
    }
    spec.kind = ApiKind::kCompletion;
    spec.prompt_text = prompt;
    return g;
  }
  if (!system.empty()) {
    ChatMessage m;
    m.role = "system";
    m.content = system;
    spec.messages.push_back(std::move(m));
  }
  ChatMessage user;
  user.role = "user";
  user.content = prompt;
  spec.messages.push_back(std::move(user));
  return g;
}

absl::StatusOr<OllamaEmbedding> OllamaEmbeddingRequest(const json& body, bool legacy,
                                                       const ModelRegistry& registry) {
  OllamaEmbedding e;
  auto name = ModelField(body, registry, &e.model);
  if (!name.ok()) return name.status();
  EmbeddingSpec& spec = e.spec;
  spec.model = *name;
  if (absl::Status s = KeepAliveField(body, &e.keep_alive); !s.ok()) return s;
  GenerationSpec ignored;  // sampling options have no effect on an embedding
  std::optional<int64_t> num_ctx;
  if (absl::Status s = Options(body, &ignored, &num_ctx); !s.ok()) return s;
  e.num_ctx = num_ctx;
  if (absl::Status s = ParsePoolingField(body, &spec.pooling); !s.ok()) return s;
  if (legacy) {
    // Ollama's legacy route returns the pooled vector as it is.
    spec.normalize = false;
    spec.input_field = "prompt";
    std::string prompt;
    if (absl::Status s = GetString(body, "prompt", &prompt); !s.ok()) return s;
    if (!prompt.empty()) spec.texts.push_back(prompt);
    spec.truncate = true;
  } else {
    spec.truncate = true;  // Ollama's default
    if (absl::Status s = GetBool(body, "truncate", &spec.truncate); !s.ok()) return s;
    if (const json* d = Field(body, "dimensions"); d != nullptr) {
      if (!d->is_number_integer()) return WrongType("dimensions", "an integer");
      spec.dimensions = d->get<int64_t>();
    }
    const json* input = Field(body, "input");
    if (input != nullptr) {
      if (input->is_string()) {
        if (!input->get_ref<const std::string&>().empty()) spec.texts.push_back(*input);
      } else if (input->is_array()) {
        if (input->size() > kMaxEmbeddingInputs) {
          return InvalidRequest("input", "invalid_value",
                                absl::StrCat("'input' has ", input->size(), " inputs; at most ",
                                             kMaxEmbeddingInputs, " are allowed"));
        }
        for (size_t i = 0; i < input->size(); ++i) {
          if (!(*input)[i].is_string()) {
            return WrongType(absl::StrCat("input[", i, "]"), "a string");
          }
          spec.texts.push_back((*input)[i].get<std::string>());
        }
      } else {
        return WrongType("input", "a string or an array of strings");
      }
    }
  }
  e.empty = spec.texts.empty();
  return e;
}

absl::StatusOr<std::string> OllamaModelName(const ModelRegistry& registry, std::string_view name) {
  if (registry.Lookup(name) != nullptr) return std::string(name);
  constexpr std::string_view kLatest = ":latest";
  if (name.size() > kLatest.size() && name.substr(name.size() - kLatest.size()) == kLatest) {
    const std::string_view bare = name.substr(0, name.size() - kLatest.size());
    if (registry.Lookup(bare) != nullptr) return std::string(bare);
  }
  return NotFound("model_not_found", absl::StrCat("model '", ToAbsl(name),
                                                  "' not found; GET /api/tags lists the "
                                                  "served models"));
}

std::string OllamaTaggedName(const std::string& name) {
  return name.find(':') == std::string::npos ? name + ":latest" : name;
}

}  // namespace thermocline::server

namespace thermocline::server {

absl::Status CheckNumCtx(const std::optional<int64_t>& num_ctx, const LoadedModel& model) {
  if (!num_ctx || *num_ctx <= model.n_ctx) return absl::OkStatus();
  return InvalidRequest(
      "options.num_ctx", "unsupported_value",
      absl::StrCat("'options.num_ctx' is ", *num_ctx, " but model '", model.config().name,
                   "' is served with a context of ", model.n_ctx,
                   " tokens (its [[models]] n_ctx); send at most that"));
}

}  // namespace thermocline::server
