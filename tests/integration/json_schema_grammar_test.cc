// JSON schema, json_object and tool-call grammars: each schema feature's accepted and refused
// JSON texts (through Grammar::FromGbnf and the matcher), integer bounds and patterns against
// brute force, the errors for what is not supported, and greedy decoding of stories260K under
// a schema and a tool-call grammar giving JSON that satisfies them and ends by itself.
#include "server/json_schema_grammar.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <regex>

#include "engine/model/session.h"
#include "engine/sampling/grammar.h"
#include "engine/sampling/grammar_matcher.h"
#include "engine/sampling/token_trie.h"
#include "engine/util/thread_pool.h"
#include "model_fixtures.h"
#include "test_util.h"

namespace thermocline::server {
namespace {

using Json = nlohmann::ordered_json;

std::shared_ptr<const Grammar> CompileGbnf(const std::string& gbnf) {
  absl::StatusOr<std::shared_ptr<const Grammar>> g = Grammar::FromGbnf(gbnf);
  INFO(gbnf << "\n-> " << g.status().ToString());
  REQUIRE(g.ok());
  return *g;
}

std::string SchemaGbnf(const std::string& schema, JsonGrammarOptions options = {}) {
  absl::StatusOr<std::string> gbnf = JsonSchemaTextToGbnf(schema, options);
  INFO(schema << "\n-> " << gbnf.status().ToString());
  REQUIRE(gbnf.ok());
  return *gbnf;
}

absl::Status SchemaError(const std::string& schema, JsonGrammarOptions options = {}) {
  absl::StatusOr<std::string> gbnf = JsonSchemaTextToGbnf(schema, options);
  INFO(schema);
  REQUIRE_FALSE(gbnf.ok());
  return gbnf.status();
}

class Accepts {
 public:
  explicit Accepts(const std::string& gbnf)
      : gbnf_(gbnf), m_(CompileGbnf(gbnf), TokenTrie::FromPieces({}, {})) {}
  bool operator()(std::string_view text) {
    m_.Reset();
    return m_.AcceptBytes(text) && m_.CanEnd();
  }
  const std::string& gbnf() const { return gbnf_; }

