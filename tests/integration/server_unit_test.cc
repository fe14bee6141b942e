// Unit tests of the daemon's pure parts: stop strings, chat templates, prompt encoding with
// control tokens, request parsing and validation, config files.
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "daemon_fixture.h"
#include "engine/model/llama_model.h"
#include "model_fixtures.h"
#include "server/chat_template.h"
#include "server/config.h"
#include "server/errors.h"
#include "server/json_text.h"
#include "server/openai_request.h"
#include "server/prompt_encoder.h"
#include "server/stop_matcher.h"
#include "test_util.h"

namespace thermocline::server {
namespace {

using nlohmann::json;

// Feeds `pieces` through a matcher; returns what it emitted and whether it stopped.
std::pair<std::string, bool> RunStops(const std::vector<std::string>& stops,
                                      const std::vector<std::string>& pieces) {
  StopMatcher m;
  m.Reset(&stops);
  std::string out;
  for (const std::string& p : pieces) {
    bool stopped = false;
    out += m.Push(p, &stopped);
    if (stopped) return {out, true};
  }
  out += m.Flush();
  return {out, false};
}

TEST_CASE("stop strings are cut, also across pieces", "[server][stop]") {
  CHECK(RunStops({"END"}, {"abc", "E", "N", "D", "xyz"}) ==
        std::pair<std::string, bool>{"abc", true});
  CHECK(RunStops({"END"}, {"abcEN", "Dxyz"}) == std::pair<std::string, bool>{"abc", true});
  CHECK(RunStops({"END"}, {"abcEN", "x"}) == std::pair<std::string, bool>{"abcENx", false});
  CHECK(RunStops({"END"}, {"abcEN"}) == std::pair<std::string, bool>{"abcEN", false});
  // The earliest of several stops wins; a longer one starting earlier too.
  CHECK(RunStops({"cd", "bcdef"}, {"abcdefg"}) == std::pair<std::string, bool>{"a", true});
  CHECK(RunStops({"\nUser:"}, {"hi\n", "Us", "er: x"}) == std::pair<std::string, bool>{"hi", true});
  // Held-back text is never emitted early: after each push, nothing that could still become a
  // stop string has been returned.
  StopMatcher m;
  const std::vector<std::string> stops = {"xyz"};
  m.Reset(&stops);
  bool stopped = false;
  CHECK(m.Push("ax", &stopped) == "a");
  CHECK(m.Push("y", &stopped) == "");
  CHECK(m.Push("q", &stopped) == "xyq");
  CHECK(!stopped);
  CHECK(m.emitted() == 4);
  // No stops: text passes straight through.
  CHECK(RunStops({}, {"a", "b"}) == std::pair<std::string, bool>{"ab", false});
  CHECK(RunStops({""}, {"a", "b"}) == std::pair<std::string, bool>{"ab", false});
}

TEST_CASE("chat template families render by name", "[server][chat]") {
  const ChatSpecialTexts s{"<s>", "</s>"};
  const std::vector<ChatMessage> msgs = {
      {"system", "Be brief."}, {"user", "Hi"}, {"assistant", "Hello"}, {"user", "Bye"}};
  struct Case {
    const char* family;
    const char* rendered;
  };
  const Case cases[] = {
      {"chatml",
       "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
       "<|im_start|>assistant\nHello<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n"
       "<|im_start|>assistant\n"},
      {"llama-3",
       "<s><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
       "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
       "<|start_header_id|>assistant<|end_header_id|>\n\nHello<|eot_id|>"
       "<|start_header_id|>user<|end_header_id|>\n\nBye<|eot_id|>"
       "<|start_header_id|>assistant<|end_header_id|>\n\n"},
      {"llama-2",
       "<s>[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi [/INST] Hello </s><s>[INST] Bye [/INST]"},
      {"mistral", "<s>[INST] Be brief.\n\nHi [/INST]Hello</s>[INST] Bye [/INST]"},
      {"zephyr",
       "<|system|>\nBe brief.</s>\n<|user|>\nHi</s>\n<|assistant|>\nHello</s>\n<|user|>\nBye</s>\n"
       "<|assistant|>\n"},
      {"gemma",
       "<s><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\nHello"
       "<end_of_turn>\n<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n"},
      {"phi-3",
       "<|system|>\nBe brief.<|end|>\n<|user|>\nHi<|end|>\n<|assistant|>\nHello<|end|>\n"
       "<|user|>\nBye<|end|>\n<|assistant|>\n"},
      {"fallback", "Be brief.\n\nUser: Hi\nAssistant: Hello\nUser: Bye\nAssistant:"},
  };
  for (const Case& c : cases) {
    INFO(c.family);
    auto named = ChatTemplate::Create(c.family, "", s);
    REQUIRE(named.ok());
    CHECK(named->name() == c.family);
    CHECK(!named->is_jinja());
    CHECK(named->Render(msgs) == c.rendered);
    // The override wins over the GGUF's own template.
    auto over = ChatTemplate::Create(c.family, "{{ 'ignored' }}", s);
    REQUIRE(over.ok());
    CHECK(over->Render(msgs) == c.rendered);
  }
  // No template in the file: the plain fallback.
  auto none = ChatTemplate::Create("", "", s);
  REQUIRE(none.ok());
  CHECK(none->is_fallback());
  CHECK(none->Render(msgs) == "Be brief.\n\nUser: Hi\nAssistant: Hello\nUser: Bye\nAssistant:");
  CHECK(none->implied_stops() == std::vector<std::string>{"\nUser:"});
  CHECK(ChatTemplate::Create("chatml", "", s)->end_of_turn() == "<|im_end|>");
  auto bad = ChatTemplate::Create("nope", "", s);
  REQUIRE(!bad.ok());
  CHECK(std::string(bad.status().message()).find("chatml") != std::string::npos);
}

TEST_CASE("control tokens written as text become their ids", "[server][prompt]") {
  REQUIRE_STORIES_MODEL();
  const std::string path = testing::StoriesModel();
  const LlamaModel& model = testing::CachedModel(path);
  const Tokenizer& tok = model.tokenizer();
  PromptEncoder enc(tok);
  const std::vector<int32_t> plain = tok.Encode("Once upon a time", true);
  CHECK(enc.Encode("Once upon a time", true) == plain);
  // A leading BOS text is not doubled; an inner one is the BOS id.
  CHECK(enc.Encode("<s>Once upon a time", true) == plain);
  std::vector<int32_t> two = enc.Encode("Once</s><s>Once", true);
  REQUIRE(two.size() >= 4);
  CHECK(std::count(two.begin(), two.end(), tok.bos_id()) == 2);
  CHECK(std::count(two.begin(), two.end(), tok.eos_id()) == 1);
  CHECK(enc.FindControl("</s>") == tok.eos_id());
  CHECK(enc.FindControl("nope") == -1);
}

absl::Status SpecError(const std::string& body, ApiKind kind, std::string* param = nullptr) {
  auto j = ParseJsonObject(body);
  if (!j.ok()) return j.status();
  auto spec = SpecFromOpenAi(*j, kind);
  if (param != nullptr && !spec.ok()) *param = ToApiError(spec.status()).param;
  return spec.status();
}

TEST_CASE("OpenAI request bodies are parsed and checked", "[server][request]") {
  auto j = ParseJsonObject(R"({"model":"m","messages":[{"role":"developer","content":"s"},
      {"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]},
      {"role":"assistant","content":null}],
      "max_completion_tokens":7,"max_tokens":3,"temperature":0,"stop":"x","seed":18446744073709551615,
      "stream":true,"stream_options":{"include_usage":true},"logprobs":true,"top_logprobs":2,
      "user":"ignored","some_unknown_field":{"a":[1,2]},"logit_bias":{"5":-100}})");
  REQUIRE(j.ok());
  auto spec = SpecFromOpenAi(*j, ApiKind::kChat);
  REQUIRE(spec.ok());
  REQUIRE(spec->messages.size() == 3);
  CHECK(spec->messages[0].role == "system");
  CHECK(spec->messages[1].content == "ab");
  CHECK(spec->max_tokens == 7);
  CHECK(spec->stop == std::vector<std::string>{"x"});
  CHECK(static_cast<uint64_t>(*spec->seed) == 18446744073709551615ull);
  CHECK(spec->stream);
  CHECK(spec->include_usage);
  CHECK(spec->logprobs);
  CHECK(spec->top_logprobs == 2);
  CHECK(spec->logit_bias == std::vector<std::pair<int64_t, double>>{{5, -100.0}});

