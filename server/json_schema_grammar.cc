// The public grammar builders: a schema document, any JSON object, and tool calls (one
// SchemaCompiler per function, all writing into one GbnfBuilder).
#include "server/json_schema_grammar.h"

#include <algorithm>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/gbnf_builder.h"
#include "server/json_schema_compiler.h"

namespace thermocline::server {

using schema_internal::Dump;
using schema_internal::Json;
using schema_internal::SchemaCompiler;

absl::StatusOr<std::string> JsonSchemaToGbnf(const nlohmann::ordered_json& schema,
                                             const JsonGrammarOptions& options) {
  GbnfBuilder b(options.compact);
  SchemaCompiler compiler(b, schema, options, "");
  absl::StatusOr<std::string> root = compiler.Visit(schema, "", "root");
  if (!root.ok()) return root.status();
  return b.Text(*root);
}

absl::StatusOr<std::string> JsonSchemaTextToGbnf(std::string_view schema_json,
                                                 const JsonGrammarOptions& options) {
  const Json schema = Json::parse(schema_json, nullptr, /*allow_exceptions=*/false);
  if (schema.is_discarded()) {
    return absl::InvalidArgumentError("json_schema: the schema is not valid JSON");
  }
  return JsonSchemaToGbnf(schema, options);
}

std::string JsonObjectGbnf(const JsonGrammarOptions& options) {
  GbnfBuilder b(options.compact);
  return b.Text(b.Primitive("json-object"));
}

absl::StatusOr<std::string> ToolCallGbnf(const nlohmann::ordered_json& tools,
                                         const ToolCallGrammarOptions& options) {
  if (!tools.is_array() || tools.empty()) {
    return absl::InvalidArgumentError("tools: must be a non-empty array of functions");
  }
  GbnfBuilder b(options.json.compact);
  const std::string ws = b.Primitive("ws");
  static const Json kNoParameters = {{"type", "object"}, {"properties", Json::object()}};
  std::vector<std::string> calls;
  std::set<std::string> seen;
  for (size_t i = 0; i < tools.size(); ++i) {
    const std::string where = absl::StrCat("tools[", i, "]");
    const Json& tool = tools[i];
    if (!tool.is_object() || tool.value("type", "") != "function" || !tool.contains("function") ||
        !tool["function"].is_object()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": must be {\"type\": \"function\", \"function\": {...}}"));
    }
    const Json& fn = tool["function"];
    if (!fn.contains("name") || !fn["name"].is_string() || fn["name"].get<std::string>().empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ".function.name: must be a non-empty string"));
    }
    const std::string name = fn["name"].get<std::string>();
    if (!options.only.empty() &&
        std::find(options.only.begin(), options.only.end(), name) == options.only.end()) {
      continue;
    }
    seen.insert(name);
    const Json& params = fn.contains("parameters") ? fn["parameters"] : kNoParameters;
    JsonGrammarOptions json = options.json;
    if (fn.contains("strict") && fn["strict"].is_boolean() && fn["strict"].get<bool>()) {
      json.strict = true;
    }
    SchemaCompiler compiler(b, params, json, where + ".function.parameters");
    absl::StatusOr<std::string> args =
        compiler.Visit(params, "", absl::StrCat("tool-", name, "-args"));
    if (!args.ok()) return args.status();
    calls.push_back(
        b.Add(absl::StrCat("tool-", name),
              GbnfSeq({GbnfLiteral("{"), ws, GbnfLiteral("\"name\""), ws, GbnfLiteral(":"), ws,
                       GbnfLiteral(Dump(Json(name))), ws, GbnfLiteral(","), ws,
                       GbnfLiteral(Dump(Json(options.arguments_key))), ws, GbnfLiteral(":"), ws,
                       *args, ws, GbnfLiteral("}")})));
  }
  for (const std::string& name : options.only) {
    if (!seen.count(name)) {
      return absl::InvalidArgumentError(
          absl::StrCat("tool_choice: function '", name, "' is not among the tools"));
    }
  }
  const std::string call =
      b.Add("tool-call", GbnfSeq({options.prefix.empty() ? "" : GbnfLiteral(options.prefix),
                                  absl::StrCat("( ", absl::StrJoin(calls, " | "), " )"),
                                  options.suffix.empty() ? "" : GbnfLiteral(options.suffix)}));
  if (!options.parallel) return b.Text(call);
  return b.Text(GbnfSeq(
      {call, GbnfRepeat(GbnfSeq({GbnfLiteral(options.separator), call}), 0, std::nullopt)}));
}

}  // namespace thermocline::server
