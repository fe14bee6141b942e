// ChatTemplate with a Jinja template: what it hands a template (messages with tool calls,
// tools, variables, special tokens), the fallbacks it tries, the turn-ending tokens it
// finds, the errors at load and at render; and the OpenAI request fields that feed it.
#include "server/chat_template.h"

#include <catch2/catch.hpp>
#include <fstream>
#include <sstream>

#include "server/openai_request.h"

namespace thermocline::server {
namespace {

using ojson = nlohmann::ordered_json;

const ChatSpecialTexts kSpecials{"<s>", "</s>"};

ChatMessage Msg(std::string role, std::string content) {
  ChatMessage m;
  m.role = std::move(role);
  m.content = std::move(content);
  return m;
}

ChatTemplate Make(std::string_view source, std::string_view tool_use = "") {
  auto t = ChatTemplate::Create("", source, kSpecials, tool_use);
  INFO(source);
  INFO(t.status().ToString());
  REQUIRE(t.ok());
  return *std::move(t);
}

std::string RenderOk(const ChatTemplate& t, const std::vector<ChatMessage>& messages,
                     const ChatRenderOptions& options = ChatRenderOptions()) {
  auto r = t.Render(messages, options);
  INFO(r.status().ToString());
  REQUIRE(r.ok());
  return *r;
}

std::string ReadCorpus(const std::string& name) {
  std::ifstream in(std::string(THERMOCLINE_SOURCE_DIR) + "/tests/data/chat_templates/" + name,
                   std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

ChatMessage ToolCallTurn() {
  ChatMessage m;
  m.role = "assistant";
  m.content_is_null = true;
  m.tool_calls.push_back({"c1", "function", "f", R"({"x": 1, "a": [true]})"});
  return m;
}

}  // namespace

TEST_CASE("a GGUF template is rendered by the Jinja engine", "[server][chat]") {
  ChatTemplate t = Make(
      "{{ bos_token }}{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
      "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}");
  CHECK(t.name() == "jinja");
  CHECK(t.is_jinja());
  CHECK(!t.is_fallback());
  CHECK(t.end_of_turn() == "<|im_end|>");
  CHECK(t.implied_stops().empty());
  const std::vector<ChatMessage> msgs = {Msg("system", "Be brief."), Msg("user", "Hi")};
  const std::string expected =
      "<s><|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
      "<|im_start|>assistant\n";
  CHECK(t.Render(msgs) == expected);
  ChatRenderOptions no_prompt;
  no_prompt.add_generation_prompt = false;
  CHECK(RenderOk(t, msgs, no_prompt) ==
        "<s><|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n");
}

TEST_CASE("the tokens that close a turn are found in the template", "[server][chat]") {
  CHECK(Make(ReadCorpus("meta-llama-Llama-3.1-8B-Instruct.jinja")).end_of_turn_texts() ==
        std::vector<std::string>{"<|eot_id|>", "<|eom_id|>"});
  CHECK(Make(ReadCorpus("google-gemma-2-9b-it.jinja")).end_of_turn() == "<end_of_turn>");
  CHECK(Make(ReadCorpus("microsoft-Phi-3-mini-4k-instruct.jinja")).end_of_turn() == "<|end|>");
  CHECK(Make(ReadCorpus("CohereForAI-c4ai-command-r-v01.jinja")).end_of_turn() ==
        "<|END_OF_TURN_TOKEN|>");
  // Mistral ends turns with EOS.
  CHECK(Make(ReadCorpus("mistralai-Mistral-7B-Instruct-v0.3.jinja")).end_of_turn_texts().empty());
}

TEST_CASE("messages reach the template as HF passes them", "[server][chat]") {
  ChatTemplate t = Make("{{ messages | tojson }}");
  ChatMessage result = Msg("tool", "r");
  result.tool_call_id = "c1";
  ChatMessage named = Msg("user", "hi");
  named.name = "alice";
  CHECK(RenderOk(t, {named, ToolCallTurn(), result}) ==
        R"([{"role": "user", "content": "hi", "name": "alice"}, )"
        R"({"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function", )"
        R"("function": {"name": "f", "arguments": {"x": 1, "a": [true]}}}]}, )"
        R"({"role": "tool", "content": "r", "tool_call_id": "c1"}])");
}

TEST_CASE("templates that need text arguments or text content get them", "[server][chat]") {
  // Concatenating the arguments needs their JSON text ...
  ChatTemplate concat = Make(
      "{% for m in messages %}{% for c in m.tool_calls or [] %}{{ c.function.name + ':' + "
      "c.function.arguments }}{% endfor %}{% endfor %}");
  CHECK(RenderOk(concat, {Msg("user", "q"), ToolCallTurn()}) == R"(f:{"x": 1, "a": [true]})");
  // ... and concatenating the content of a tool-call turn needs "" rather than None.
  ChatTemplate content =
      Make("{% for m in messages %}[{{ m.role + ':' + m.content }}]{% endfor %}");
  CHECK(RenderOk(content, {Msg("user", "q"), ToolCallTurn()}) == "[user:q][assistant:]");
  // Templates that cope with None keep it.
  ChatTemplate is_none = Make("{% for m in messages %}{{ m.content is none }}{% endfor %}");
  CHECK(RenderOk(is_none, {Msg("user", "q"), ToolCallTurn()}) == "FalseTrue");
}

TEST_CASE("content parts go to templates that read them, joined text to others", "[server][chat]") {
  ChatMessage m = Msg("user", "ab");
  m.content_parts = {"a", "b"};
  ChatTemplate parts = Make(
      "{% for m in messages %}{% if m.content is string %}{{ m.content }}{% else %}"
      "{% for p in m.content %}[{{ p.text }}]{% endfor %}{% endif %}{% endfor %}");
  CHECK(RenderOk(parts, {m}) == "[a][b]");
  ChatTemplate plain = Make("{% for m in messages %}{{ m.content }}{% endfor %}");
  CHECK(RenderOk(plain, {m}) == "ab");
}

TEST_CASE("tools, variables and special tokens reach the template", "[server][chat]") {
  ChatTemplate t = Make(
      "{{ tools | tojson }}|{{ enable_thinking }}|{{ bos_token }}{{ eos_token }}|"
      "{{ documents }}|{{ strftime_now('%Y') }}");
  ChatRenderOptions o;
  o.tools =
      ojson::parse(R"([{"type": "function", "function": {"name": "z", "description": "d"}}])");
  o.variables = ojson::parse(R"({"enable_thinking": false})");
  o.now = 1700000000;  // 2023 in every time zone
  CHECK(
      RenderOk(t, {Msg("user", "q")}, o) ==
      R"([{"type": "function", "function": {"name": "z", "description": "d"}}]|False|<s></s>|None|2023)");
  // No tools: None, as HF passes it.
  CHECK(RenderOk(t, {Msg("user", "q")}).substr(0, 5) == "null|");
  // A model without a BOS token leaves bos_token undefined.
  auto no_bos =
      ChatTemplate::Create("", "{{ bos_token is defined }}", ChatSpecialTexts{"", "</s>"});
  REQUIRE(no_bos.ok());
  CHECK(no_bos->Render({Msg("user", "q")}) == "False");
  // The server's own variables cannot be overridden.
  o.variables = ojson::parse(R"({"messages": []})");
  auto refused = t.Render({Msg("user", "q")}, o);
  REQUIRE(!refused.ok());
  CHECK(std::string(refused.status().message()).find("'messages'") != std::string::npos);
}

TEST_CASE("a request with tools renders the tool_use template", "[server][chat]") {
  ChatTemplate t = Make("default", "tool use: {{ tools | length }}");
  CHECK(t.Render({Msg("user", "q")}) == "default");
  ChatRenderOptions o;
  o.tools = ojson::parse(R"([{"type": "function", "function": {"name": "f"}}])");
  CHECK(RenderOk(t, {Msg("user", "q")}, o) == "tool use: 1");
}

TEST_CASE("template errors are clear at load and at render", "[server][chat]") {
  auto bad = ChatTemplate::Create("", "ok\n{% for m in messages %}\n{{ m.content }", kSpecials);
  REQUIRE(!bad.ok());
  const std::string message(bad.status().message());
  CHECK(message.find("tokenizer.chat_template cannot be read: line 3") != std::string::npos);
  CHECK(message.find("chatml") != std::string::npos);  // the way out: a built-in format
  auto bad_tool_use = ChatTemplate::Create("", "fine", kSpecials, "{% if %}");
  REQUIRE(!bad_tool_use.ok());
  CHECK(std::string(bad_tool_use.status().message()).find("tokenizer.chat_template.tool_use") !=
        std::string::npos);
  // A template that fails on a plain conversation fails at load.
  auto broken = ChatTemplate::Create("", "{{ messages[0].content.nosuch() }}", kSpecials);
  REQUIRE(!broken.ok());
  CHECK(std::string(broken.status().message()).find("fails on a one-message conversation") !=
        std::string::npos);
  // The template's own refusal of a conversation is the request's error.
  ChatTemplate gemma = Make(ReadCorpus("google-gemma-2-9b-it.jinja"));
  auto refused = gemma.Render({Msg("system", "s"), Msg("user", "q")}, ChatRenderOptions());
  REQUIRE(!refused.ok());
  CHECK(refused.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(refused.status().message()) ==
        "chat template: line 1: System role not supported");
  CHECK(gemma.Render({Msg("system", "s"), Msg("user", "q")}).empty());
}

TEST_CASE("every template of the corpus loads", "[server][chat]") {
  for (const char* name :
       {"meta-llama-Llama-3.1-8B-Instruct.jinja", "meta-llama-Llama-3.2-3B-Instruct.jinja",
        "Qwen-Qwen2.5-7B-Instruct.jinja", "Qwen-Qwen3-0.6B.jinja",
        "mistralai-Mistral-7B-Instruct-v0.3.jinja", "google-gemma-2-9b-it.jinja",
        "microsoft-Phi-3-mini-4k-instruct.jinja", "deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja",
        "deepseek-ai-DeepSeek-R1.jinja", "CohereForAI-c4ai-command-r-v01.jinja",
        "NousResearch-Hermes-3-Llama-3.1-70B.jinja", "HuggingFaceTB-SmolLM2-135M-Instruct.jinja"}) {
    INFO(name);
    const std::string text = ReadCorpus(name);
    REQUIRE(!text.empty());
    ChatTemplate t = Make(text);
    CHECK(!t.Render({Msg("user", "Hello")}).empty());
  }
  ChatTemplate hermes = Make(ReadCorpus("NousResearch-Hermes-3-Llama-3.1-70B.jinja"),
                             ReadCorpus("NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja"));
  ChatRenderOptions o;
  o.tools = ojson::parse(
      R"([{"type": "function", "function": {"name": "get_weather", "description": "Weather",
          "parameters": {"type": "object", "properties": {"city": {"type": "string",
          "description": "The city"}}}}}])");
  const std::string prompt = RenderOk(hermes, {Msg("user", "Weather in Oslo?")}, o);
  CHECK(prompt.find("get_weather(city: str) - Weather") != std::string::npos);
}

