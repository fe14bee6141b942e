#include "server/openai_request.h"

#include <cmath>
#include <limits>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "server/errors.h"

namespace thermocline::server {
namespace {

using nlohmann::json;

constexpr int kMaxDepth = 64;

absl::Status WrongType(const std::string& param, const char* expected) {
  return InvalidRequest(param, "invalid_type", absl::StrCat("'", param, "' must be ", expected));
}

const json* Field(const json& body, const char* key) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return nullptr;
  return &*it;
}

absl::Status GetDouble(const json& body, const char* key, std::optional<double>* out) {
  const json* v = Field(body, key);
  if (v == nullptr) return absl::OkStatus();
  if (!v->is_number()) return WrongType(key, "a number");
  *out = v->get<double>();
  return absl::OkStatus();
}

absl::Status GetInt(const json& body, const char* key, std::optional<int64_t>* out) {
  const json* v = Field(body, key);
  if (v == nullptr) return absl::OkStatus();
  if (v->is_number_unsigned()) {
    const uint64_t u = v->get<uint64_t>();
    // Seeds may use the whole 64 bits; other fields are range-checked later.
    *out = static_cast<int64_t>(u);
    return absl::OkStatus();
  }
  if (v->is_number_integer()) {
    *out = v->get<int64_t>();
    return absl::OkStatus();
  }
  if (v->is_number_float()) {
    const double d = v->get<double>();
    // Range first: converting a double past int64 is undefined.
    if (std::abs(d) < 9e15 && d == static_cast<double>(static_cast<int64_t>(d))) {
      *out = static_cast<int64_t>(d);
      return absl::OkStatus();
    }
  }
  return WrongType(key, "an integer");
}

absl::Status GetBool(const json& body, const char* key, bool* out) {
  const json* v = Field(body, key);
  if (v == nullptr) return absl::OkStatus();
  if (!v->is_boolean()) return WrongType(key, "a boolean");
  *out = v->get<bool>();
  return absl::OkStatus();
}

// A string, or an array of text parts [{"type":"text","text":...}] (kept in `parts` too).
absl::Status MessageContent(const json& v, const std::string& param, std::string* out,
                            std::vector<std::string>* parts) {
  if (v.is_string()) {
    *out = v.get<std::string>();
    return absl::OkStatus();
  }
  if (!v.is_array()) return WrongType(param, "a string or an array of content parts");
  for (size_t i = 0; i < v.size(); ++i) {
    const json& part = v[i];
    const std::string p = absl::StrCat(param, "[", i, "]");
    if (!part.is_object()) return WrongType(p, "an object");
    const json* type = Field(part, "type");
    if (type == nullptr || !type->is_string()) {
      return InvalidRequest(p + ".type", "missing_required_parameter",
                            absl::StrCat("'", p, ".type' is required"));
    }
    if (*type != "text") {
      return InvalidRequest(p + ".type", "unsupported_value",
                            absl::StrCat("content parts of type '", type->get<std::string>(),
                                         "' are not supported; only 'text' is"));
    }
    const json* text = Field(part, "text");
    if (text == nullptr || !text->is_string()) return WrongType(p + ".text", "a string");
    *out += text->get<std::string>();
    parts->push_back(text->get<std::string>());
  }
  return absl::OkStatus();
}

absl::Status OptionalString(const json& obj, const char* key, const std::string& param,
                            std::string* out) {
  const json* v = Field(obj, key);
  if (v == nullptr) return absl::OkStatus();
  if (!v->is_string()) return WrongType(absl::StrCat(param, ".", key), "a string");
  *out = v->get<std::string>();
  return absl::OkStatus();
}

// An assistant message's tool_calls: [{"id", "type": "function", "function": {"name",
// "arguments": JSON text}}].
absl::Status ToolCalls(const json& v, const std::string& param, ChatMessage* msg) {
  if (!v.is_array()) return WrongType(param, "an array");
  for (size_t i = 0; i < v.size(); ++i) {
    const std::string p = absl::StrCat(param, "[", i, "]");
    if (!v[i].is_object()) return WrongType(p, "an object");
    ChatToolCall call;
    if (absl::Status s = OptionalString(v[i], "id", p, &call.id); !s.ok()) return s;
    if (absl::Status s = OptionalString(v[i], "type", p, &call.type); !s.ok()) return s;
    const json* function = Field(v[i], "function");
    if (function == nullptr || !function->is_object()) {
      return InvalidRequest(p + ".function", "missing_required_parameter",
                            absl::StrCat("'", p, ".function' is required (an object)"));
    }
    if (absl::Status s = OptionalString(*function, "name", p + ".function", &call.name); !s.ok())
      return s;
    const json* arguments = Field(*function, "arguments");
    if (arguments != nullptr) {
      // The API sends a JSON string; an object some clients send is taken as its text.
      call.arguments = arguments->is_string() ? arguments->get<std::string>() : arguments->dump();
    }
    msg->tool_calls.push_back(std::move(call));
  }
  return absl::OkStatus();
}

absl::Status Messages(const json& body, GenerationSpec* spec) {
  const json* msgs = Field(body, "messages");
  if (msgs == nullptr) {
    return InvalidRequest("messages", "missing_required_parameter", "'messages' is required");
  }
  if (!msgs->is_array()) return WrongType("messages", "an array");
  if (msgs->empty()) {
    return InvalidRequest("messages", "invalid_value", "'messages' must not be empty");
  }
  for (size_t i = 0; i < msgs->size(); ++i) {
    const json& m = (*msgs)[i];
    const std::string p = absl::StrCat("messages[", i, "]");
    if (!m.is_object()) return WrongType(p, "an object");
    const json* role = Field(m, "role");
    if (role == nullptr) {
      return InvalidRequest(p + ".role", "missing_required_parameter",
                            absl::StrCat("'", p, ".role' is required"));
    }
    if (!role->is_string()) return WrongType(p + ".role", "a string");
    ChatMessage msg;
    msg.role = role->get<std::string>();
    if (absl::Status s = NormalizeChatRole(p + ".role", &msg.role); !s.ok()) return s;
    const json* content = Field(m, "content");
    if (content == nullptr) {
      if (msg.role != "assistant") {
        return InvalidRequest(p + ".content", "missing_required_parameter",
                              absl::StrCat("'", p, ".content' is required"));
      }
      msg.content_is_null = true;
    } else if (absl::Status s =
                   MessageContent(*content, p + ".content", &msg.content, &msg.content_parts);
               !s.ok()) {
      return s;
    }
    if (const json* calls = Field(m, "tool_calls")) {
      if (absl::Status s = ToolCalls(*calls, p + ".tool_calls", &msg); !s.ok()) return s;
    }
    if (absl::Status s = OptionalString(m, "tool_call_id", p, &msg.tool_call_id); !s.ok()) return s;
    if (absl::Status s = OptionalString(m, "name", p, &msg.name); !s.ok()) return s;
    spec->messages.push_back(std::move(msg));
  }
  return absl::OkStatus();
}

absl::Status TokenIds(const json& v, const char* param, std::vector<int64_t>* out) {
  for (const json& t : v) {
    if (!t.is_number_integer()) return WrongType(param, "a string or an array of token ids");
    out->push_back(t.get<int64_t>());
  }
  return absl::OkStatus();
}

// A string, [string], [ids], or [[ids]]; several prompts in one request are not supported.
absl::Status Prompt(const json& body, GenerationSpec* spec) {
  const json* p = Field(body, "prompt");
  if (p == nullptr) {
    return InvalidRequest("prompt", "missing_required_parameter", "'prompt' is required");
  }
  if (p->is_string()) {
    spec->prompt_text = p->get<std::string>();
    return absl::OkStatus();
  }
  if (!p->is_array() || p->empty()) {
    return WrongType("prompt", "a string, an array of strings or an array of token ids");
  }
  const json& first = (*p)[0];
  if (first.is_number_integer()) {
    spec->prompt_ids.emplace();
    return TokenIds(*p, "prompt", &*spec->prompt_ids);
  }
  if (p->size() > 1) {
    return InvalidRequest("prompt", "unsupported_value",
                          "several prompts in one request are not supported; send one each");
  }
  if (first.is_string()) {
    spec->prompt_text = first.get<std::string>();
    return absl::OkStatus();
  }
  if (first.is_array() && !first.empty()) {
    spec->prompt_ids.emplace();
    return TokenIds(first, "prompt", &*spec->prompt_ids);
  }
  return WrongType("prompt", "a string, an array of strings or an array of token ids");
}

absl::Status Stop(const json& body, GenerationSpec* spec) {
  const json* s = Field(body, "stop");
  if (s == nullptr) return absl::OkStatus();
  if (s->is_string()) {
    spec->stop.push_back(s->get<std::string>());
    return absl::OkStatus();
  }
  if (!s->is_array()) return WrongType("stop", "a string or an array of strings");
  for (const json& item : *s) {
    if (!item.is_string()) return WrongType("stop", "a string or an array of strings");
    spec->stop.push_back(item.get<std::string>());
  }
  return absl::OkStatus();
}

absl::Status LogitBias(const json& body, GenerationSpec* spec) {
  const json* b = Field(body, "logit_bias");
  if (b == nullptr) return absl::OkStatus();
  if (!b->is_object()) return WrongType("logit_bias", "an object mapping token ids to numbers");
  for (const auto& [key, value] : b->items()) {
    int64_t id;
    if (!absl::SimpleAtoi(key, &id) || !value.is_number()) {
      return WrongType("logit_bias", "an object mapping token ids to numbers");
    }
    spec->logit_bias.emplace_back(id, value.get<double>());
  }
  return absl::OkStatus();
}

// Chat: "logprobs": bool. Completions: "logprobs": integer count of alternatives (0..5 in the
// OpenAI API; true is taken as 0).
absl::Status Logprobs(const json& body, GenerationSpec* spec) {
  const json* lp = Field(body, "logprobs");
  if (spec->kind == ApiKind::kChat || lp == nullptr || lp->is_boolean()) {
    if (absl::Status s = GetBool(body, "logprobs", &spec->logprobs); !s.ok()) return s;
    return GetInt(body, "top_logprobs", &spec->top_logprobs);
  }
  std::optional<int64_t> n;
  if (absl::Status s = GetInt(body, "logprobs", &n); !s.ok()) return s;
  spec->logprobs = true;
  spec->top_logprobs = n;
  return absl::OkStatus();
}

// The body with its keys in the order the client wrote them (nlohmann::json sorts them), parsed
// on first use: templates print tools as JSON and a schema's property order is the output's,
// so the order is part of the request.
class OrderedBody {
 public:
  OrderedBody(const json& body, std::string_view raw) : body_(body), raw_(raw) {}
  const nlohmann::ordered_json& get() {
    if (!parsed_) {
      parsed_ = true;
      if (!raw_.empty()) ordered_ = nlohmann::ordered_json::parse(raw_, nullptr, false);
      if (raw_.empty() || ordered_.is_discarded() || !ordered_.is_object()) {
        ordered_ = nlohmann::ordered_json::parse(body_.dump());
      }
    }
    return ordered_;
  }