 private:
  std::string gbnf_;
  GrammarMatcher m_;
};

#define CHECK_ACCEPTS(a, text) \
  do {                         \
    INFO((a).gbnf());          \
    CHECK((a)(text));          \
  } while (0)
#define CHECK_REFUSES(a, text) \
  do {                         \
    INFO((a).gbnf());          \
    CHECK_FALSE((a)(text));    \
  } while (0)

TEST_CASE("json schema: scalar types", "[json_schema]") {
  Accepts str(SchemaGbnf(R"({"type": "string"})"));
  CHECK_ACCEPTS(str, R"("hello")");
  CHECK_ACCEPTS(str, R"("")");
  CHECK_ACCEPTS(str, R"("a\"b\\c\n\u00e9 caf\u00E9 é")");
  CHECK_REFUSES(str, R"("a)");
  CHECK_REFUSES(str, "\"a\nb\"");     // raw control character
  CHECK_REFUSES(str, R"("\ud800")");  // a lone surrogate escape
  CHECK_REFUSES(str, R"("\x")");
  CHECK_REFUSES(str, R"(1)");

  Accepts num(SchemaGbnf(R"({"type": "number"})"));
  for (const char* t : {"0", "-0", "12", "-3.25", "1e5", "2.5E-3", "0.5"}) CHECK_ACCEPTS(num, t);
  for (const char* t : {"01", "1.", ".5", "+1", "1e", "--1", "\"1\""}) CHECK_REFUSES(num, t);

  Accepts integer(SchemaGbnf(R"({"type": "integer"})"));
  CHECK_ACCEPTS(integer, "-42");
  CHECK_REFUSES(integer, "4.2");
  CHECK_REFUSES(integer, "12345678901234567");  // 17 digits: past the grammar's bound

  Accepts b(SchemaGbnf(R"({"type": "boolean"})"));
  CHECK_ACCEPTS(b, "true");
  CHECK_ACCEPTS(b, "false");
  CHECK_REFUSES(b, "null");
  Accepts null(SchemaGbnf(R"({"type": "null"})"));
  CHECK_ACCEPTS(null, "null");
  Accepts either(SchemaGbnf(R"({"type": ["string", "null"], "maxLength": 2})"));
  CHECK_ACCEPTS(either, "null");
  CHECK_ACCEPTS(either, R"("ab")");
  CHECK_REFUSES(either, R"("abc")");
  Accepts any(SchemaGbnf(R"({})"));
  for (const char* t : {"1", "[1, {\"a\": [true, null]}]", "\"x\"", "{}"}) CHECK_ACCEPTS(any, t);
}

TEST_CASE("json schema: objects, required properties in order, additionalProperties",
          "[json_schema]") {
  const std::string schema = R"({"type": "object", "properties": {
      "name": {"type": "string"}, "age": {"type": "integer"}, "tags": {"type": "array",
      "items": {"type": "string"}}}, "required": ["name", "age"]})";
  Accepts obj(SchemaGbnf(schema));
  CHECK_ACCEPTS(obj, R"({"name": "Lily", "age": 3})");
  CHECK_ACCEPTS(obj, R"({"name":"Lily","age":3,"tags":["a","b"]})");
  CHECK_ACCEPTS(obj, "{\n  \"name\": \"Lily\",\n  \"age\": 3\n}");
  CHECK_REFUSES(obj, R"({"name": "Lily"})");                    // age is required
  CHECK_REFUSES(obj, R"({"age": 3, "name": "Lily"})");          // declared order
  CHECK_REFUSES(obj, R"({"name": "Lily", "age": 3, "x": 1})");  // no other properties
  CHECK_REFUSES(obj, R"({"name": "Lily", "age": "3"})");
  CHECK_REFUSES(obj, R"({"name": "Lily", "age": 3,})");
  CHECK_REFUSES(obj, "{\"name\": \"Lily\",                                  \"age\": 3}");

  // Only optional properties: any in-order subset, the empty object included.
  Accepts opt(SchemaGbnf(R"({"properties": {"a": {"type": "integer"}, "b": {"type": "integer"},
      "c": {"type": "integer"}}})"));
  for (const char* t : {"{}", R"({"a": 1})", R"({"b": 2})", R"({"a": 1, "c": 3})",
                        R"({"a": 1, "b": 2, "c": 3})", R"({"c": 3})"}) {
    CHECK_ACCEPTS(opt, t);
  }
  for (const char* t : {R"({"b": 2, "a": 1})", R"({, "a": 1})", R"({"a": 1,})"}) {
    CHECK_REFUSES(opt, t);
  }

  Accepts extra(SchemaGbnf(R"({"properties": {"id": {"type": "integer"}}, "required": ["id"],
      "additionalProperties": {"type": "string"}})"));
  CHECK_ACCEPTS(extra, R"({"id": 1})");
  CHECK_ACCEPTS(extra, R"({"id": 1, "note": "x", "i": "y", "idx": "z"})");
  CHECK_REFUSES(extra, R"({"id": 1, "note": 2})");
  CHECK_REFUSES(extra, R"({"id": 1, "id": "again"})");  // a declared name is not an extra key
  Accepts open(SchemaGbnf(R"({"type": "object", "additionalProperties": true})"));
  CHECK_ACCEPTS(open, R"({"anything": [1, 2], "b": {"c": null}})");
  CHECK_ACCEPTS(open, R"({})");
  // A property that is required but not described takes any value.
  Accepts undescribed(SchemaGbnf(R"({"type": "object", "required": ["x"]})"));
  CHECK_ACCEPTS(undescribed, R"({"x": [1, "two"]})");
  CHECK_REFUSES(undescribed, R"({})");

  // Strict mode (OpenAI's rules).
  CHECK(JsonSchemaTextToGbnf(schema, {.strict = true}).status().code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(std::string(SchemaError(schema, {.strict = true}).message()).find("'tags' is not") !=
        std::string::npos);
  CHECK(
      SchemaError(R"({"type": "object", "additionalProperties": true})", {.strict = true}).code() ==
      absl::StatusCode::kInvalidArgument);
  Accepts strict(SchemaGbnf(R"({"type": "object", "properties": {"a": {"type": "boolean"}},
      "required": ["a"], "additionalProperties": false})",
                            {.strict = true}));
  CHECK_ACCEPTS(strict, R"({"a": true})");
  Accepts compact(SchemaGbnf(R"({"properties": {"a": {"type": "boolean"}}, "required": ["a"]})",
                             {.compact = true}));
  CHECK_ACCEPTS(compact, R"({"a":true})");
  CHECK_REFUSES(compact, R"({"a": true})");
}

