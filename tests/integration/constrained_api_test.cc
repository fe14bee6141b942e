// Constrained output and tools over real HTTP on the story model: response_format json_object
// and json_schema (the output parses and validates against the schema), the grammar field,
// tool_choice required / named / auto / none, a tool-message round trip, streamed tool_calls
// equal to the non-streamed ones, and the 400s of bad grammars, schemas and unsupported fields.
#include "daemon_fixture.h"

namespace thermocline::testing {
namespace {

using nlohmann::json;

// A validator for the schema keywords these tests use (type, properties, required,
// additionalProperties false, enum, minimum/maximum, maxLength, items, minItems/maxItems):
// the empty string when `v` matches, else what is wrong.
std::string Validate(const json& v, const json& s, const std::string& at = "$") {
  if (s.contains("enum")) {
    for (const json& e : s["enum"]) {
      if (e == v) return "";
    }
    return at + ": not in enum";
  }
  const std::string type = s.value("type", "");
  if (type == "object") {
    if (!v.is_object()) return at + ": not an object";
    for (const json& r : s.value("required", json::array())) {
      if (!v.contains(r.get<std::string>())) return at + ": missing " + r.get<std::string>();
    }
    const json props = s.value("properties", json::object());
    for (const auto& [k, val] : v.items()) {
      if (!props.contains(k)) {
        if (s.value("additionalProperties", true) == false) return at + ": extra key " + k;
        continue;
      }
      if (std::string e = Validate(val, props[k], at + "." + k); !e.empty()) return e;
    }
    return "";
  }
  if (type == "array") {
    if (!v.is_array()) return at + ": not an array";
    if (s.contains("minItems") && v.size() < s["minItems"].get<size_t>()) return at + ": short";
    if (s.contains("maxItems") && v.size() > s["maxItems"].get<size_t>()) return at + ": long";
    for (size_t i = 0; i < v.size() && s.contains("items"); ++i) {
      if (std::string e = Validate(v[i], s["items"], at + "[" + std::to_string(i) + "]");
          !e.empty()) {
        return e;
      }
    }
    return "";
  }
  if (type == "string") {
    if (!v.is_string()) return at + ": not a string";
    // maxLength counts code points; the test strings' bytes bound them from above.
    if (s.contains("maxLength") && v.get<std::string>().size() > 4 * s["maxLength"].get<size_t>())
      return at + ": too long";
    return "";
  }
  if (type == "integer") {
    if (!v.is_number_integer()) return at + ": not an integer";
    if (s.contains("minimum") && v.get<int64_t>() < s["minimum"].get<int64_t>())
      return at + ": low";
    if (s.contains("maximum") && v.get<int64_t>() > s["maximum"].get<int64_t>())
      return at + ": high";
    return "";
  }
  if (type == "boolean") return v.is_boolean() ? "" : at + ": not a boolean";
  return type.empty() ? "" : at + ": type " + type + " not checked by this validator";
}

// As text: nlohmann::json sorts keys, and the schema's property order is part of the test.
constexpr char kPersonSchemaText[] = R"({
  "type": "object",
  "properties": {
    "name": {"type": "string", "maxLength": 12},
    "age": {"type": "integer", "minimum": 1, "maximum": 99},
    "mood": {"enum": ["happy", "sad"]},
    "pets": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 2},
    "brave": {"type": "boolean"}
  },
  "required": ["name", "age", "mood", "pets", "brave"],
  "additionalProperties": false
})";
const json kPersonSchema = json::parse(kPersonSchemaText);

// `body` with the string "SCHEMA" replaced by the schema's text.
std::string WithSchema(const json& body) {
  std::string text = body.dump();
  const size_t at = text.find("\"SCHEMA\"");
  REQUIRE(at != std::string::npos);
  return text.replace(at, 8, kPersonSchemaText);
}

json PostText(int port, const std::string& path, const std::string& body) {
  HttpResponse r = Http(port, "POST", path, body);
  INFO(body << " -> " << r.status << " " << r.body);
  REQUIRE(r.status == 200);
  return Json(r.body);
}

const json kTools = json::parse(R"([
  {"type": "function", "function": {"name": "get_weather",
    "parameters": {"type": "object",
      "properties": {"city": {"type": "string", "maxLength": 16},
                     "unit": {"enum": ["celsius", "fahrenheit"]}},
      "required": ["city", "unit"]}}},
  {"type": "function", "function": {"name": "get_time",
    "parameters": {"type": "object",
      "properties": {"zone": {"type": "integer", "minimum": -12, "maximum": 14}},
      "required": ["zone"]}}}
])");
// The story model's context is 512 tokens and a tool's schema costs ~150 of them in the prompt:
// requests that need room to write use one tool.
const json kWeather = json::array({kTools[0]});