  auto c = SpecFromOpenAi(*ParseJsonObject(R"({"model":"m","prompt":[[1,2,3]],"logprobs":3})"),
                          ApiKind::kCompletion);
  REQUIRE(c.ok());
  CHECK(*c->prompt_ids == std::vector<int64_t>{1, 2, 3});
  CHECK(c->logprobs);
  CHECK(c->top_logprobs == 3);

  std::string param;
  CHECK(SpecError("{", ApiKind::kChat).code() == absl::StatusCode::kInvalidArgument);
  CHECK(ToApiError(SpecError("[1]", ApiKind::kChat)).code == "invalid_json");
  CHECK(ToApiError(SpecError(std::string(100, '[') + std::string(100, ']'), ApiKind::kChat)).code ==
        "invalid_json");
  CHECK(ToApiError(SpecError(R"({"messages":[]})", ApiKind::kChat, &param)).code ==
        "missing_required_parameter");
  CHECK(param == "model");
  CHECK(ToApiError(SpecError(R"({"model":"m","messages":[{"role":"user","content":"a"}],
      "temperature":"hot"})",
                             ApiKind::kChat, &param))
            .code == "invalid_type");
  CHECK(param == "temperature");
  CHECK(ToApiError(SpecError(R"({"model":"m","messages":[{"role":"robot","content":"a"}]})",
                             ApiKind::kChat, &param))
            .param == "messages[0].role");
  CHECK(ToApiError(
            SpecError(
                R"({"model":"m","messages":[{"role":"user","content":[{"type":"image_url"}]}]})",
                ApiKind::kChat))
            .code == "unsupported_value");
  CHECK(ToApiError(SpecError(R"({"model":"m","prompt":["a","b"]})", ApiKind::kCompletion)).code ==
        "unsupported_value");
  CHECK(ToApiError(
            SpecError(R"({"model":"m","prompt":"a","stop":[1]})", ApiKind::kCompletion, &param))
            .param == "stop");
  CHECK(SpecError(R"({"model":"m","prompt":"a","n":2})", ApiKind::kCompletion)
            .ok());  // checked later
}