TEST_CASE("json schema: enum, const, anyOf, oneOf, allOf, $ref", "[json_schema]") {
  Accepts e(SchemaGbnf(R"({"enum": ["red", "green", 3, null, {"k": [1]}]})"));
  for (const char* t : {R"("red")", R"("green")", "3", "null", R"({"k":[1]})"}) CHECK_ACCEPTS(e, t);
  CHECK_REFUSES(e, R"("blue")");
  CHECK_REFUSES(e, "4");
  Accepts typed(SchemaGbnf(R"({"type": "string", "enum": ["a", 1, "b"]})"));
  CHECK_ACCEPTS(typed, R"("a")");
  CHECK_REFUSES(typed, "1");
  Accepts c(SchemaGbnf(R"({"const": "é\"x"})"));
  CHECK_ACCEPTS(c, R"("é\"x")");
  CHECK_REFUSES(c, R"("ex")");

  Accepts any_of(SchemaGbnf(R"({"anyOf": [{"type": "integer"}, {"type": "string",
      "maxLength": 1}], "description": "annotations are fine"})"));
  CHECK_ACCEPTS(any_of, "5");
  CHECK_ACCEPTS(any_of, R"("x")");
  CHECK_REFUSES(any_of, R"("xy")");
  Accepts one_of(SchemaGbnf(R"({"oneOf": [{"type": "boolean"}, {"type": "null"}]})"));
  CHECK_ACCEPTS(one_of, "null");
  Accepts all_of(SchemaGbnf(R"({"allOf": [{"type": "boolean"}]})"));
  CHECK_ACCEPTS(all_of, "true");

  // $ref into $defs and definitions, recursion included.
  Accepts tree(SchemaGbnf(R"({"$defs": {"node": {"type": "object", "properties": {
      "v": {"type": "integer"}, "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
      "required": ["v"]}}, "$ref": "#/$defs/node"})"));
  CHECK_ACCEPTS(tree, R"({"v": 1})");
  CHECK_ACCEPTS(tree, R"({"v": 1, "kids": [{"v": 2}, {"v": 3, "kids": [{"v": 4}]}]})");
  CHECK_REFUSES(tree, R"({"v": 1, "kids": [{"w": 2}]})");
  Accepts defs(SchemaGbnf(R"({"definitions": {"id": {"type": "integer", "minimum": 0}},
      "type": "array", "items": {"$ref": "#/definitions/id"}})"));
  CHECK_ACCEPTS(defs, "[0, 7]");
  CHECK_REFUSES(defs, "[-1]");
}