TEST_CASE("OpenAI chat requests carry tool calls, tools and template variables",
          "[server][chat][request]") {
  const std::string body = R"({"model": "m", "messages": [
      {"role": "user", "content": "q", "name": "alice"},
      {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
        "function": {"name": "f", "arguments": "{\"x\": 1}"}}]},
      {"role": "tool", "tool_call_id": "c1", "content": "r"}],
    "tools": [{"type": "function", "function": {"name": "f", "parameters": {"z": 1, "a": 2}}}],
    "chat_template_kwargs": {"enable_thinking": false}})";
  auto j = ParseJsonObject(body);
  REQUIRE(j.ok());
  auto spec = SpecFromOpenAi(*j, ApiKind::kChat, body);
  REQUIRE(spec.ok());
  REQUIRE(spec->messages.size() == 3);
  CHECK(spec->messages[0].name == "alice");
  CHECK(spec->messages[1].content_is_null);
  REQUIRE(spec->messages[1].tool_calls.size() == 1);
  CHECK(spec->messages[1].tool_calls[0].id == "c1");
  CHECK(spec->messages[1].tool_calls[0].name == "f");
  CHECK(spec->messages[1].tool_calls[0].arguments == R"({"x": 1})");
  CHECK(spec->messages[2].tool_call_id == "c1");
  // Key order as the client wrote it.
  CHECK(spec->tools.dump() ==
        R"([{"type":"function","function":{"name":"f","parameters":{"z":1,"a":2}}}])");
  CHECK(spec->chat_template_kwargs.dump() == R"({"enable_thinking":false})");

  auto error = [](const std::string& b) {
    auto parsed = ParseJsonObject(b);
    REQUIRE(parsed.ok());
    auto s = SpecFromOpenAi(*parsed, ApiKind::kChat, b);
    REQUIRE(!s.ok());
    return std::string(s.status().message());
  };
  CHECK(error(R"({"model":"m","messages":[{"role":"user","content":"q"}],"tools":{}})") ==
        "'tools' must be an array");
  CHECK(error(R"({"model":"m","messages":[{"role":"user","content":"q"}],
                 "tools":[{"type":"retrieval"}]})") ==
        "only tools of type 'function' are supported");
  CHECK(error(R"({"model":"m","messages":[{"role":"assistant","tool_calls":[{"id":"a"}]}]})") ==
        "'messages[0].tool_calls[0].function' is required (an object)");
  CHECK(error(R"({"model":"m","messages":[{"role":"tool","content":"r","tool_call_id":5}]})") ==
        "'messages[0].tool_call_id' must be a string");
  CHECK(error(R"({"model":"m","messages":[{"role":"user","content":"q"}],
                 "chat_template_kwargs":[1]})") == "'chat_template_kwargs' must be an object");
}

}  // namespace thermocline::server