TEST_CASE("error statuses map to OpenAI error bodies", "[server][errors]") {
  const ApiError e = ToApiError(InvalidRequest("temperature", "invalid_value", "too hot"));
  CHECK(e.http_status == 400);
  const json body = json::parse(ApiErrorJson(e));
  CHECK(body["error"]["message"] == "too hot");
  CHECK(body["error"]["type"] == "invalid_request_error");
  CHECK(body["error"]["code"] == "invalid_value");
  CHECK(body["error"]["param"] == "temperature");
  CHECK(ToApiError(ContextExceeded("x")).type == "exceed_context_size_error");
  CHECK(ToApiError(ContextExceeded("x")).http_status == 400);
  CHECK(ToApiError(NotFound("model_not_found", "x")).http_status == 404);
  CHECK(ToApiError(Unauthenticated("x")).http_status == 401);
  CHECK(ToApiError(Unavailable("queue_full", "x")).http_status == 503);
  CHECK(ToApiError(absl::InternalError("x")).http_status == 500);
  CHECK(ToApiError(absl::InternalError("x")).type == "server_error");
  const json nulls = json::parse(ApiErrorJson(ToApiError(absl::InternalError("x"))));
  CHECK(nulls["error"]["param"].is_null());
  CHECK(nulls["error"]["code"].is_null());
}

TEST_CASE("JSON strings written by hand are valid JSON", "[server][json]") {
  const std::string text = std::string("a\"b\\c\n\t\x01\x1f") + "é😀/";
  std::string out;
  AppendJsonString(&out, text);
  CHECK(json::parse(out).get<std::string>() == text);
}