TEST_CASE("json schema: arrays and string lengths are bounded exactly", "[json_schema]") {
  Accepts arr(SchemaGbnf(R"({"type": "array", "items": {"type": "integer"}, "minItems": 2,
      "maxItems": 3})"));
  CHECK_REFUSES(arr, "[]");
  CHECK_REFUSES(arr, "[1]");
  CHECK_ACCEPTS(arr, "[1, 2]");
  CHECK_ACCEPTS(arr, "[1,2,3]");
  CHECK_REFUSES(arr, "[1, 2, 3, 4]");
  CHECK_REFUSES(arr, "[1, \"2\"]");
  Accepts empty(SchemaGbnf(R"({"type": "array", "maxItems": 0})"));
  CHECK_ACCEPTS(empty, "[]");
  CHECK_REFUSES(empty, "[1]");

  Accepts tuple(SchemaGbnf(R"({"type": "array", "prefixItems": [{"type": "string"},
      {"type": "integer"}], "items": false})"));
  CHECK_ACCEPTS(tuple, R"(["a", 1])");
  CHECK_ACCEPTS(tuple, R"(["a"])");  // prefix items may be left off, as JSON Schema says
  CHECK_ACCEPTS(tuple, R"([])");
  CHECK_REFUSES(tuple, R"(["a", 1, 2])");
  CHECK_REFUSES(tuple, R"([1, "a"])");
  Accepts full_tuple(SchemaGbnf(R"({"type": "array", "prefixItems": [{"type": "string"},
      {"type": "integer"}], "items": false, "minItems": 2})"));
  CHECK_ACCEPTS(full_tuple, R"(["a", 1])");
  CHECK_REFUSES(full_tuple, R"(["a"])");
  Accepts tuple_tail(SchemaGbnf(R"({"type": "array", "prefixItems": [{"type": "string"}],
      "items": {"type": "boolean"}, "minItems": 0, "maxItems": 3})"));
  for (const char* t : {"[]", R"(["a"])", R"(["a", true])", R"(["a", true, false])"}) {
    CHECK_ACCEPTS(tuple_tail, t);
  }
  CHECK_REFUSES(tuple_tail, R"(["a", true, false, true])");
  CHECK_REFUSES(tuple_tail, "[true]");

  // Lengths count characters: an escape or a multi-byte character is one.
  Accepts len(SchemaGbnf(R"({"type": "string", "minLength": 2, "maxLength": 3})"));
  CHECK_REFUSES(len, R"("a")");
  CHECK_ACCEPTS(len, R"("ab")");
  CHECK_ACCEPTS(len, R"("a\nb")");
  CHECK_ACCEPTS(len, R"("éé")");
  CHECK_ACCEPTS(len, R"("\u00e9bc")");
  CHECK_REFUSES(len, R"("abcd")");
}

TEST_CASE("json schema: integer bounds match brute force", "[json_schema]") {
  struct Case {
    const char* schema;
    std::function<bool(int)> want;
  };
  const Case cases[] = {
      {R"({"type": "integer", "minimum": -37, "maximum": 112})",
       [](int v) { return v >= -37 && v <= 112; }},
      {R"({"type": "integer", "exclusiveMinimum": 9, "exclusiveMaximum": 100})",
       [](int v) { return v > 9 && v < 100; }},
      {R"({"type": "integer", "minimum": 5})", [](int v) { return v >= 5; }},
      {R"({"type": "integer", "maximum": -12})", [](int v) { return v <= -12; }},
      {R"({"type": "integer", "minimum": 0.5, "maximum": 99.5})",
       [](int v) { return v >= 1 && v <= 99; }},
      {R"({"type": "integer", "minimum": 3, "exclusiveMinimum": true, "maximum": 7})",
       [](int v) { return v > 3 && v <= 7; }},
      {R"({"type": "integer", "minimum": 0, "maximum": 0})", [](int v) { return v == 0; }},
      {R"({"type": "integer", "minimum": 100, "maximum": 1999})",
       [](int v) { return v >= 100 && v <= 1999; }},
  };
  for (const Case& c : cases) {
    Accepts a(SchemaGbnf(c.schema));
    for (int v = -2100; v <= 2100; ++v) {
      INFO(c.schema << " on " << v);
      if (a(std::to_string(v)) != c.want(v)) FAIL(a.gbnf());
    }
    CHECK_REFUSES(a, "-0");
    CHECK_REFUSES(a, "007");
  }
  Accepts big(SchemaGbnf(R"({"type": "integer", "minimum": 9007199254740993})"));
  CHECK_ACCEPTS(big, "9007199254740993");
  CHECK_REFUSES(big, "9007199254740992");
  CHECK(SchemaError(R"({"type": "integer", "minimum": 5, "maximum": 4})").code() ==
        absl::StatusCode::kInvalidArgument);
}

