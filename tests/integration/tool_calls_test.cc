// The tool-call parser of server/tool_calls.h on each family's format: whole text and streamed
// a character at a time give the same content and calls, markers split over pushes are held
// back, text that is not a call stays content, and arguments stream once the name is known.
#include "server/tool_calls.h"

#include "daemon_fixture.h"
#include "nlohmann/json.hpp"

namespace thermocline::server {
namespace {

struct Recorded {
  std::string content;
  std::vector<ParsedToolCall> calls;
  std::vector<std::string> order;  // "content", "start", "args" as they came
  int arguments_events = 0;
};

class Recorder : public ToolCallEvents {
 public:
  explicit Recorder(Recorded* r) : r_(r) {}
  void Content(std::string_view text) override {
    REQUIRE(!text.empty());
    r_->content.append(text);
    r_->order.push_back("content");
  }
  void CallStart(int index, std::string_view id, std::string_view name) override {
    REQUIRE(index == static_cast<int>(r_->calls.size()));
    r_->calls.push_back({std::string(id), std::string(name), ""});
    r_->order.push_back("start");
  }
  void Arguments(int index, std::string_view piece) override {
    REQUIRE(index < static_cast<int>(r_->calls.size()));
    REQUIRE(!piece.empty());
    r_->calls[index].arguments.append(piece);
    r_->order.push_back("args");
    ++r_->arguments_events;
  }

