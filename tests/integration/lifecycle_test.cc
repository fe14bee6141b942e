// The daemon's lifecycle: the front end answers while models load (health 503 "loading",
// generation 503 model_loading with Retry-After), several models are served side by side, and
// a model that cannot load stops the daemon with exit code 1.
#include <thread>

#include "daemon_fixture.h"
#include "engine/gguf/gguf.h"
#include "server/http_server.h"
#include "server/metrics.h"
#include "server/model_registry.h"

namespace thermocline::testing {
namespace {

using nlohmann::json;

TEST_CASE("before the models are loaded, health and generation say 503", "[server][lifecycle]") {
  server::ServerConfig config;
  config.port = 0;
  config.access_log = false;
  config.models.push_back(server::ModelConfig{"/nonexistent.gguf", "later"});
  REQUIRE(server::FinalizeConfig(&config).ok());
  server::Metrics metrics;
  server::ModelRegistry registry(config.models);  // not loaded: every model is "loading"
  server::HttpFrontEnd http(config, &registry, &metrics);
  auto port = http.Bind();
  REQUIRE(port.ok());
  std::thread listener([&] { http.Listen(); });
  HttpResponse health = Http(*port, "GET", "/health");
  CHECK(health.status == 503);
  CHECK(health.header("retry-after") == "1");
  CHECK(Json(health.body)["status"] == "loading");
  HttpResponse chat =
      Http(*port, "POST", "/v1/chat/completions",
           json{{"model", "later"}, {"messages", {{{"role", "user"}, {"content", "hi"}}}}}.dump());
  CHECK(chat.status == 503);
  CHECK(chat.header("retry-after") == "1");
  CHECK(Json(chat.body)["error"]["code"] == "model_loading");
  HttpResponse models = Http(*port, "GET", "/v1/models");
  REQUIRE(models.status == 200);
  CHECK(Json(models.body)["data"][0]["status"] == "loading");
  http.SetDraining();
  CHECK(Json(Http(*port, "GET", "/health").body)["status"] == "shutting_down");
  http.Stop();
  listener.join();
}

TEST_CASE("several models are served side by side", "[server][lifecycle]") {
  REQUIRE_STORIES_MODEL();
  const std::string relu = TestModelPath("relu-tiny.f32.gguf");
  if (!std::filesystem::exists(relu)) THERMOCLINE_SKIP("no relu-tiny.f32.gguf");
  DaemonProcess d("[[models]]\npath = \"" + relu + "\"\nname = \"relu\"\n");
  const json list = Json(Http(d.port(), "GET", "/v1/models").body);
  REQUIRE(list["data"].size() == 2);
  CHECK(list["data"][1]["id"] == "relu");
  CHECK(list["data"][1]["context_length"] == 256);
  double logprob[2];
  int i = 0;
  for (const char* model : {kModelName, "relu"}) {
    HttpResponse r = Http(d.port(), "POST", "/v1/completions",
                          json{{"model", model},
                               {"prompt", "Once upon a time"},
                               {"max_tokens", 12},
                               {"temperature", 0},
                               {"logprobs", 0}}
                              .dump());
    REQUIRE(r.status == 200);
    const json j = Json(r.body);
    CHECK(j["model"] == model);
    // relu-tiny was distilled from stories260K: same greedy text, other probabilities.
    CHECK(j["choices"][0]["text"].get<std::string>().rfind(", there was", 0) == 0);
    logprob[i++] = j["choices"][0]["logprobs"]["token_logprobs"][0];
  }
  CHECK(logprob[0] != logprob[1]);
  // Each model's context is its own.
  HttpResponse big = Http(d.port(), "POST", "/v1/completions",
                          json{{"model", "relu"}, {"prompt", "Once"}, {"max_tokens", 300}}.dump());
  CHECK(big.status == 400);
  CHECK(Json(big.body)["error"]["type"] == "exceed_context_size_error");
}

TEST_CASE("the chat template of the GGUF metadata renders the prompt", "[server][lifecycle]") {
  REQUIRE_STORIES_MODEL();
  // stories260K with Meta's Llama-2 chat template added.
  auto file = GgufFile::Open(StoriesModel());
  REQUIRE(file.ok());
  GgufWriter w;
  for (const GgufKeyValue& kv : (*file)->metadata()) w.Set(kv.key, kv.value);
  w.SetString("tokenizer.chat_template",
              "{% for message in messages %}{{ bos_token + '[INST] ' + message['content'] + "
              "' [/INST]' }}{% if message['role'] == 'system' %}<<SYS>>\\n{% endif %}{% endfor %}");
  for (const GgufTensorInfo& t : (*file)->tensors()) {
    REQUIRE(w.AddTensor(t.name, t.type, t.dims, t.data, t.size_bytes).ok());
  }
  const std::string path = (TempDir() / "stories-llama2.gguf").string();
  REQUIRE(w.Write(path).ok());

  DaemonProcess d("[[models]]\npath = \"" + path + "\"\nname = \"chat\"\n");
  // The GGUF's template is rendered by the Jinja engine.
  CHECK(Json(Http(d.port(), "GET", "/v1/models/chat").body)["chat_template"] == "jinja");
  CHECK(
      Json(Http(d.port(), "GET", std::string("/v1/models/") + kModelName).body)["chat_template"] ==
      "fallback");
  HttpResponse r = Http(d.port(), "POST", "/v1/chat/completions",
                        json{{"model", "chat"},
                             {"messages", {{{"role", "user"}, {"content", "Hi"}}}},
                             {"max_tokens", 4}}
                            .dump());
  REQUIRE(r.status == 200);
  // The rendered prompt, "<s>[INST] Hi [/INST]", with <s> as the BOS id (not doubled).
  HttpResponse t = Http(
      d.port(), "POST", "/tokenize",
      json{{"model", "chat"}, {"content", "<s>[INST] Hi [/INST]"}, {"add_special", true}}.dump());
  const json ids = Json(t.body)["tokens"];
  CHECK(ids[0] == 1);
  CHECK(ids[1] != 1);
  CHECK(Json(r.body)["usage"]["prompt_tokens"] == ids.size());
}

// stories260K with `chat_template` as its tokenizer.chat_template, written to `name`.
std::string StoriesWithTemplate(const std::string& name, const std::string& chat_template) {
  auto file = GgufFile::Open(StoriesModel());
  REQUIRE(file.ok());
  GgufWriter w;
  for (const GgufKeyValue& kv : (*file)->metadata()) w.Set(kv.key, kv.value);
  w.SetString("tokenizer.chat_template", chat_template);
  for (const GgufTensorInfo& t : (*file)->tensors()) {
    REQUIRE(w.AddTensor(t.name, t.type, t.dims, t.data, t.size_bytes).ok());
  }
  const std::string path = (TempDir() / name).string();
  REQUIRE(w.Write(path).ok());
  return path;
}

TEST_CASE("chat requests render tools and tool turns through the model's template",
          "[server][lifecycle][chat]") {
  REQUIRE_STORIES_MODEL();
  const std::string path = StoriesWithTemplate(
      "stories-tools.gguf",
      "{% for t in tools or [] %}[{{ t.function.name }}]{% endfor %}"
      "{% for m in messages %}{% if m.role == 'system' %}"
      "{{ raise_exception('no system messages, please') }}{% endif %}"
      "{% for c in m.tool_calls or [] %}<{{ c.function.arguments.city }}>{% endfor %}"
      "{{ m.content or '' }}{% if m.tool_call_id %}({{ m.tool_call_id }}){% endif %}{% endfor %}");
  DaemonProcess d("[[models]]\npath = \"" + path + "\"\nname = \"chat\"\n");
  const json request = {
      {"model", "chat"},
      {"max_tokens", 2},
      {"tools", {{{"type", "function"}, {"function", {{"name", "weather"}}}}}},
      {"messages",
       {{{"role", "user"}, {"content", "Once"}},
        {{"role", "assistant"},
         {"content", nullptr},
         {"tool_calls",
          {{{"id", "c1"},
            {"type", "function"},
            {"function", {{"name", "weather"}, {"arguments", "{\"city\": \"Oslo\"}"}}}}}}},
        {{"role", "tool"}, {"tool_call_id", "c1"}, {"content", "sunny"}}}}};
  HttpResponse r = Http(d.port(), "POST", "/v1/chat/completions", request.dump());
  REQUIRE(r.status == 200);
  // The prompt the template made: "[weather]Once<Oslo>sunny(c1)".
  HttpResponse t = Http(
      d.port(), "POST", "/tokenize",
      json{{"model", "chat"}, {"content", "[weather]Once<Oslo>sunny(c1)"}, {"add_special", true}}
          .dump());
  CHECK(Json(r.body)["usage"]["prompt_tokens"] == Json(t.body)["tokens"].size());

  // The template's refusal of a conversation is a 400 with its message.
  HttpResponse refused =
      Http(d.port(), "POST", "/v1/chat/completions",
           json{{"model", "chat"},
                {"messages",
                 {{{"role", "system"}, {"content", "s"}}, {{"role", "user"}, {"content", "q"}}}}}
               .dump());
  CHECK(refused.status == 400);
  CHECK(Json(refused.body)["error"]["message"].get<std::string>().find(
            "no system messages, please") != std::string::npos);
}

TEST_CASE("a chat template that cannot be read stops the model's load, naming the line",
          "[server][lifecycle][chat]") {
  REQUIRE_STORIES_MODEL();
  const std::string path =
      StoriesWithTemplate("stories-bad-template.gguf", "{% for m in messages %}\n{{ m.content }");
  const std::string cmd =
      "timeout 20 " + ThermoclineBinary() + " serve --port 0 --model " + path + " 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  REQUIRE(p != nullptr);
  char buf[512];
  std::string out;
  while (size_t n = std::fread(buf, 1, sizeof(buf), p)) out.append(buf, n);
  const int status = ::pclose(p);
  INFO(out);
  CHECK(WEXITSTATUS(status) == 1);
  CHECK(out.find("tokenizer.chat_template cannot be read: line 2") != std::string::npos);
}

TEST_CASE("a model that cannot load stops the daemon with exit code 1", "[server][lifecycle]") {
  const std::string cmd =
      "timeout 20 " + ThermoclineBinary() + " serve --port 0 --model /nonexistent/model.gguf 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  REQUIRE(p != nullptr);
  char buf[512];
  std::string out;
  while (size_t n = std::fread(buf, 1, sizeof(buf), p)) out.append(buf, n);
  const int status = ::pclose(p);
  INFO(out);
  CHECK(WEXITSTATUS(status) == 1);
  CHECK(out.find("/nonexistent/model.gguf") != std::string::npos);
}

}  // namespace
}  // namespace thermocline::testing