TEST_CASE("json schema: formats", "[json_schema]") {
  Accepts date(SchemaGbnf(R"({"type": "string", "format": "date"})"));
  CHECK_ACCEPTS(date, R"("2024-02-29")");
  CHECK_REFUSES(date, R"("2024-13-01")");
  CHECK_REFUSES(date, R"("2024-1-01")");
  Accepts time(SchemaGbnf(R"({"type": "string", "format": "time"})"));
  CHECK_ACCEPTS(time, R"("23:59:59Z")");
  CHECK_ACCEPTS(time, R"("08:30:00.125+02:00")");
  CHECK_REFUSES(time, R"("24:00:00Z")");
  Accepts dt(SchemaGbnf(R"({"type": "string", "format": "date-time"})"));
  CHECK_ACCEPTS(dt, R"("2024-02-29T12:00:00Z")");
  CHECK_REFUSES(dt, R"("2024-02-29 12:00:00Z")");
  Accepts uuid(SchemaGbnf(R"({"type": "string", "format": "uuid"})"));
  CHECK_ACCEPTS(uuid, R"("123e4567-e89b-12d3-a456-426614174000")");
  CHECK_REFUSES(uuid, R"("123e4567e89b12d3a456426614174000")");
}

TEST_CASE("json schema: patterns match as std::regex_search does", "[json_schema]") {
  const char* patterns[] = {
      "^[a-c]{2,3}$", "ab",         "^a|c$", "^(a|bc)+$", "\\d",         "^\\w+@\\w+$",
      "^[^a]*$",      "^a.c$",      "\"",    "^\\\\?b$",  "^(?:a|b)?1$", "^[\\s\\d]+$",
      "^a{0,2}b?$",   "^(a|)b{2}$", "c$",    "^[@-b]+$",
  };
  std::vector<std::string> strings = {""};
  const std::string alphabet = "abc1@ \"\\";
  for (size_t begin = 0, len = 0; len < 4; ++len) {
    const size_t end = strings.size();
    for (size_t i = begin; i < end; ++i) {
      for (char ch : alphabet) strings.push_back(strings[i] + ch);
    }
    begin = end;
  }
  for (const char* p : patterns) {
    Accepts a(SchemaGbnf(Json{{"type", "string"}, {"pattern", p}}.dump()));
    const std::regex re(p, std::regex::ECMAScript);
    for (const std::string& s : strings) {
      INFO("pattern " << p << " on '" << s << "'");
      if (a(Json(s).dump()) != std::regex_search(s, re)) FAIL(a.gbnf());
    }
  }
  // The grammar writes " and \ only as escapes, never raw.
  Accepts quote(SchemaGbnf(R"({"type": "string", "pattern": "^\"$"})"));
  CHECK_ACCEPTS(quote, R"("\"")");
  CHECK_REFUSES(quote, R"(""")");
}