json ChatRequest(const std::string& user, int max_tokens = 300) {
  return {{"model", kModelName},
          {"messages", {{{"role", "user"}, {"content", user}}}},
          {"max_tokens", max_tokens},
          {"temperature", 0}};
}

json PostOk(int port, const std::string& path, const json& body) {
  HttpResponse r = Http(port, "POST", path, body.dump());
  INFO(body.dump() << " -> " << r.status << " " << r.body);
  REQUIRE(r.status == 200);
  return Json(r.body);
}

json Error400(int port, const std::string& path, const json& body) {
  HttpResponse r = Http(port, "POST", path, body.dump());
  INFO(body.dump() << " -> " << r.status << " " << r.body);
  REQUIRE(r.status == 400);
  const json e = Json(r.body)["error"];
  CHECK(e["type"] == "invalid_request_error");
  return e;
}

json ContentJson(const json& response) {
  const json& msg = response["choices"][0]["message"];
  REQUIRE(msg["content"].is_string());
  INFO("content: " << msg["content"].get<std::string>());
  return Json(msg["content"].get<std::string>());
}

TEST_CASE("response_format json_schema and json_object give valid JSON", "[server][constrained]") {
  REQUIRE_STORIES_MODEL();
  DaemonProcess d;
  json req = ChatRequest("Tell me about a girl.");
  req["response_format"] = {
      {"type", "json_schema"},
      {"json_schema", {{"name", "person"}, {"schema", "SCHEMA"}, {"strict", true}}}};
  const json c = PostText(d.port(), "/v1/chat/completions", WithSchema(req));
  CHECK(c["choices"][0]["finish_reason"] == "stop");
  const json person = ContentJson(c);
  CHECK(Validate(person, kPersonSchema) == "");
  // Properties in the schema's order.
  const std::string text = c["choices"][0]["message"]["content"];
  CHECK(text.find("\"name\"") < text.find("\"age\""));
  CHECK(text.find("\"pets\"") < text.find("\"brave\""));

  // The same on the completions endpoint, and again (the compiled grammar is cached).
  json comp = {{"model", kModelName},
               {"prompt", "Once upon a time"},
               {"max_tokens", 300},
               {"temperature", 0},
               {"response_format", req["response_format"]}};
  for (int i = 0; i < 2; ++i) {
    const json r = PostText(d.port(), "/v1/completions", WithSchema(comp));
    CHECK(r["choices"][0]["finish_reason"] == "stop");
    CHECK(Validate(Json(r["choices"][0]["text"].get<std::string>()), kPersonSchema) == "");
  }

  json obj = ChatRequest("Once upon a time", 400);
  obj["response_format"] = {{"type", "json_object"}};
  const json o = PostOk(d.port(), "/v1/chat/completions", obj);
  INFO(o.dump());
  const std::string reason = o["choices"][0]["finish_reason"];
  const std::string text_o = o["choices"][0]["message"]["content"];
  REQUIRE(!text_o.empty());
  // An object begins at once; whole when the grammar ended it (a story model may also run
  // out of tokens inside a string).
  CHECK(text_o.find_first_not_of(" \n\t") == text_o.find('{'));
  if (reason == "stop") CHECK(ContentJson(o).is_object());
}