 private:
  Recorded* r_;
};

Recorded Streamed(std::string_view text, ToolCallFormat format, bool parallel = true) {
  Recorded r;
  Recorder rec(&r);
  ToolCallParser parser(format, parallel);
  for (char c : text) parser.Push(std::string_view(&c, 1), rec);
  parser.Finish(rec);
  return r;
}

// Both ways of feeding the parser agree; returns the whole-text result.
ParsedOutput Parse(std::string_view text, ToolCallFormat format, bool parallel = true) {
  const ParsedOutput whole = ParseToolCalls(text, format, parallel);
  const Recorded streamed = Streamed(text, format, parallel);
  CHECK(streamed.content == whole.content);
  REQUIRE(streamed.calls.size() == whole.calls.size());
  for (size_t i = 0; i < whole.calls.size(); ++i) {
    CHECK(streamed.calls[i].name == whole.calls[i].name);
    CHECK(streamed.calls[i].arguments == whole.calls[i].arguments);
  }
  return whole;
}

nlohmann::json Args(const ParsedToolCall& c) {
  INFO(c.arguments);
  auto j = nlohmann::json::parse(c.arguments, nullptr, false);
  REQUIRE(!j.is_discarded());
  return j;
}

TEST_CASE("hermes tool calls: content, then calls in tags", "[tool_calls]") {
  const ParsedOutput out = Parse(
      "Let me look.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": "
      "\"Paris\", \"days\": [1, 2]}}\n</tool_call>\n<tool_call>\n{\"name\": \"get_time\", "
      "\"arguments\": {}}\n</tool_call>",
      ToolCallFormat::kHermes);
  CHECK(out.content == "Let me look.");
  REQUIRE(out.calls.size() == 2);
  CHECK(out.calls[0].name == "get_weather");
  CHECK(Args(out.calls[0]) == nlohmann::json{{"city", "Paris"}, {"days", {1, 2}}});
  CHECK(out.calls[0].arguments == "{\"city\": \"Paris\", \"days\": [1, 2]}");
  CHECK(out.calls[1].name == "get_time");
  CHECK(out.calls[1].arguments == "{}");
  CHECK(out.calls[0].id.rfind("call_", 0) == 0);
  CHECK(out.calls[0].id.size() == 29);
  CHECK(out.calls[0].id != out.calls[1].id);

  // parallel false: the first call only.
  const ParsedOutput one = Parse(
      "<tool_call>{\"name\": \"a\", \"arguments\": {\"x\": 1}}</tool_call>\n<tool_call>{\"name\": "
      "\"b\", \"arguments\": {}}</tool_call>",
      ToolCallFormat::kHermes, /*parallel=*/false);
  CHECK(one.content.empty());
  REQUIRE(one.calls.size() == 1);
  CHECK(one.calls[0].name == "a");
}

TEST_CASE("tool call parser: what is not a call stays content", "[tool_calls]") {
  CHECK(Parse("Once upon a time", ToolCallFormat::kHermes).content == "Once upon a time");
  CHECK(Parse("a <tool_call>oops</tool_call>", ToolCallFormat::kHermes).content ==
        "a <tool_call>oops</tool_call>");
  CHECK(Parse("x <tool_call>{\"arguments\": {}}", ToolCallFormat::kHermes).content ==
        "x <tool_call>{\"arguments\": {}}");
  CHECK(Parse("<tool", ToolCallFormat::kHermes).content == "<tool");
  CHECK(Parse("I said {\"name\": 1}", ToolCallFormat::kLlama3).content == "I said {\"name\": 1}");
  CHECK(Parse("[1, 2]", ToolCallFormat::kMistral).content == "[1, 2]");
  CHECK(Parse("  two spaces  ", ToolCallFormat::kHermes).content == "  two spaces  ");
  for (auto f : {ToolCallFormat::kHermes, ToolCallFormat::kLlama3, ToolCallFormat::kMistral}) {
    CHECK(Parse("plain text, no calls", f).calls.empty());
  }
}

TEST_CASE("tool call parser: a marker split over pushes is held back, then released",
          "[tool_calls]") {
  Recorded r;
  Recorder rec(&r);
  ToolCallParser parser(ToolCallFormat::kHermes, true);
  parser.Push("Hello <tool", rec);
  CHECK(r.content == "Hello");
  parser.Push("box> world", rec);
  CHECK(r.content == "Hello <toolbox> world");
  parser.Finish(rec);
  CHECK(r.calls.empty());
}

TEST_CASE("tool call parser: arguments stream in pieces after the name", "[tool_calls]") {
  const std::string text =
      "<tool_call>\n{\"name\": \"search\", \"arguments\": {\"query\": \"a long query text\", "
      "\"limit\": 10}}\n</tool_call>";
  const Recorded r = Streamed(text, ToolCallFormat::kHermes);
  REQUIRE(r.calls.size() == 1);
  CHECK(r.calls[0].arguments == "{\"query\": \"a long query text\", \"limit\": 10}");
  CHECK(r.arguments_events > 10);
  REQUIRE(!r.order.empty());
  CHECK(r.order.front() == "start");
  CHECK(r.content.empty());
}

TEST_CASE("tool call parser: arguments before the name, and arguments as a string",
          "[tool_calls]") {
  const ParsedOutput before =
      Parse("<tool_call>{\"arguments\": {\"a\": [1, {\"b\": \"}\"}]}, \"name\": \"f\"}</tool_call>",
            ToolCallFormat::kHermes);
  REQUIRE(before.calls.size() == 1);
  CHECK(before.calls[0].name == "f");
  CHECK(Args(before.calls[0]) == nlohmann::json::parse(R"({"a": [1, {"b": "}"}]})"));
  const ParsedOutput str =
      Parse(R"(<tool_call>{"name": "f", "arguments": "{\"a\": 1}"}</tool_call>)",
            ToolCallFormat::kHermes);
  REQUIRE(str.calls.size() == 1);
  CHECK(str.calls[0].arguments == R"({"a": 1})");
}

TEST_CASE("llama 3 tool calls: a JSON object as the whole message", "[tool_calls]") {
  const ParsedOutput out =
      Parse(" {\"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\"}}",
            ToolCallFormat::kLlama3);
  CHECK(out.content.empty());
  REQUIRE(out.calls.size() == 1);
  CHECK(out.calls[0].name == "get_weather");
  CHECK(Args(out.calls[0]) == nlohmann::json{{"city", "Oslo"}});
  const ParsedOutput tagged =
      Parse("<|python_tag|>{\"name\": \"f\", \"parameters\": {}}", ToolCallFormat::kLlama3);
  REQUIRE(tagged.calls.size() == 1);
  CHECK(tagged.calls[0].name == "f");
}