TEST_CASE("json schema: what is not supported is an error naming it", "[json_schema]") {
  struct Case {
    const char* schema;
    absl::StatusCode code;
    const char* names;
  };
  const Case cases[] = {
      {R"({"type": "array", "uniqueItems": true})", absl::StatusCode::kUnimplemented,
       "keyword 'uniqueItems' with type array (at #) is not supported"},
      {R"({"type": "object", "properties": {"n": {"type": "integer", "multipleOf": 2}}})",
       absl::StatusCode::kUnimplemented,
       "keyword 'multipleOf' with type integer (at #/properties/n)"},
      {R"({"type": "number", "minimum": 0})", absl::StatusCode::kUnimplemented,
       "'minimum' on type number"},
      {R"({"type": "string", "format": "email"})", absl::StatusCode::kUnimplemented,
       "format 'email'"},
      {R"({"not": {"type": "string"}})", absl::StatusCode::kUnimplemented, "keyword 'not'"},
      {R"({"type": "object", "patternProperties": {"^a": {}}})", absl::StatusCode::kUnimplemented,
       "keyword 'patternProperties'"},
      {R"j({"type": "string", "pattern": "^(?=a)"})j", absl::StatusCode::kUnimplemented,
       "lookahead"},
      {R"({"type": "string", "pattern": "(a)\\1"})", absl::StatusCode::kUnimplemented,
       "backreference"},
      {R"({"type": "string", "pattern": "(a*)*"})", absl::StatusCode::kUnimplemented,
       "unbounded repetition"},
      {R"({"type": "string", "pattern": "a^b"})", absl::StatusCode::kUnimplemented, "anchor"},
      {R"({"type": "string", "pattern": "(ab"})", absl::StatusCode::kInvalidArgument,
       "missing ')'"},
      {R"({"$ref": "http://example.com/schema"})", absl::StatusCode::kUnimplemented,
       "only references into this schema"},
      {R"({"$ref": "#/$defs/missing"})", absl::StatusCode::kInvalidArgument, "does not resolve"},
      {R"({"allOf": [{"type": "string"}, {"maxLength": 3}]})", absl::StatusCode::kUnimplemented,
       "'allOf' with other than exactly one schema"},
      {R"({"type": "string", "minimum": 3})", absl::StatusCode::kUnimplemented,
       "keyword 'minimum' with type string"},
      {R"({"type": "strin"})", absl::StatusCode::kInvalidArgument, "unknown type 'strin'"},
      {R"({"type": "string", "maxLength": 20000})", absl::StatusCode::kUnimplemented,
       "'maxLength' above 10000"},
      {R"(false)", absl::StatusCode::kInvalidArgument, "no value can match"},
      {R"({"anyOf": [{"type": "string"}], "type": "string"})", absl::StatusCode::kUnimplemented,
       "keyword 'type' beside 'anyOf'"},
  };
  for (const Case& c : cases) {
    const absl::Status s = SchemaError(c.schema);
    INFO(c.schema << " -> " << s.ToString());
    CHECK(s.code() == c.code);
    CHECK(std::string(s.message()).find(c.names) != std::string::npos);
  }
  CHECK(JsonSchemaTextToGbnf("{not json").status().code() == absl::StatusCode::kInvalidArgument);
}

TEST_CASE("json_object: any object, nothing else", "[json_schema]") {
  Accepts a(JsonObjectGbnf());
  CHECK_ACCEPTS(a, R"({})");
  CHECK_ACCEPTS(a, R"({"a": {"b": [1, 2.5, "x", null, true]}, "c": "d"})");
  CHECK_REFUSES(a, "[1]");
  CHECK_REFUSES(a, R"("text")");
  CHECK_REFUSES(a, R"({"a": 1)");
  CHECK_REFUSES(a, R"({a: 1})");
}

const char kTools[] = R"([
  {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
    "properties": {"city": {"type": "string", "maxLength": 20},
                   "unit": {"enum": ["c", "f"]}}, "required": ["city", "unit"]}}},
  {"type": "function", "function": {"name": "add", "strict": true, "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
    "required": ["a", "b"], "additionalProperties": false}}},
  {"type": "function", "function": {"name": "now"}}
])";