TEST_CASE("the grammar field constrains chat and completions", "[server][constrained]") {
  REQUIRE_STORIES_MODEL();
  DaemonProcess d;
  const std::string gbnf = "root ::= answer \".\"\nanswer ::= \"yes\" | \"no\" | \"maybe\"\n";
  for (double temp : {0.0, 1.0}) {
    json comp = {{"model", kModelName}, {"prompt", "Lily said"},
                 {"max_tokens", 20},    {"temperature", temp},
                 {"seed", 7},           {"grammar", gbnf}};
    const json r = PostOk(d.port(), "/v1/completions", comp);
    const std::string text = r["choices"][0]["text"];
    INFO(text);
    CHECK((text == "yes." || text == "no." || text == "maybe."));
    CHECK(r["choices"][0]["finish_reason"] == "stop");
  }
  json chat = ChatRequest("Hi", 20);
  chat["grammar"] = "root ::= [0-9]{3}";
  const json c = PostOk(d.port(), "/v1/chat/completions", chat);
  const std::string digits = c["choices"][0]["message"]["content"];
  CHECK(digits.size() == 3);
  CHECK(digits.find_first_not_of("0123456789") == std::string::npos);
  // Streamed: the same text.
  chat["stream"] = true;
  HttpResponse s = Http(d.port(), "POST", "/v1/chat/completions", chat.dump());
  REQUIRE(s.status == 200);
  std::string streamed;
  for (const std::string& e : ParseSse(s.body)) {
    if (e == "[DONE]") continue;
    const json j = Json(e);
    if (!j["choices"].empty() && j["choices"][0]["delta"].contains("content")) {
      streamed += j["choices"][0]["delta"]["content"].get<std::string>();
    }
  }
  CHECK(streamed == digits);
}

// The first call of a non-streamed response, checked against the tools' schemas.
json CheckedCall(const json& response, const std::string& name) {
  INFO(response.dump());
  const json& choice = response["choices"][0];
  CHECK(choice["finish_reason"] == "tool_calls");
  const json& msg = choice["message"];
  CHECK(msg["role"] == "assistant");
  CHECK(msg["content"].is_null());
  REQUIRE(msg["tool_calls"].is_array());
  REQUIRE(msg["tool_calls"].size() == 1);
  const json& call = msg["tool_calls"][0];
  CHECK(call["id"].get<std::string>().rfind("call_", 0) == 0);
  CHECK(call["type"] == "function");
  CHECK(call["function"]["name"] == name);
  REQUIRE(call["function"]["arguments"].is_string());
  const json args = Json(call["function"]["arguments"].get<std::string>());
  for (const json& t : kTools) {
    if (t["function"]["name"] == name) CHECK(Validate(args, t["function"]["parameters"]) == "");
  }
  return call;
}

TEST_CASE("tool_choice required and named force a valid call", "[server][constrained]") {
  REQUIRE_STORIES_MODEL();
  DaemonProcess d;
  json req = ChatRequest("What is the weather in Paris?", 128);
  req["tools"] = kTools;
  req["tool_choice"] = "required";
  const json c = PostOk(d.port(), "/v1/chat/completions", req);
  const std::string name = c["choices"][0]["message"]["tool_calls"][0]["function"]["name"];
  CHECK((name == "get_weather" || name == "get_time"));
  CheckedCall(c, name);

  // A named function is the only one shown: the prompt is shorter, the output may be longer
  // (the story model pads with the whitespace JSON allows between tokens).
  req["max_tokens"] = 200;
  for (const char* fn : {"get_weather", "get_time"}) {
    req["tool_choice"] = {{"type", "function"}, {"function", {{"name", fn}}}};
    CheckedCall(PostOk(d.port(), "/v1/chat/completions", req), fn);
  }
}

TEST_CASE("tool_choice none and auto answer with text", "[server][constrained]") {
  REQUIRE_STORIES_MODEL();
  DaemonProcess d;
  const json plain = PostOk(d.port(), "/v1/chat/completions", ChatRequest("Once upon a time", 30));
  json req = ChatRequest("Once upon a time", 30);
  req["tools"] = kTools;
  req["tool_choice"] = "none";
  const json none = PostOk(d.port(), "/v1/chat/completions", req);
  // none: the tools are not shown to the model at all.
  CHECK(none["usage"]["prompt_tokens"] == plain["usage"]["prompt_tokens"]);
  CHECK(none["choices"][0]["message"]["content"] == plain["choices"][0]["message"]["content"]);
  CHECK(!none["choices"][0]["message"].contains("tool_calls"));

  for (const json choice : {json("auto"), json()}) {
    req["tool_choice"] = choice;
    const json a = PostOk(d.port(), "/v1/chat/completions", req);
    INFO(a.dump());
    // The story model's template has no tools: they are described in the prompt.
    CHECK(a["usage"]["prompt_tokens"].get<int>() > plain["usage"]["prompt_tokens"].get<int>() + 50);
    CHECK(a["choices"][0]["message"]["content"].is_string());
    CHECK(!a["choices"][0]["message"].contains("tool_calls"));
    CHECK(a["choices"][0]["finish_reason"] != "tool_calls");
  }
}