TEST_CASE("mistral tool calls: a list after [TOOL_CALLS], or the list alone", "[tool_calls]") {
  const ParsedOutput out = Parse(
      "[TOOL_CALLS] [{\"name\": \"a\", \"arguments\": {\"x\": 1}}, {\"name\": \"b\", "
      "\"arguments\": {\"y\": \"z\"}}]",
      ToolCallFormat::kMistral);
  CHECK(out.content.empty());
  REQUIRE(out.calls.size() == 2);
  CHECK(out.calls[0].name == "a");
  CHECK(out.calls[1].name == "b");
  CHECK(Args(out.calls[1]) == nlohmann::json{{"y", "z"}});
  // Mistral's templates refuse call ids other than 9 letters or digits.
  CHECK(out.calls[0].id.size() == 9);
  const ParsedOutput bare =
      Parse("[{\"name\": \"a\", \"arguments\": {}}]", ToolCallFormat::kMistral);
  REQUIRE(bare.calls.size() == 1);
  CHECK(bare.calls[0].arguments == "{}");
}

TEST_CASE("an unfinished call keeps its name and the arguments so far", "[tool_calls]") {
  const ParsedOutput cut =
      Parse("<tool_call>{\"name\": \"f\", \"arguments\": {\"a\": 1", ToolCallFormat::kHermes);
  REQUIRE(cut.calls.size() == 1);
  CHECK(cut.calls[0].name == "f");
  CHECK(cut.calls[0].arguments == "{\"a\": 1");
  const ParsedOutput no_name = Parse("<tool_call>{\"name\": \"f", ToolCallFormat::kHermes);
  CHECK(no_name.calls.empty());
  CHECK(no_name.content == "<tool_call>{\"name\": \"f");
}

TEST_CASE("the tool-call format follows the chat template", "[tool_calls]") {
  CHECK(DetectToolCallFormat("{{ '<tool_call>' }}") == ToolCallFormat::kHermes);
  CHECK(DetectToolCallFormat("[AVAILABLE_TOOLS] [TOOL_CALLS]") == ToolCallFormat::kMistral);
  CHECK(DetectToolCallFormat("<|start_header_id|>ipython \"parameters\"") ==
        ToolCallFormat::kLlama3);
  CHECK(DetectToolCallFormat("{{ messages }}") == ToolCallFormat::kHermes);
  CHECK(ToolCallGrammarFor(ToolCallFormat::kLlama3).arguments_key == "parameters");
}

TEST_CASE("templates without tools get them in the prompt", "[tool_calls]") {
  ChatMessage user{"user", "What is the weather?"};
  ChatMessage assistant;
  assistant.role = "assistant";
  assistant.content_is_null = true;
  assistant.tool_calls.push_back({"call_1", "function", "get_weather", "{\"city\":\"Paris\"}"});
  ChatMessage tool{"tool", "sunny"};
  tool.tool_call_id = "call_1";
  const auto tools = nlohmann::ordered_json::parse(
      R"([{"type":"function","function":{"name":"get_weather","parameters":{"type":"object"}}}])");
  const std::vector<ChatMessage> out = WithToolPrompt({user, assistant, tool}, tools);
  // No system message: the tools go before the first user message's text.
  REQUIRE(out.size() == 3);
  CHECK(out[0].role == "user");
  CHECK(out[0].content.find("{\"name\":\"get_weather\"") != std::string::npos);
  CHECK(out[0].content.find("<tool_call>") != std::string::npos);
  CHECK(out[0].content.ends_with("\n\nWhat is the weather?"));
  CHECK(out[1].tool_calls.empty());
  CHECK(out[1].content ==
        "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
        "{\"city\":\"Paris\"}}\n</tool_call>");
  // What the model is told to write is what the parser reads.
  const ParsedOutput parsed = ParseToolCalls(out[1].content, ToolCallFormat::kHermes, true);
  REQUIRE(parsed.calls.size() == 1);
  CHECK(parsed.calls[0].name == "get_weather");
  CHECK(out[2].content == "<tool_response>\nsunny\n</tool_response>");
  // With a system message, the tools go there.
  ChatMessage system{"system", "Be brief."};
  const std::vector<ChatMessage> with_system = WithToolPrompt({system, user}, tools);
  REQUIRE(with_system.size() == 2);
  CHECK(with_system[0].content.rfind("Be brief.\n\nFunctions you can call:", 0) == 0);
  CHECK(with_system[1].content == "What is the weather?");
}

}  // namespace
}  // namespace thermocline::server