TEST_CASE("tool calls: exactly a known function with its own arguments", "[json_schema]") {
  const Json tools = Json::parse(kTools);
  ToolCallGrammarOptions options;
  absl::StatusOr<std::string> gbnf = ToolCallGbnf(tools, options);
  REQUIRE(gbnf.ok());
  Accepts a(*gbnf);
  CHECK_ACCEPTS(a, R"({"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}})");
  CHECK_ACCEPTS(a, R"({"name": "add", "arguments": {"a": 1, "b": -2}})");
  CHECK_ACCEPTS(a, R"({"name": "now", "arguments": {}})");
  CHECK_REFUSES(a, R"({"name": "add", "arguments": {"city": "Paris", "unit": "c"}})");
  CHECK_REFUSES(a, R"({"name": "get_weather", "arguments": {"a": 1, "b": 2}})");
  CHECK_REFUSES(a, R"({"name": "delete_all", "arguments": {}})");
  CHECK_REFUSES(a, R"({"arguments": {}, "name": "now"})");

  options.prefix = "<tool_call>\n";
  options.suffix = "\n</tool_call>";
  options.only = {"add"};
  options.arguments_key = "parameters";
  options.parallel = true;
  gbnf = ToolCallGbnf(tools, options);
  REQUIRE(gbnf.ok());
  Accepts wrapped(*gbnf);
  const std::string call =
      "<tool_call>\n{\"name\": \"add\", \"parameters\": {\"a\": 1, \"b\": 2}}"
      "\n</tool_call>";
  CHECK_ACCEPTS(wrapped, call);
  CHECK_ACCEPTS(wrapped, call + "\n" + call);
  CHECK_REFUSES(wrapped, "{\"name\": \"add\", \"parameters\": {\"a\": 1, \"b\": 2}}");
  CHECK_REFUSES(wrapped, "<tool_call>\n{\"name\": \"now\", \"parameters\": {}}\n</tool_call>");

  options.only = {"missing"};
  CHECK(ToolCallGbnf(tools, options).status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(ToolCallGbnf(Json::array(), {}).status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(ToolCallGbnf(Json::parse(R"([{"type": "retrieval"}])"), {}).status().code() ==
        absl::StatusCode::kInvalidArgument);
  // A function's own strict flag applies to it.
  const absl::Status strict = ToolCallGbnf(Json::parse(R"([{"type": "function", "function": {
      "name": "f", "strict": true, "parameters": {"type": "object", "properties": {
      "x": {"type": "string"}}}}}])"),
                                           {})
                                  .status();
  CHECK(strict.code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(strict.message()).find("tools[0].function.parameters#") != std::string::npos);
}

// Greedy decoding of stories260K with the grammar's mask; returns the text. The grammar must
// end the output: an end token is sampled only once the text is complete.
std::string ConstrainedGreedy(const std::string& gbnf, const std::string& prompt) {
  const std::string path = testing::TestModelPath("stories260K.gguf");
  const LlamaModel& model = testing::CachedModel(path);
  const Tokenizer& tok = model.tokenizer();
  static const std::shared_ptr<const TokenTrie> trie = TokenTrie::FromTokenizer(tok);
  GrammarMatcher m(CompileGbnf(gbnf), trie);
  ThreadPool pool(1);
  absl::StatusOr<std::unique_ptr<Session>> session = Session::Create(model, &pool);
  REQUIRE(session.ok());
  REQUIRE((*session)->Eval(tok.Encode(prompt, true)).ok());
  const int32_t n_vocab = tok.vocab_size();
  std::vector<float> logits(n_vocab);
  std::string text;
  for (int i = 0; i < 400; ++i) {
    std::copy_n((*session)->logits(), n_vocab, logits.data());
    m.ApplyMask(logits.data());
    const int32_t id =
        static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    REQUIRE(std::isfinite(logits[id]));  // the mask never leaves nothing
    if (tok.IsEndOfGeneration(id)) {
      REQUIRE(m.IsComplete());
      REQUIRE(m.AcceptToken(id));
      return text;
    }
    REQUIRE(m.AcceptToken(id));
    text += tok.TokenToPiece(id);
    REQUIRE((*session)->Eval({&id, 1}).ok());
  }
  FAIL("the grammar did not end generation within 400 tokens; text so far: " << text);
  return text;
}