TEST_CASE("config files are read, checked and overridable", "[server][config]") {
  const std::string path = (testing::TempDir() / "unit.toml").string();
  std::ofstream(path) << R"(
[server]
host = "0.0.0.0"
port = 9000
api_key = "k"
[scheduler]
slots = 3
queue = 5
request_timeout_s = 2.5
[sampling]
temperature = 0.5
[log]
level = "warn"
[[models]]
path = "/x/a.gguf"
[[models]]
path = "/x/b.gguf"
name = "bee"
kv_type = "f32"
repack = false
sparse_method = "gate-first"
target_sparsity = 0.4
)";
  ServerConfig c;
  REQUIRE(LoadConfigFile(path, &c).ok());
  REQUIRE(FinalizeConfig(&c).ok());
  CHECK(c.host == "0.0.0.0");
  CHECK(c.port == 9000);
  CHECK(c.api_keys == std::vector<std::string>{"k"});
  CHECK(c.slots == 3);
  CHECK(c.queue == 5);
  CHECK(c.request_timeout_s == 2.5);
  CHECK(c.sampling.temperature == 0.5f);
  CHECK(c.log_level == "warn");
  REQUIRE(c.models.size() == 2);
  CHECK(c.models[0].name == "a");
  CHECK(c.models[1].name == "bee");
  CHECK(c.models[0].kv_type == "f16");  // the default, as llama.cpp's
  CHECK(c.models[1].kv_type == "f32");
  CHECK(c.models[0].repack);  // the default: re-laid rows
  CHECK(!c.models[1].repack);
  CHECK(c.models[0].sparse_method == "predicted");  // the default: the predictors decide
  CHECK(c.models[0].target_sparsity == 0);
  CHECK(c.models[1].sparse_method == "gate-first");
  CHECK(c.models[1].target_sparsity == 0.4);
  CHECK(c.threads_per_slot >= 1);

  std::ofstream(path) << "[server]\nprot = 1\n";
  ServerConfig bad;
  absl::Status s = LoadConfigFile(path, &bad);
  CHECK(!s.ok());
  CHECK(std::string(s.message()).find("server.prot") != std::string::npos);
  std::ofstream(path) << "[scheduler]\nslots = 0\n[[models]]\npath = \"m\"\n";
  ServerConfig zero;
  REQUIRE(LoadConfigFile(path, &zero).ok());
  CHECK(!FinalizeConfig(&zero).ok());
  std::ofstream(path) << "[[models]]\npath = \"m\"\nkv_type = \"q8\"\n";
  ServerConfig kv;
  REQUIRE(LoadConfigFile(path, &kv).ok());
  s = FinalizeConfig(&kv);
  CHECK(!s.ok());
  CHECK(std::string(s.message()).find("models.kv_type") != std::string::npos);
  CHECK(std::string(s.message()).find("'q8'") != std::string::npos);
  for (const char* line :
       {"sparse_method = \"sideways\"", "target_sparsity = 1.0", "target_sparsity = -0.1"}) {
    std::ofstream(path) << "[[models]]\npath = \"m\"\n" << line << "\n";
    ServerConfig m;
    REQUIRE(LoadConfigFile(path, &m).ok());
    s = FinalizeConfig(&m);
    INFO(line);
    CHECK(!s.ok());
    const std::string key = std::string(line).substr(0, std::string(line).find(' '));
    CHECK(std::string(s.message()).find("models." + key) != std::string::npos);
  }
  // TOML writes nan and inf, which pass a check written as `x < lo || x > hi`, and a deadline
  // of inf seconds has no clock value.
  for (const auto& [table, line] :
       std::vector<std::pair<std::string, std::string>>{{"models", "target_sparsity = nan"},
                                                        {"scheduler", "request_timeout_s = inf"},
                                                        {"scheduler", "request_timeout_s = nan"},
                                                        {"registry", "solve_time_limit_s = inf"},
                                                        {"registry", "target_ppl_increase = nan"},
                                                        {"sampling", "temperature = nan"}}) {
    const bool models = table == "models";
    std::ofstream(path) << (models ? "" : "[" + table + "]\n" + line + "\n")
                        << "[[models]]\npath = \"m\"\n"
                        << (models ? line + "\n" : "");
    ServerConfig m;
    INFO(table << ": " << line);
    REQUIRE(LoadConfigFile(path, &m).ok());
    s = FinalizeConfig(&m);
    CHECK(!s.ok());
    const std::string key = line.substr(0, line.find(' '));
    CHECK(std::string(s.message()).find(key) != std::string::npos);
  }
  // Every method's name is taken; a wrong one is told them all.
  for (const char* method : {"auto", "predicted", "gate-first", "input-sparse"}) {
    std::ofstream(path) << "[[models]]\npath = \"m\"\nsparse_method = \"" << method << "\"\n";
    ServerConfig m;
    REQUIRE(LoadConfigFile(path, &m).ok());
    INFO(method);
    CHECK(FinalizeConfig(&m).ok());
  }
  std::ofstream(path) << "[[models]]\npath = \"m\"\nsparse_method = \"sideways\"\n";
  ServerConfig sideways;
  REQUIRE(LoadConfigFile(path, &sideways).ok());
  CHECK(std::string(FinalizeConfig(&sideways).message())
            .find("use auto, predicted, gate-first or input-sparse") != std::string::npos);
  CHECK(ParseModelFlag("/a/b.gguf=name").name == "name");
  CHECK(ParseModelFlag("/a/b.gguf").path == "/a/b.gguf");
}

}  // namespace
}  // namespace thermocline::server

namespace thermocline::server {
namespace {

TEST_CASE("the example config documents valid keys only", "[server][config]") {
  ServerConfig c;
  const std::string path = std::string(THERMOCLINE_SOURCE_DIR) + "/configs/thermocline.toml";
  absl::Status s = LoadConfigFile(path, &c);
  INFO(s.ToString());
  REQUIRE(s.ok());
  REQUIRE(FinalizeConfig(&c).ok());
  CHECK(c.host == "127.0.0.1");
  CHECK(c.slots == 1);
  REQUIRE(c.models.size() == 1);
  CHECK(c.models[0].name == "stories260K");
}

}  // namespace
}  // namespace thermocline::server