TEST_CASE("a tool call and its result go back to the model", "[server][constrained]") {
  REQUIRE_STORIES_MODEL();
  DaemonProcess d;
  json req = ChatRequest("What is the weather in Paris?", 200);
  req["tools"] = kWeather;
  req["tool_choice"] = {{"type", "function"}, {"function", {{"name", "get_weather"}}}};
  const json first = PostOk(d.port(), "/v1/chat/completions", req);
  const json call = CheckedCall(first, "get_weather");

  json turn2 = req;
  turn2["messages"].push_back(first["choices"][0]["message"]);
  turn2["messages"].push_back(
      {{"role", "tool"}, {"tool_call_id", call["id"]}, {"content", "{\"temperature\": 21}"}});
  turn2["tool_choice"] = "none";
  const json second = PostOk(d.port(), "/v1/chat/completions", turn2);
  CHECK(second["choices"][0]["message"]["content"].is_string());
  // The call and its result are in the prompt (as text for this template, which has no tool
  // syntax of its own), also when no tools are offered any more.
  json alone = req;
  alone["tool_choice"] = "none";
  const json baseline = PostOk(d.port(), "/v1/chat/completions", alone);
  CHECK(second["usage"]["prompt_tokens"].get<int>() >
        baseline["usage"]["prompt_tokens"].get<int>() + 30);
  turn2["tool_choice"] = "required";
  turn2["max_tokens"] = 105;
  CheckedCall(PostOk(d.port(), "/v1/chat/completions", turn2), "get_weather");
}

TEST_CASE("streamed tool_calls: id and name first, arguments in pieces", "[server][constrained]") {
  REQUIRE_STORIES_MODEL();
  DaemonProcess d;
  json req = ChatRequest("What is the weather in Paris?", 200);
  req["tools"] = kWeather;
  req["tool_choice"] = {{"type", "function"}, {"function", {{"name", "get_weather"}}}};
  const json whole = PostOk(d.port(), "/v1/chat/completions", req);
  const json call = CheckedCall(whole, "get_weather");

  req["stream"] = true;
  req["stream_options"] = {{"include_usage", true}};
  HttpResponse r = Http(d.port(), "POST", "/v1/chat/completions", req.dump());
  REQUIRE(r.status == 200);
  const std::vector<std::string> events = ParseSse(r.body);
  REQUIRE(events.back() == "[DONE]");
  std::string arguments, finish;
  int starts = 0, pieces = 0;
  for (const std::string& e : events) {
    if (e == "[DONE]") continue;
    const json j = Json(e);
    INFO(e);
    if (j["choices"].empty()) continue;  // usage
    const json& choice = j["choices"][0];
    if (!choice["finish_reason"].is_null()) finish = choice["finish_reason"];
    const json& delta = choice["delta"];
    if (delta.contains("content")) CHECK(delta["content"] == "");  // the role chunk only
    if (!delta.contains("tool_calls")) continue;
    REQUIRE(delta["tool_calls"].size() == 1);
    const json& tc = delta["tool_calls"][0];
    CHECK(tc["index"] == 0);
    if (tc.contains("id")) {
      ++starts;
      CHECK(pieces == 0);
      CHECK(tc["id"].get<std::string>().rfind("call_", 0) == 0);
      CHECK(tc["type"] == "function");
      CHECK(tc["function"]["name"] == "get_weather");
      CHECK(tc["function"]["arguments"] == "");
    } else {
      CHECK(!tc["function"].contains("name"));
      ++pieces;
      arguments += tc["function"]["arguments"].get<std::string>();
    }
  }
  CHECK(starts == 1);
  CHECK(pieces > 1);
  CHECK(arguments == call["function"]["arguments"]);
  CHECK(finish == "tool_calls");
}