 private:
  const json& body_;
  std::string_view raw_;
  bool parsed_ = false;
  nlohmann::ordered_json ordered_;
};

// "tools" (an array of function tools) and "chat_template_kwargs" (an object of extra template
// variables), key order kept.
absl::Status TemplateInputs(const json& body, OrderedBody& ordered, GenerationSpec* spec) {
  const json* tools = Field(body, "tools");
  const json* kwargs = Field(body, "chat_template_kwargs");
  if (tools == nullptr && kwargs == nullptr) return absl::OkStatus();
  if (tools != nullptr) {
    if (!tools->is_array()) return WrongType("tools", "an array");
    for (size_t i = 0; i < tools->size(); ++i) {
      const json& t = (*tools)[i];
      const std::string p = absl::StrCat("tools[", i, "]");
      if (!t.is_object()) return WrongType(p, "an object");
      const json* type = Field(t, "type");
      if (type != nullptr && *type != "function") {
        return InvalidRequest(p + ".type", "unsupported_value",
                              "only tools of type 'function' are supported");
      }
      const json* fn = Field(t, "function");
      if (fn == nullptr || !fn->is_object()) {
        return InvalidRequest(p + ".function", "missing_required_parameter",
                              absl::StrCat("'", p, ".function' is required (an object)"));
      }
      const json* name = Field(*fn, "name");
      if (name == nullptr || !name->is_string() || name->get<std::string>().empty()) {
        return InvalidRequest(p + ".function.name", "missing_required_parameter",
                              absl::StrCat("'", p, ".function.name' must be a non-empty string"));
      }
    }
  }
  if (kwargs != nullptr && !kwargs->is_object()) {
    return WrongType("chat_template_kwargs", "an object");
  }
  if (tools != nullptr) spec->tools = ordered.get()["tools"];
  if (kwargs != nullptr) spec->chat_template_kwargs = ordered.get()["chat_template_kwargs"];
  return absl::OkStatus();
}

// "tool_choice": "auto" | "none" | "required" | {"type": "function", "function": {"name"}};
// "parallel_tool_calls": boolean.
absl::Status ToolChoice(const json& body, GenerationSpec* spec) {
  if (absl::Status s = GetBool(body, "parallel_tool_calls", &spec->parallel_tool_calls); !s.ok()) {
    return s;
  }
  const json* choice = Field(body, "tool_choice");
  if (choice == nullptr) return absl::OkStatus();
  if (choice->is_string()) {
    const std::string c = choice->get<std::string>();
    if (c != "auto" && c != "none" && c != "required") {
      return InvalidRequest(
          "tool_choice", "invalid_value",
          absl::StrCat("tool_choice '", c,
                       "' is not one of auto, none, required or "
                       "{\"type\": \"function\", \"function\": {\"name\": ...}}"));
    }
    spec->tool_choice = c;
    return absl::OkStatus();
  }
  if (!choice->is_object()) return WrongType("tool_choice", "a string or an object");
  const json* type = Field(*choice, "type");
  if (type == nullptr || *type != "function") {
    return InvalidRequest("tool_choice.type", "unsupported_value",
                          "only tool_choice {\"type\": \"function\", \"function\": "
                          "{\"name\": ...}} is supported among the object forms");
  }
  const json* fn = Field(*choice, "function");
  const json* name = fn != nullptr && fn->is_object() ? Field(*fn, "name") : nullptr;
  if (name == nullptr || !name->is_string() || name->get<std::string>().empty()) {
    return InvalidRequest("tool_choice.function.name", "missing_required_parameter",
                          "'tool_choice.function.name' must name one of the tools");
  }
  spec->tool_choice = "function";
  spec->tool_choice_function = name->get<std::string>();
  return absl::OkStatus();
}

// "response_format": {"type": "text" | "json_object" | "json_schema", "json_schema": {"name",
// "schema", "strict"}}; "grammar": GBNF text.
absl::Status OutputFormat(const json& body, OrderedBody& ordered, GenerationSpec* spec) {
  if (const json* g = Field(body, "grammar")) {
    if (!g->is_string()) return WrongType("grammar", "a string (GBNF)");
    spec->grammar = g->get<std::string>();
  }
  const json* fmt = Field(body, "response_format");
  if (fmt == nullptr) return absl::OkStatus();
  if (!fmt->is_object()) return WrongType("response_format", "an object");
  const json* type = Field(*fmt, "type");
  if (type == nullptr) {
    return InvalidRequest("response_format.type", "missing_required_parameter",
                          "'response_format.type' is required");
  }
  if (*type != "text" && *type != "json_object" && *type != "json_schema") {
    return InvalidRequest("response_format.type", "unsupported_value",
                          "response_format.type must be text, json_object or json_schema");
  }
  spec->response_format = type->get<std::string>();
  if (spec->response_format != "json_schema") return absl::OkStatus();
  const json* js = Field(*fmt, "json_schema");
  if (js == nullptr || !js->is_object()) {
    return InvalidRequest("response_format.json_schema", "missing_required_parameter",
                          "'response_format.json_schema' is required (an object with the schema)");
  }
  if (const json* name = Field(*js, "name"); name != nullptr && !name->is_string()) {
    return WrongType("response_format.json_schema.name", "a string");
  }
  if (absl::Status s = GetBool(*js, "strict", &spec->json_schema_strict); !s.ok()) {
    return WrongType("response_format.json_schema.strict", "a boolean");
  }
  if (const json* schema = Field(*js, "schema")) {
    if (!schema->is_object() && !schema->is_boolean()) {
      return WrongType("response_format.json_schema.schema", "an object (a JSON schema)");
    }
    spec->json_schema = ordered.get()["response_format"]["json_schema"]["schema"];
  }
  return absl::OkStatus();
}

// Fields of the OpenAI API this server knows but does not implement: a 400 naming the field
// rather than an answer that silently ignores it.
absl::Status RefuseUnsupported(const json& body, ApiKind kind) {
  struct Refused {
    const char* field;
    const char* why;
  };
  static constexpr Refused kRefused[] = {
      {"functions", "the deprecated 'functions' is not supported; send 'tools'"},
      {"function_call", "the deprecated 'function_call' is not supported; send 'tool_choice'"},
      {"audio", "audio output is not supported"},
      {"prediction", "predicted outputs are not supported"},
      {"web_search_options", "web search is not supported"},
      {"reasoning_effort", "reasoning_effort is not supported by this server"},
      {"verbosity", "verbosity is not supported by this server"},
  };
  for (const Refused& r : kRefused) {
    if (Field(body, r.field) != nullptr) {
      return InvalidRequest(r.field, "unsupported_value", r.why);
    }
  }
  if (const json* store = Field(body, "store"); store != nullptr && *store == true) {
    return InvalidRequest(
        "store", "unsupported_value",
        "stored completions are not supported; send store: false or leave it out");
  }
  if (const json* m = Field(body, "modalities")) {
    if (!m->is_array()) return WrongType("modalities", "an array of strings");
    for (const json& v : *m) {
      if (v != "text") {
        return InvalidRequest("modalities", "unsupported_value",
                              "only the 'text' modality is supported");
      }
    }
  }
  if (const json* tier = Field(body, "service_tier");
      tier != nullptr && *tier != "auto" && *tier != "default") {
    return InvalidRequest("service_tier", "unsupported_value",
                          "service_tier may only be 'auto' or 'default' (there is one tier)");
  }
  if (kind == ApiKind::kCompletion) {
    if (const json* suffix = Field(body, "suffix"); suffix != nullptr && *suffix != "") {
      return InvalidRequest("suffix", "unsupported_value", "suffix (insertion) is not supported");
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<json> ParseJsonObject(std::string_view body) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < body.size(); ++i) {
    const char c = body[i];
    if (in_string) {
      if (c == '\\')
        ++i;
      else if (c == '"')
        in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '{' || c == '[') {
      if (++depth > kMaxDepth) {
        return InvalidRequest(
            "", "invalid_json",
            absl::StrCat("the JSON body nests deeper than ", kMaxDepth, " levels"));
      }
    } else if (c == '}' || c == ']') {
      --depth;
    }
  }
  json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    return InvalidRequest("", "invalid_json", "the request body is not valid JSON");
  }
  if (!j.is_object()) {
    return InvalidRequest("", "invalid_json", "the request body must be a JSON object");
  }
  return j;
}

absl::StatusOr<std::string> RequestedModel(const json& body) {
  const json* m = Field(body, "model");
  if (m == nullptr) {
    return InvalidRequest("model", "missing_required_parameter", "'model' is required");
  }
  if (!m->is_string()) return WrongType("model", "a string");
  return m->get<std::string>();
}

absl::StatusOr<GenerationSpec> SpecFromOpenAi(const json& body, ApiKind kind,
                                              std::string_view raw_body) {
  GenerationSpec spec;
  spec.kind = kind;
  auto model = RequestedModel(body);
  if (!model.ok()) return model.status();
  spec.model = *model;
  absl::Status s = kind == ApiKind::kChat ? Messages(body, &spec) : Prompt(body, &spec);
  if (!s.ok()) return s;
  if (absl::Status st = RefuseUnsupported(body, kind); !st.ok()) return st;
  OrderedBody ordered(body, raw_body);
  if (kind == ApiKind::kChat) {
    if (absl::Status st = TemplateInputs(body, ordered, &spec); !st.ok()) return st;
    if (absl::Status st = ToolChoice(body, &spec); !st.ok()) return st;
  } else {
    for (const char* field : {"tools", "tool_choice"}) {
      if (Field(body, field) != nullptr) {
        return InvalidRequest(field, "unsupported_value",
                              absl::StrCat("'", field, "' is for /v1/chat/completions"));
      }
    }
  }
  if (absl::Status st = OutputFormat(body, ordered, &spec); !st.ok()) return st;
  std::optional<int64_t> max_completion_tokens, best_of;
  for (absl::Status st : {
           GetDouble(body, "temperature", &spec.temperature),
           GetDouble(body, "top_p", &spec.top_p),
           GetDouble(body, "min_p", &spec.min_p),
           GetDouble(body, "repeat_penalty", &spec.repeat_penalty),
           GetDouble(body, "presence_penalty", &spec.presence_penalty),
           GetDouble(body, "frequency_penalty", &spec.frequency_penalty),
           GetInt(body, "top_k", &spec.top_k),
           GetInt(body, "seed", &spec.seed),
           GetInt(body, "max_tokens", &spec.max_tokens),
           GetInt(body, "max_completion_tokens", &max_completion_tokens),
           GetInt(body, "n", &spec.n),
           GetInt(body, "best_of", &best_of),
           GetInt(body, "penalty_last_n", &spec.penalty_last_n),
           GetBool(body, "ignore_eos", &spec.ignore_eos),
           GetBool(body, "stream", &spec.stream),
           Stop(body, &spec),
           LogitBias(body, &spec),
           Logprobs(body, &spec),
       }) {
    if (!st.ok()) return st;
  }
  if (max_completion_tokens) {
    spec.max_tokens = max_completion_tokens;
    spec.max_tokens_field = "max_completion_tokens";
  }
  if (best_of && *best_of != 1) {
    return InvalidRequest("best_of", "unsupported_value", "only best_of = 1 is supported");
  }
  if (const json* echo = Field(body, "echo"); echo != nullptr && *echo == true) {
    return InvalidRequest("echo", "unsupported_value", "echo is not supported");
  }
  if (const json* opts = Field(body, "stream_options")) {
    if (!opts->is_object()) return WrongType("stream_options", "an object");
    if (absl::Status st = GetBool(*opts, "include_usage", &spec.include_usage); !st.ok()) {
      return InvalidRequest("stream_options.include_usage", "invalid_type",
                            "'stream_options.include_usage' must be a boolean");
    }
  }
  if (const json* overflow = Field(body, "context_overflow")) {
    if (!overflow->is_string()) return WrongType("context_overflow", "\"refuse\" or \"truncate\"");
    spec.context_overflow = overflow->get<std::string>();  // checked by BuildRequest
  }
  return spec;
}

}  // namespace thermocline::server
