// Grammars for structured output: a JSON schema compiled to GBNF (response_format
// json_schema), any JSON object (response_format json_object), and a tool call whose arguments
// match the called function's parameters schema (tool_choice "required" or a named function).
// The GBNF text goes to Grammar::FromGbnf; the matcher then lets the model write only that.
//
// Supported: type (one or a list) object / array / string / number / integer / boolean / null;
// properties, required, additionalProperties (false, true or a schema); items, prefixItems,
// minItems, maxItems; minLength, maxLength, pattern (a regular expression, see
// regex_grammar.h), format date / time / date-time / uuid; integer minimum / maximum /
// exclusiveMinimum / exclusiveMaximum; enum, const, anyOf, oneOf (as anyOf), allOf of one
// schema, $ref to #, #/$defs/... or #/definitions/... (recursion allowed); annotations (title,
// description, default, examples, ...) are ignored. Any other keyword is an Unimplemented
// error naming it and where it is, never silently dropped.
//
// The grammar may be stricter than the schema, never looser: properties come in the order
// the schema lists them; with additionalProperties absent no other property is written;
// numbers keep to 16 digits; whitespace is bounded (or none, `compact`).
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace thermocline::server {

struct JsonGrammarOptions {
  // OpenAI's strict structured outputs: every property must be listed in `required` and
  // additionalProperties must be false or absent; otherwise an InvalidArgument error.
  bool strict = false;
  // No whitespace at all between JSON tokens.
  bool compact = false;
};

// Property order is the object's order: parse requests with nlohmann::ordered_json (or use
// the text overload) to keep the order the client wrote.
absl::StatusOr<std::string> JsonSchemaToGbnf(const nlohmann::ordered_json& schema,
                                             const JsonGrammarOptions& options = {});
absl::StatusOr<std::string> JsonSchemaTextToGbnf(std::string_view schema_json,
                                                 const JsonGrammarOptions& options = {});

// Any JSON object (response_format {"type": "json_object"}).
std::string JsonObjectGbnf(const JsonGrammarOptions& options = {});

struct ToolCallGrammarOptions {
  std::string prefix;                       // written before each call, e.g. "<tool_call>\n"
  std::string suffix;                       // after each call, e.g. "\n</tool_call>"
  std::string arguments_key = "arguments";  // Llama 3.x writes "parameters"
  // Only these functions (tool_choice naming one); empty: any function in `tools`.
  std::vector<std::string> only;
  bool parallel = false;  // one or more calls, each wrapped, joined by `separator`
  std::string separator = "\n";
  JsonGrammarOptions json;  // a function's own "strict": true also makes it strict
};

// OpenAI `tools` ([{"type": "function", "function": {"name", "parameters", "strict"}}]) to a
// grammar of exactly: prefix {"name": "<a function's name>", "<arguments_key>": <an object
// matching that function's parameters>} suffix. A function without parameters takes {}.
absl::StatusOr<std::string> ToolCallGbnf(const nlohmann::ordered_json& tools,
                                         const ToolCallGrammarOptions& options);

}  // namespace thermocline::server