TEST_CASE("stories260K under a JSON schema writes JSON that satisfies it", "[json_schema][e2e]") {
  if (!std::filesystem::exists(testing::TestModelPath("stories260K.gguf"))) {
    THERMOCLINE_SKIP("stories260K.gguf not found");
  }
  const std::string schema = R"({"type": "object", "properties": {
      "name": {"type": "string", "maxLength": 12},
      "age": {"type": "integer", "minimum": 1, "maximum": 99},
      "pet": {"enum": ["cat", "dog", "bird"]},
      "friends": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 2},
      "happy": {"type": "boolean"}},
      "required": ["name", "age", "pet", "friends", "happy"], "additionalProperties": false})";
  const std::string text = ConstrainedGreedy(SchemaGbnf(schema, {.strict = true}),
                                             "Once upon a time, there was a girl named Lily.");
  INFO(text);
  const Json out = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  REQUIRE(out.is_object());
  CHECK(out.size() == 5);
  REQUIRE(out.contains("name"));
  REQUIRE(out["name"].is_string());
  const std::string name = out["name"].get<std::string>();
  CHECK(std::count_if(name.begin(), name.end(), [](char c) { return (c & 0xC0) != 0x80; }) <=
        12);  // characters, not bytes
  REQUIRE(out["age"].is_number_integer());
  CHECK(out["age"].get<int>() >= 1);
  CHECK(out["age"].get<int>() <= 99);
  REQUIRE(out["pet"].is_string());
  const std::string pet = out["pet"].get<std::string>();
  CHECK((pet == "cat" || pet == "dog" || pet == "bird"));
  REQUIRE(out["friends"].is_array());
  CHECK(out["friends"].size() <= 2);
  for (const Json& f : out["friends"]) CHECK(f.is_string());
  CHECK(out["happy"].is_boolean());
}

TEST_CASE("stories260K under a tool-call grammar writes a valid call", "[json_schema][e2e]") {
  if (!std::filesystem::exists(testing::TestModelPath("stories260K.gguf"))) {
    THERMOCLINE_SKIP("stories260K.gguf not found");
  }
  ToolCallGrammarOptions options;
  options.prefix = "<tool_call>";
  options.suffix = "</tool_call>";
  absl::StatusOr<std::string> gbnf = ToolCallGbnf(Json::parse(kTools), options);
  REQUIRE(gbnf.ok());
  const std::string text = ConstrainedGreedy(*gbnf, "Lily asked about the weather.");
  INFO(text);
  REQUIRE(text.rfind("<tool_call>", 0) == 0);
  const std::string suffix = "</tool_call>";
  REQUIRE(text.size() > suffix.size() + 11);
  REQUIRE(text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0);
  const Json call = Json::parse(text.substr(11, text.size() - 11 - suffix.size()), nullptr, false);
  REQUIRE(call.is_object());
  REQUIRE(call["name"].is_string());
  const std::string name = call["name"].get<std::string>();
  const Json& args = call["arguments"];
  REQUIRE(args.is_object());
  if (name == "get_weather") {
    CHECK(args.size() == 2);
    CHECK(args["city"].is_string());
    CHECK((args["unit"] == "c" || args["unit"] == "f"));
  } else if (name == "add") {
    CHECK(args.size() == 2);
    CHECK(args["a"].is_number_integer());
    CHECK(args["b"].is_number_integer());
  } else {
    CHECK(name == "now");
    CHECK(args.empty());
  }
}

}  // namespace
}  // namespace thermocline::server
