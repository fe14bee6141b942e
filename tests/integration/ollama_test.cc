// Ollama's API over real HTTP: /api/generate and /api/chat (NDJSON streams and single objects,
// greedy text against the reference, durations and counts), /api/tags, /api/show, /api/ps,
// /api/embed, /api/embeddings, /api/version, Ollama-style errors, and keep_alive (0 unloads
// now; a 1 s keep_alive unloads after 1 s idle; the next request loads the model again).
#include <cmath>
#include <thread>

#include "daemon_fixture.h"
#include "model_fixtures.h"

namespace thermocline::testing {
namespace {

using nlohmann::json;

HttpResponse Post(int port, const std::string& path, const json& body) {
  return Http(port, "POST", path, body.dump());
}

json Ok(const HttpResponse& r) {
  INFO(r.body);
  REQUIRE(r.status == 200);
  return Json(r.body);
}

// An NDJSON body: one JSON object per line, every line ended by '\n'.
std::vector<json> Ndjson(const std::string& body) {
  std::vector<json> out;
  size_t pos = 0;
  while (pos < body.size()) {
    const size_t end = body.find('\n', pos);
    INFO(body);
    REQUIRE(end != std::string::npos);
    out.push_back(Json(body.substr(pos, end - pos)));
    pos = end + 1;
  }
  return out;
}

std::string ReferenceContinuation(int index) {
  const json ref = LoadReference("stories260K.reference.json");
  const json& p = ref["prompts"][index];
  return p["full_text"].get<std::string>().substr(p["prompt"].get<std::string>().size());
}

void CheckFinal(const json& f, int prompt_tokens, int eval_count) {
  CHECK(f["done"] == true);
  CHECK(f["done_reason"] == "length");
  CHECK(f["prompt_eval_count"] == prompt_tokens);
  CHECK(f["eval_count"] == eval_count);
  for (const char* k : {"total_duration", "prompt_eval_duration", "eval_duration"}) {
    INFO(k);
    CHECK(f[k].get<int64_t>() > 0);
  }
  CHECK(f["load_duration"].get<int64_t>() >= 0);
  // Nanoseconds: the whole request is longer than its parts and well under a minute.
  CHECK(f["total_duration"].get<int64_t>() >=
        f["prompt_eval_duration"].get<int64_t>() + f["eval_duration"].get<int64_t>());
  CHECK(f["total_duration"].get<int64_t>() < int64_t{60} * 1000000000);
  CHECK(f["created_at"].get<std::string>().back() == 'Z');
}

bool Listed(int port, const std::string& path) {
  const json ps = Ok(Http(port, "GET", path));
  return !ps["models"].empty();
}

TEST_CASE("/api/generate: greedy text as the reference, streamed and not", "[server][ollama]") {
  REQUIRE_STORIES_MODEL();
  DaemonProcess d;
  const json body = {{"model", "stories:latest"},
                     {"prompt", "Once upon a time"},
                     {"raw", true},
                     {"stream", false},
                     {"options", {{"temperature", 0}, {"num_predict", 48}}}};
  const HttpResponse r = Post(d.port(), "/api/generate", body);
  CHECK(r.header("content-type").find("application/json") == 0);
  const json one = Ok(r);
  CHECK(one["model"] == "stories:latest");
  CHECK(one["response"] == ReferenceContinuation(0));
  CheckFinal(one, 5, 48);

  json streamed_body = body;
  streamed_body.erase("stream");  // Ollama streams by default
  const HttpResponse s = Post(d.port(), "/api/generate", streamed_body);
  REQUIRE(s.status == 200);
  CHECK(s.header("content-type").find("application/x-ndjson") == 0);
  const std::vector<json> lines = Ndjson(s.body);
  REQUIRE(lines.size() >= 2);
  std::string text;
  for (size_t i = 0; i + 1 < lines.size(); ++i) {
    CHECK(lines[i]["done"] == false);
    CHECK(lines[i]["model"] == "stories:latest");
    text += lines[i]["response"].get<std::string>();
  }
  CHECK(text == one["response"]);
  CHECK(lines.back()["response"] == "");
  CheckFinal(lines.back(), 5, 48);

  // Through the chat template (not raw), with a stop option.
  const json templated =
      Ok(Post(d.port(), "/api/generate",
              {{"model", kModelName},
               {"prompt", "Once upon a time"},
               {"system", "Tell a story."},
               {"stream", false},
               {"options", {{"temperature", 0}, {"num_predict", 16}, {"seed", 7}}}}));
  CHECK(templated["prompt_eval_count"].get<int>() > 5);  // the template's text and the system
  const std::string full = templated["response"];
  REQUIRE(full.size() > 5);
  // A stop string that first occurs at `k` (k >= 2): the text ends just before it.
  size_t k = 2;
  while (k + 3 <= full.size() && full.find(full.substr(k, 3)) != k) ++k;
  REQUIRE(k + 3 <= full.size());
  const json stopped = Ok(Post(
      d.port(), "/api/generate",
      {{"model", kModelName},
       {"prompt", "Once upon a time"},
       {"system", "Tell a story."},
       {"stream", false},
       {"options", {{"temperature", 0}, {"num_predict", 16}, {"stop", {full.substr(k, 3)}}}}}));
  CHECK(stopped["response"] == full.substr(0, k));
  CHECK(stopped["done_reason"] == "stop");
}

TEST_CASE("/api/chat: the same answer streamed and not", "[server][ollama]") {
  REQUIRE_STORIES_MODEL();
  DaemonProcess d;
  json body = {{"model", kModelName},
               {"messages",
                {{{"role", "system"}, {"content", "Tell a story."}},
                 {{"role", "user"}, {"content", "Once upon a time"}}}},
               {"options", {{"temperature", 0}, {"num_predict", 24}}}};
  const HttpResponse s = Post(d.port(), "/api/chat", body);
  REQUIRE(s.status == 200);
  const std::vector<json> lines = Ndjson(s.body);
  REQUIRE(lines.size() >= 2);
  std::string text;
  for (size_t i = 0; i + 1 < lines.size(); ++i) {
    CHECK(lines[i]["message"]["role"] == "assistant");
    text += lines[i]["message"]["content"].get<std::string>();
  }
  const json& last = lines.back();
  CHECK(last["done"] == true);
  CHECK(last["message"]["content"] == "");
  CHECK(last["eval_count"] == 24);
  body["stream"] = false;
  const json one = Ok(Post(d.port(), "/api/chat", body));
  CHECK(one["model"] == kModelName);
  CHECK(one["message"]["role"] == "assistant");
  CHECK(one["message"]["content"] == text);
  CHECK(one["prompt_eval_count"] == last["prompt_eval_count"]);
  CHECK(text.size() > 0);
}

// format: "json" and a schema constrain the output as response_format does on the OpenAI routes:
// the story model's answer starts as a JSON object, and the bounded schema's answer is one,
// with its required key.
TEST_CASE("/api/generate and /api/chat: format json and a JSON schema", "[server][ollama]") {
  REQUIRE_STORIES_MODEL();
  DaemonProcess d;
  const json schema = {{"type", "object"},
                       {"properties", {{"name", {{"type", "string"}, {"maxLength", 12}}}}},
                       {"required", {"name"}}};
  const json gen = Ok(Post(d.port(), "/api/generate",
                           {{"model", kModelName},
                            {"prompt", "Once upon a time"},
                            {"stream", false},
                            {"format", "json"},
                            {"options", {{"temperature", 0}, {"num_predict", 60}}}}));
  INFO(gen.dump());
  // An object begins at once; whole when the grammar ended it (the story model may also run out
  // of tokens inside a string: "json" bounds no length).
  const std::string text = gen["response"];
  REQUIRE(!text.empty());
  CHECK(text.find_first_not_of(" \n\t") == text.find('{'));
  if (gen["done_reason"] == "stop") CHECK(json::parse(text).is_object());
  const json chat = Ok(Post(d.port(), "/api/chat",
                            {{"model", kModelName},
                             {"messages", {{{"role", "user"}, {"content", "Who is Lily?"}}}},
                             {"stream", false},
                             {"format", schema},
                             {"options", {{"temperature", 0}, {"num_predict", 80}}}}));
  INFO(chat.dump());
  CHECK(chat["done_reason"] == "stop");  // the schema bounds the answer: the grammar ends it
  const json person = json::parse(chat["message"]["content"].get<std::string>());
  REQUIRE(person.is_object());
  REQUIRE(person["name"].is_string());
  CHECK(person["name"].get<std::string>().size() <= 12);
}

TEST_CASE("Ollama errors: {\"error\"} with 404 and 400", "[server][ollama]") {
  REQUIRE_STORIES_MODEL();
  DaemonProcess d;
  auto error = [&](const std::string& path, const json& body, int status) {
    const HttpResponse r = Post(d.port(), path, body);
    INFO(r.body);
    CHECK(r.status == status);
    const json j = Json(r.body);
    REQUIRE(j["error"].is_string());
    return j["error"].get<std::string>();
  };
  const json prompt = {{"model", kModelName}, {"prompt", "hi"}, {"stream", false}};
  CHECK(error("/api/generate", {{"model", "llama3"}, {"prompt", "hi"}}, 404).find("llama3") !=
        std::string::npos);
  CHECK(error("/api/chat", {{"model", "stories:7b"}, {"messages", json::array()}}, 404) != "");
  CHECK(error("/api/show", {{"model", "nope"}}, 404) != "");
  auto with = [&](const char* key, json value) {
    json b = prompt;
    b[key] = std::move(value);
    return b;
  };
  CHECK(error("/api/generate", with("format", 7), 400).find("format") != std::string::npos);
  CHECK(error("/api/generate", with("format", "yaml"), 400).find("format") != std::string::npos);
  CHECK(error("/api/generate", with("images", {"aGVsbG8="}), 400).find("images") !=
        std::string::npos);
  CHECK(error("/api/generate", with("options", {{"num_ctx", 100000}}), 400).find("num_ctx") !=
        std::string::npos);
  // Whole floats past int64 are not integers (converting them would be undefined).
  CHECK(error("/api/generate", with("options", {{"num_predict", 1e300}}), 400)
            .find("'options.num_predict' must be an integer") != std::string::npos);
  CHECK(error("/api/generate", with("options", {{"seed", -1e30}}), 400).find("seed") !=
        std::string::npos);
  CHECK(error("/api/generate", with("options", {{"mirostat", 2}}), 400).find("mirostat") !=
        std::string::npos);
  CHECK(error("/api/generate", with("options", {{"no_such_option", 1}}), 400)
            .find("no_such_option") != std::string::npos);
  CHECK(error("/api/generate", with("keep_alive", "5 parsecs"), 400).find("keep_alive") !=
        std::string::npos);
  CHECK(error("/api/chat",
              {{"model", kModelName},
               {"messages", {{{"role", "user"}, {"content", "hi"}, {"images", {"eA=="}}}}}},
              400)
            .find("images") != std::string::npos);
  CHECK(error("/api/chat", {{"model", kModelName}, {"messages", "hi"}}, 400) != "");
  const HttpResponse bad = Http(d.port(), "POST", "/api/generate", "{not json");
  CHECK(bad.status == 400);
  CHECK(Json(bad.body)["error"].is_string());
  // A smaller num_ctx is served within the model's context.
  CHECK(Post(d.port(), "/api/generate", with("options", {{"num_ctx", 256}, {"num_predict", 2}}))
            .status == 200);
}

TEST_CASE("/api/tags, /api/show, /api/ps, /api/version", "[server][ollama]") {
  REQUIRE_STORIES_MODEL();
  DaemonProcess d;
  const json version = Ok(Http(d.port(), "GET", "/api/version"));
  // `curl -d '{...}'`, Ollama's documented call, sends the JSON as a form.
  CHECK(Ok(Http(d.port(), "POST", "/api/show", json{{"model", kModelName}}.dump(),
                {{"Content-Type", "application/x-www-form-urlencoded"}}))["details"]["format"] ==
        "gguf");
  const HttpResponse no_route = Http(d.port(), "POST", "/api/pull", "{}");
  CHECK(no_route.status == 404);
  CHECK(Json(no_route.body)["error"].is_string());
  CHECK(version["version"].get<std::string>().find('.') != std::string::npos);
  const json tags = Ok(Http(d.port(), "GET", "/api/tags"));
  REQUIRE(tags["models"].size() == 1);
  const json& m = tags["models"][0];
  CHECK(m["name"] == "stories:latest");
  CHECK(m["model"] == "stories:latest");
  CHECK(m["size"].get<int64_t>() ==
        static_cast<int64_t>(std::filesystem::file_size(StoriesModel())));
  CHECK(m["digest"].get<std::string>().size() == 64);
  CHECK(m["details"]["format"] == "gguf");
  CHECK(m["details"]["family"] == "llama");
  CHECK(m["details"]["quantization_level"] == "F32");
  CHECK(m["details"]["parameter_size"].get<std::string>().back() == 'K');  // ~292K weights
  CHECK(m["modified_at"].get<std::string>().back() == 'Z');

  const json show = Ok(Post(d.port(), "/api/show", {{"model", "stories:latest"}}));
  CHECK(show["details"] == m["details"]);
  CHECK(show["model_info"]["general.architecture"] == "llama");
  CHECK(show["model_info"]["llama.context_length"] == 512);
  CHECK(show["model_info"]["llama.embedding_length"] == 64);
  CHECK(show["model_info"]["general.parameter_count"].get<int64_t>() > 200000);
  CHECK(show["model_info"]["tokenizer.ggml.tokens"].is_null());  // arrays only when verbose
  const json verbose = Ok(Post(d.port(), "/api/show", {{"name", kModelName}, {"verbose", true}}));
  CHECK(verbose["model_info"]["tokenizer.ggml.tokens"].size() == 512);
  CHECK(show["modelfile"].get<std::string>().find("FROM " + StoriesModel()) != std::string::npos);
  CHECK(show["capabilities"].size() >= 1);

  const json ps = Ok(Http(d.port(), "GET", "/api/ps"));
  REQUIRE(ps["models"].size() == 1);
  CHECK(ps["models"][0]["name"] == "stories:latest");
  CHECK(ps["models"][0]["size_vram"] == 0);
  CHECK(ps["models"][0]["context_length"] == 512);
  CHECK(ps["models"][0]["expires_at"].get<std::string>().substr(0, 2) == "21");  // never
}

TEST_CASE("/api/embed and /api/embeddings", "[server][ollama]") {
  REQUIRE_STORIES_MODEL();
  DaemonProcess d;
  const json e =
      Ok(Post(d.port(), "/api/embed",
              {{"model", "stories:latest"}, {"input", {"Once upon a time", "The cat"}}}));
  CHECK(e["model"] == "stories:latest");
  REQUIRE(e["embeddings"].size() == 2);
  const std::vector<float> a = e["embeddings"][0], b = e["embeddings"][1];
  double norm = 0, dist = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    norm += double{a[i]} * a[i];
    dist += std::abs(double{a[i]} - b[i]);
  }
  CHECK(a.size() == 64);
  CHECK(std::abs(norm - 1) < 1e-5);
  CHECK(dist > 1e-2);
  CHECK(e["prompt_eval_count"].get<int>() > 5);
  CHECK(e["total_duration"].get<int64_t>() > 0);
  // The same vector as OpenAI's route.
  const json openai =
      Ok(Post(d.port(), "/v1/embeddings", {{"model", kModelName}, {"input", "Once upon a time"}}));
  CHECK(openai["data"][0]["embedding"].get<std::vector<float>>() == a);
  // Legacy: the pooled vector unnormalised, in a's direction.
  const json legacy = Ok(
      Post(d.port(), "/api/embeddings", {{"model", kModelName}, {"prompt", "Once upon a time"}}));
  const std::vector<float> raw = legacy["embedding"];
  REQUIRE(raw.size() == a.size());
  double raw_norm = 0;
  for (float x : raw) raw_norm += double{x} * x;
  raw_norm = std::sqrt(raw_norm);
  CHECK(std::abs(raw_norm - 1) > 1e-3);
  for (size_t i = 0; i < a.size(); ++i) CHECK(std::abs(raw[i] / raw_norm - a[i]) < 1e-5);
  // Truncation (Ollama's default) vs refusal.
  std::string text;
  for (int i = 0; i < 600; ++i) text += " cat";
  const json cut = Ok(Post(d.port(), "/api/embed", {{"model", kModelName}, {"input", text}}));
  CHECK(cut["prompt_eval_count"] == 512);
  CHECK(Post(d.port(), "/api/embed", {{"model", kModelName}, {"input", text}, {"truncate", false}})
            .status == 400);
  // No input: loads the model, no vectors.
  const json empty = Ok(Post(d.port(), "/api/embed", {{"model", kModelName}}));
  CHECK(empty["embeddings"].empty());
}

TEST_CASE("keep_alive 0 unloads now; the next request loads again", "[server][ollama]") {
  REQUIRE_STORIES_MODEL();
  DaemonProcess d;
  REQUIRE(Listed(d.port(), "/api/ps"));
  const json unload =
      Ok(Post(d.port(), "/api/generate", {{"model", kModelName}, {"keep_alive", 0}}));
  CHECK(unload["done"] == true);
  CHECK(unload["done_reason"] == "unload");
  CHECK_FALSE(Listed(d.port(), "/api/ps"));
  CHECK(Ok(Http(d.port(), "GET", std::string("/v1/models/") + kModelName))["loaded"] == false);
  const json again = Ok(Post(d.port(), "/api/generate",
                             {{"model", kModelName},
                              {"prompt", "Once upon a time"},
                              {"raw", true},
                              {"stream", false},
                              {"options", {{"temperature", 0}, {"num_predict", 48}}}}));
  CHECK(again["response"] == ReferenceContinuation(0));  // the reloaded model, the same tokens
  CHECK(again["load_duration"].get<int64_t>() > 0);
  CHECK(Listed(d.port(), "/api/ps"));
  // The chat route's load request.
  const json load =
      Ok(Post(d.port(), "/api/chat", {{"model", kModelName}, {"messages", json::array()}}));
  CHECK(load["done_reason"] == "load");
  CHECK(load["message"]["content"] == "");
}

TEST_CASE("a 1 s keep_alive unloads after 1 s idle", "[server][ollama]") {
  REQUIRE_STORIES_MODEL();
  DaemonProcess d;
  const auto sent = std::chrono::steady_clock::now();
  const json r = Ok(Post(d.port(), "/api/generate",
                         {{"model", kModelName},
                          {"prompt", "Once upon a time"},
                          {"keep_alive", "1s"},
                          {"stream", false},
                          {"options", {{"num_predict", 4}}}}));
  CHECK(r["done"] == true);
  const json ps = Ok(Http(d.port(), "GET", "/api/ps"));
  if (std::chrono::steady_clock::now() - sent < std::chrono::milliseconds(800)) {
    REQUIRE(ps["models"].size() == 1);  // idle for less than its keep_alive: still loaded
  }
  // Bounded wait: 1 s of keep_alive, a 100 ms tick, and a loaded machine's slack.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (Listed(d.port(), "/api/ps") && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  CHECK_FALSE(Listed(d.port(), "/api/ps"));
  CHECK(std::chrono::steady_clock::now() - sent >= std::chrono::seconds(1));
  CHECK(d.Log().find("keep_alive ran out") != std::string::npos);
  // Loaded again by the next request (OpenAI's route too), and unloaded again after it.
  const HttpResponse c = Post(d.port(), "/v1/completions",
                              {{"model", kModelName}, {"prompt", "Once"}, {"max_tokens", 2}});
  CHECK(c.status == 200);
  const auto deadline2 = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (Listed(d.port(), "/api/ps") && std::chrono::steady_clock::now() < deadline2) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  CHECK_FALSE(Listed(d.port(), "/api/ps"));
  // keep_alive -1: loaded for good.
  Ok(Post(d.port(), "/api/generate", {{"model", kModelName}, {"keep_alive", -1}}));
  std::this_thread::sleep_for(std::chrono::milliseconds(1300));
  CHECK(Listed(d.port(), "/api/ps"));
}

}  // namespace
}  // namespace thermocline::testing