TEST_CASE("bad grammars, schemas, tool choices and unsupported fields are 400",
          "[server][constrained]") {
  REQUIRE_STORIES_MODEL();
  DaemonProcess d;
  const int port = d.port();
  json req = ChatRequest("Hi", 8);

  json g = req;
  g["grammar"] = "root ::= \"a\" (";
  json e = Error400(port, "/v1/chat/completions", g);
  CHECK(e["param"] == "grammar");
  CHECK(e["message"].get<std::string>().find("grammar: 1:") == 0);
  g["grammar"] = "root ::= missing";
  e = Error400(port, "/v1/completions",
               {{"model", kModelName}, {"prompt", "a"}, {"grammar", g["grammar"]}});
  CHECK(e["param"] == "grammar");
  CHECK(e["message"].get<std::string>().find("missing") != std::string::npos);
  g["grammar"] = 5;
  CHECK(Error400(port, "/v1/chat/completions", g)["param"] == "grammar");

  json s = req;
  s["response_format"] = {
      {"type", "json_schema"},
      {"json_schema", {{"name", "x"}, {"schema", {{"type", "number"}, {"multipleOf", 3}}}}}};
  e = Error400(port, "/v1/chat/completions", s);
  CHECK(e["param"] == "response_format.json_schema.schema");
  CHECK(e["message"].get<std::string>().find("multipleOf") != std::string::npos);
  s["response_format"]["json_schema"]["strict"] = true;
  s["response_format"]["json_schema"]["schema"] = {{"type", "object"},
                                                   {"properties", {{"a", {{"type", "string"}}}}}};
  e = Error400(port, "/v1/chat/completions", s);
  CHECK(e["param"] == "response_format.json_schema.schema");
  s["response_format"] = {{"type", "json_schema"}};
  CHECK(Error400(port, "/v1/chat/completions", s)["param"] == "response_format.json_schema");
  s["response_format"] = {{"type", "xml"}};
  CHECK(Error400(port, "/v1/chat/completions", s)["param"] == "response_format.type");

  json both = req;
  both["grammar"] = "root ::= \"a\"";
  both["response_format"] = {{"type", "json_object"}};
  e = Error400(port, "/v1/chat/completions", both);
  CHECK(e["message"].get<std::string>().find("both constrain") != std::string::npos);

  json t = req;
  t["tool_choice"] = "required";
  CHECK(Error400(port, "/v1/chat/completions", t)["param"] == "tool_choice");
  t["tools"] = kTools;
  t["tool_choice"] = {{"type", "function"}, {"function", {{"name", "nope"}}}};
  e = Error400(port, "/v1/chat/completions", t);
  CHECK(e["param"] == "tool_choice");
  CHECK(e["message"].get<std::string>().find("nope") != std::string::npos);
  t["tool_choice"] = "sometimes";
  CHECK(Error400(port, "/v1/chat/completions", t)["param"] == "tool_choice");
  t["tool_choice"] = "required";
  t["response_format"] = {{"type", "json_object"}};
  CHECK(Error400(port, "/v1/chat/completions", t)["param"] == "tool_choice");
  json bad_tool = req;
  bad_tool["tools"] = {{{"type", "function"}, {"function", {{"description", "no name"}}}}};
  CHECK(Error400(port, "/v1/chat/completions", bad_tool)["param"] == "tools[0].function.name");
  bad_tool["tools"] = kTools;
  bad_tool["tools"][0]["function"]["parameters"] = {{"type", "object"}, {"not", json::object()}};
  bad_tool["tool_choice"] = "required";
  e = Error400(port, "/v1/chat/completions", bad_tool);
  CHECK(e["param"] == "tools");
  CHECK(e["message"].get<std::string>().find("not") != std::string::npos);

  // Fields the API has and this server does not implement.
  for (const auto& [field, value] : std::vector<std::pair<std::string, json>>{
           {"functions", json::array({{{"name", "f"}}})},
           {"function_call", "auto"},
           {"audio", {{"voice", "alloy"}, {"format", "wav"}}},
           {"modalities", {"text", "audio"}},
           {"prediction", {{"type", "content"}, {"content", "x"}}},
           {"web_search_options", json::object()},
           {"reasoning_effort", "low"},
           {"verbosity", "low"},
           {"store", true},
           {"service_tier", "flex"}}) {
    json b = req;
    b[field] = value;
    INFO(field);
    CHECK(Error400(port, "/v1/chat/completions", b)["param"] == field);
  }
  CHECK(Error400(port, "/v1/completions",
                 {{"model", kModelName}, {"prompt", "a"}, {"suffix", "b"}})["param"] == "suffix");
  CHECK(Error400(port, "/v1/completions",
                 {{"model", kModelName}, {"prompt", "a"}, {"tools", kTools}})["param"] == "tools");
  // What is accepted as it is: store false, the default tier, text modality, identifiers.
  json ok = req;
  ok["store"] = false;
  ok["service_tier"] = "auto";
  ok["modalities"] = {"text"};
  ok["user"] = "u1";
  ok["metadata"] = {{"k", "v"}};
  ok["parallel_tool_calls"] = false;
  PostOk(port, "/v1/chat/completions", ok);
}

}  // namespace
}  // namespace thermocline::testing
