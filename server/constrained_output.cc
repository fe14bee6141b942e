// The request's output constraints turned into a compiled grammar and tool-call settings.
// Compiled grammars are cached by their GBNF text, so a client that sends the same schema on
// every request compiles it once.
#include "server/constrained_output.h"

#include <mutex>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "server/errors.h"
#include "server/json_schema_grammar.h"
#include "server/tool_calls.h"

namespace thermocline::server {
namespace {

// Grammar::FromGbnf with a cache of the grammars requests hold now (weak: one no request uses
// is compiled again); at most kMaxCached texts are remembered.
absl::StatusOr<std::shared_ptr<const Grammar>> CompileCached(const std::string& gbnf) {
  static constexpr size_t kMaxCached = 64;
  static std::mutex mu;
  static absl::flat_hash_map<std::string, std::weak_ptr<const Grammar>> cache;
  {
    std::lock_guard<std::mutex> lock(mu);
    auto it = cache.find(gbnf);
    if (it != cache.end()) {
      if (auto g = it->second.lock()) return g;
    }
  }
  auto g = Grammar::FromGbnf(gbnf);
  if (!g.ok()) return g.status();
  std::lock_guard<std::mutex> lock(mu);
  if (cache.size() >= kMaxCached) cache.clear();
  cache[gbnf] = *g;
  return *g;
}

bool ForcesCall(const GenerationSpec& spec) {
  return spec.tool_choice == "required" || spec.tool_choice == "function";
}

}  // namespace

ChatInputs ChatInputsFor(const GenerationSpec& spec, const std::vector<ChatMessage>& messages,
                         const ChatTemplate& chat_template) {
  ChatInputs in;
  const bool with_tools =
      spec.tools.is_array() && !spec.tools.empty() && spec.tool_choice != "none";
  // A named function is the only one the model can call: the only one it is shown.
  nlohmann::ordered_json tools = spec.tools;
  if (with_tools && spec.tool_choice == "function") {
    tools = nlohmann::ordered_json::array();
    for (const auto& t : spec.tools) {
      if (t.contains("function") && t["function"].value("name", "") == spec.tool_choice_function) {
        tools.push_back(t);
      }
    }
    if (tools.empty()) tools = spec.tools;  // an unknown name is refused by the grammar's build
  }
  if (chat_template.renders_tools()) {
    // As sent (an empty list too: templates may test `tools is not none`), unless "none".
    if (with_tools) {
      in.tools = std::move(tools);
    } else if (spec.tool_choice != "none") {
      in.tools = spec.tools;
    }
    in.messages = messages;
    return in;
  }
  bool history = false;  // earlier calls or results the template cannot write
  for (const ChatMessage& m : messages) history |= !m.tool_calls.empty() || m.role == "tool";
  if (!with_tools && !history) {
    in.messages = messages;
    return in;
  }
  in.messages = WithToolPrompt(messages, with_tools ? tools : nlohmann::ordered_json());
  return in;
}

absl::Status ApplyOutputConstraints(const GenerationSpec& spec, const LoadedModel& model,
                                    GenerationRequest* request) {
  const bool has_tools = spec.tools.is_array() && !spec.tools.empty();
  if (!spec.tool_choice.empty() && spec.tool_choice != "none" && spec.tool_choice != "auto" &&
      !has_tools) {
    return InvalidRequest("tool_choice", "invalid_value",
                          absl::StrCat("tool_choice '", spec.tool_choice,
                                       "' needs 'tools' with at least one function"));
  }
  std::vector<const char*> constraints;
  if (spec.grammar) constraints.push_back("grammar");
  if (spec.response_format != "text") constraints.push_back("response_format");
  if (has_tools && ForcesCall(spec)) constraints.push_back("tool_choice");
  if (constraints.size() > 1) {
    return InvalidRequest(constraints[1], "invalid_value",
                          absl::StrCat("'", constraints[0], "' and '", constraints[1],
                                       "' both constrain the output; send one of them"));
  }
  const ToolCallFormat format = model.chat_template->tool_format();
  // Tool calls are looked for in free output only: JSON asked for by a schema is content.
  if (spec.kind == ApiKind::kChat && has_tools && spec.tool_choice != "none" &&
      constraints.empty()) {
    request->parse_tool_calls = true;
  }
  request->tool_format = format;
  request->parallel_tool_calls = spec.parallel_tool_calls;

  std::string gbnf;
  const char* field = "";
  if (spec.grammar) {
    gbnf = *spec.grammar;
    field = "grammar";
  } else if (spec.response_format == "json_object" ||
             (spec.response_format == "json_schema" && spec.json_schema.is_null())) {
    gbnf = JsonObjectGbnf();
    field = "response_format";
  } else if (spec.response_format == "json_schema") {
    JsonGrammarOptions options;
    options.strict = spec.json_schema_strict;
    const nlohmann::ordered_json& schema = spec.json_schema;
    auto text =
        schema.is_boolean()
            ? (schema.get<bool>() ? absl::StatusOr<std::string>(JsonObjectGbnf(options))
                                  : absl::InvalidArgumentError("json_schema: the schema false "
                                                               "allows no output"))
            : JsonSchemaToGbnf(schema, options);
    if (!text.ok()) {
      return InvalidRequest("response_format.json_schema.schema", "invalid_value",
                            std::string(text.status().message()));
    }
    gbnf = std::move(*text);
    field = "response_format";
  } else if (has_tools && ForcesCall(spec)) {
    ToolCallGrammarOptions options = ToolCallGrammarFor(format);
    if (spec.tool_choice == "function") options.only = {spec.tool_choice_function};
    auto text = ToolCallGbnf(spec.tools, options);
    if (!text.ok()) {
      const bool choice =
          spec.tool_choice == "function" && text.status().message().find("tool_choice") == 0;
      return InvalidRequest(choice ? "tool_choice" : "tools", "invalid_value",
                            std::string(text.status().message()));
    }
    gbnf = std::move(*text);
    field = "tool_choice";
    // The output is a call: parse it.
    request->parse_tool_calls = true;
    request->parallel_tool_calls = false;
  } else {
    return absl::OkStatus();
  }
  auto grammar = CompileCached(gbnf);
  if (!grammar.ok()) {
    return InvalidRequest(field, "invalid_value", std::string(grammar.status().message()));
  }
  request->grammar = *std::move(grammar);
  request->vocab_trie = model.vocab_trie();
  return absl::OkStatus();
}

}  // namespace thermocline::server
