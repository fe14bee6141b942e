// The daemon's endpoints over real HTTP, non-streamed: models, completions and chat (greedy
// output checked against the independent reference), tokenizer endpoints, health, metrics and
// the access log.
#include <ctime>
#include <filesystem>

#include "daemon_fixture.h"
#include "model_fixtures.h"

namespace thermocline::testing {
namespace {

using nlohmann::json;

// The greedy continuation the reference says follows `prompt` (48 tokens).
std::string ReferenceContinuation(int index) {
  const json ref = LoadReference("stories260K.reference.json");
  const json& p = ref["prompts"][index];
  return p["full_text"].get<std::string>().substr(p["prompt"].get<std::string>().size());
}

json Completion(int port, const json& body) {
  HttpResponse r = Http(port, "POST", "/v1/completions", body.dump());
  INFO(r.body);
  REQUIRE(r.status == 200);
  CHECK(r.header("content-type").find("application/json") == 0);
  return Json(r.body);
}

TEST_CASE("models are listed and looked up", "[server][api]") {
  REQUIRE_STORIES_MODEL();
  DaemonProcess d;
  HttpResponse r = Http(d.port(), "GET", "/v1/models");
  REQUIRE(r.status == 200);
  json list = Json(r.body);
  CHECK(list["object"] == "list");
  REQUIRE(list["data"].size() == 1);
  CHECK(list["data"][0]["id"] == kModelName);
  CHECK(list["data"][0]["object"] == "model");
  CHECK(list["data"][0]["owned_by"] == "thermocline");
  CHECK(list["data"][0]["created"].get<int64_t>() > 1600000000);
  r = Http(d.port(), "GET", std::string("/v1/models/") + kModelName);
  REQUIRE(r.status == 200);
  CHECK(Json(r.body)["id"] == kModelName);
  r = Http(d.port(), "GET", "/v1/models/gpt-4");
  CHECK(r.status == 404);
  CHECK(Json(r.body)["error"]["type"] == "not_found_error");
  CHECK(Json(r.body)["error"]["code"] == "model_not_found");
}

TEST_CASE("greedy completions match the reference continuation", "[server][api]") {
  REQUIRE_STORIES_MODEL();
  DaemonProcess d;
  const json ref = LoadReference("stories260K.reference.json");
  for (int i = 0; i < 2; ++i) {
    const std::string prompt = ref["prompts"][i]["prompt"];
    const json c = Completion(
        d.port(),
        {{"model", kModelName}, {"prompt", prompt}, {"max_tokens", 48}, {"temperature", 0}});
    INFO(c.dump());
    CHECK(c["id"].get<std::string>().rfind("cmpl-", 0) == 0);
    CHECK(c["object"] == "text_completion");
    CHECK(std::abs(c["created"].get<int64_t>() - static_cast<int64_t>(std::time(nullptr))) < 60);
    CHECK(c["model"] == kModelName);
    REQUIRE(c["choices"].size() == 1);
    CHECK(c["choices"][0]["index"] == 0);
    CHECK(c["choices"][0]["text"] == ReferenceContinuation(i));
    CHECK(c["choices"][0]["finish_reason"] == "length");
    CHECK(c["choices"][0]["logprobs"].is_null());
    CHECK(c["usage"]["prompt_tokens"] == ref["prompts"][i]["prompt_ids"].size());
    CHECK(c["usage"]["completion_tokens"] == 48);
    CHECK(c["usage"]["total_tokens"] == c["usage"]["prompt_tokens"].get<int>() + 48);
  }
  // The prompt as token ids, and as a one-element array, gives the same.
  const json ids = Completion(d.port(), {{"model", kModelName},
                                         {"prompt", ref["prompts"][0]["prompt_ids"]},
                                         {"max_tokens", 48},
                                         {"temperature", 0}});
  CHECK(ids["choices"][0]["text"] == ReferenceContinuation(0));
  const json arr = Completion(d.port(), {{"model", kModelName},
                                         {"prompt", json::array({"Once upon a time"})},
                                         {"max_tokens", 48},
                                         {"temperature", 0}});
  CHECK(arr["choices"][0]["text"] == ReferenceContinuation(0));
}

TEST_CASE("stop strings end a completion before them", "[server][api]") {
  REQUIRE_STORIES_MODEL();
  DaemonProcess d;
  const std::string full = ReferenceContinuation(0);  // ", there was a little girl named Lily..."
  // "re wa" spans the tokens " there" and " was".
  for (const std::string stop : {"re wa", "Lily", ". "}) {
    const json c = Completion(d.port(), {{"model", kModelName},
                                         {"prompt", "Once upon a time"},
                                         {"max_tokens", 48},
                                         {"temperature", 0},
                                         {"stop", json::array({"never-there", stop})}});
    INFO(stop);
    CHECK(c["choices"][0]["text"] == full.substr(0, full.find(stop)));
    CHECK(c["choices"][0]["finish_reason"] == "stop");
    CHECK(c["usage"]["completion_tokens"].get<int>() < 48);
  }
}

TEST_CASE("chat completions use the fallback template", "[server][api]") {
  REQUIRE_STORIES_MODEL();
  DaemonProcess d;
  const json body = {{"model", kModelName},
                     {"messages",
                      {{{"role", "system"}, {"content", "A story."}},
                       {{"role", "user"}, {"content", "Once upon a time"}}}},
                     {"max_tokens", 40},
                     {"temperature", 0},
                     {"user", "someone"}};
  HttpResponse r = Http(d.port(), "POST", "/v1/chat/completions", body.dump());
  INFO(r.body);
  REQUIRE(r.status == 200);
  const json c = Json(r.body);
  CHECK(c["id"].get<std::string>().rfind("chatcmpl-", 0) == 0);
  CHECK(c["object"] == "chat.completion");
  CHECK(c["model"] == kModelName);
  REQUIRE(c["choices"].size() == 1);
  CHECK(c["choices"][0]["message"]["role"] == "assistant");
  const std::string content = c["choices"][0]["message"]["content"];
  CHECK(!content.empty());
  CHECK(c["usage"]["completion_tokens"].get<int>() >= 1);
  // The same prompt rendered by hand through the legacy endpoint gives the same text.
  const json same =
      Completion(d.port(), {{"model", kModelName},
                            {"prompt", "A story.\n\nUser: Once upon a time\nAssistant:"},
                            {"max_tokens", 40},
                            {"temperature", 0},
                            {"stop", "\nUser:"}});
  CHECK(same["choices"][0]["text"] == content);
  CHECK(same["choices"][0]["finish_reason"] == c["choices"][0]["finish_reason"]);
  CHECK(same["usage"]["prompt_tokens"] == c["usage"]["prompt_tokens"]);
}

TEST_CASE("logprobs come in the chat and the legacy shapes", "[server][api]") {
  REQUIRE_STORIES_MODEL();
  DaemonProcess d;
  const json chat = Json(Http(d.port(), "POST", "/v1/chat/completions",
                              json{{"model", kModelName},
                                   {"messages", {{{"role", "user"}, {"content", "Hi"}}}},
                                   {"max_tokens", 8},
                                   {"temperature", 0},
                                   {"logprobs", true},
                                   {"top_logprobs", 3}}
                                  .dump())
                             .body);
  INFO(chat.dump());
  const json& content = chat["choices"][0]["logprobs"]["content"];
  REQUIRE(content.size() == chat["usage"]["completion_tokens"].get<size_t>());
  std::string joined;
  for (const json& t : content) {
    joined += t["token"].get<std::string>();
    REQUIRE(t["top_logprobs"].size() == 3);
    // Greedy: the chosen token is the most likely one.
    CHECK(t["logprob"].get<double>() == Approx(t["top_logprobs"][0]["logprob"].get<double>()));
    CHECK(t["logprob"].get<double>() <= 0);
    CHECK(t["bytes"].is_array());
  }
  CHECK(joined == chat["choices"][0]["message"]["content"]);
  // logprobs without top_logprobs is valid.
  HttpResponse plain = Http(d.port(), "POST", "/v1/chat/completions",
                            json{{"model", kModelName},
                                 {"messages", {{{"role", "user"}, {"content", "Hi"}}}},
                                 {"max_tokens", 4},
                                 {"logprobs", true}}
                                .dump());
  REQUIRE(plain.status == 200);
  CHECK(Json(plain.body)["choices"][0]["logprobs"]["content"][0]["top_logprobs"].empty());

  const json legacy = Completion(d.port(), {{"model", kModelName},
                                            {"prompt", "Once upon a time"},
                                            {"max_tokens", 6},
                                            {"temperature", 0},
                                            {"logprobs", 2}});
  const json& lp = legacy["choices"][0]["logprobs"];
  INFO(legacy.dump());
  REQUIRE(lp["tokens"].size() == 6);
  REQUIRE(lp["token_logprobs"].size() == 6);
  REQUIRE(lp["top_logprobs"].size() == 6);
  REQUIRE(lp["text_offset"].size() == 6);
  CHECK(lp["text_offset"][0] == 0);
  CHECK(lp["tokens"][0] == ",");
  CHECK(lp["top_logprobs"][0].size() == 2);
}

TEST_CASE("seeded sampling is reproducible", "[server][api]") {
  REQUIRE_STORIES_MODEL();
  DaemonProcess d;
  auto sample = [&](int64_t seed) {
    return Completion(d.port(), {{"model", kModelName},
                                 {"prompt", "Once upon a time"},
                                 {"max_tokens", 32},
                                 {"temperature", 1.0},
                                 {"top_k", 0},
                                 {"top_p", 1.0},
                                 {"min_p", 0},
                                 {"seed", seed}})["choices"][0]["text"]
        .get<std::string>();
  };
  const std::string a = sample(42);
  CHECK(sample(42) == a);
  bool differs = false;
  for (int64_t seed : {1, 2, 3}) differs |= sample(seed) != a;
  CHECK(differs);
}

// A llama.cpp K-quant file served as the engine re-lays it (the default) and as the file stores
// it ([[models]] repack = false): both complete a prompt with llama.cpp's greedy tokens
// (../shared/models/kquants/; docs/types.md, "Against llama.cpp").
TEST_CASE("a K-quant model completes as llama.cpp does, with and without repack",
          "[server][api][kquants]") {
  REQUIRE_STORIES_MODEL();
  const std::string path = TestModelPath("kquants/stories-wide.q3_k_m.gguf");
  if (!std::filesystem::exists(path)) THERMOCLINE_SKIP("kquants/ test models not found");
  DaemonProcess d("[[models]]\npath = \"" + path + "\"\nname = \"q3km\"\n\n[[models]]\npath = \"" +
                  path + "\"\nname = \"q3km-rows\"\nrepack = false\n");
  const json ref = LoadReference("kquants/stories-wide.q3_k_m.llama-cpp.json");
  const json& p = ref["prompts"][3];  // where one integer sum per row and block parted at 13
  std::vector<int32_t> ids = p["prompt_ids"];
  for (int32_t id : p["greedy_ids"]) ids.push_back(id);
  HttpResponse r =
      Http(d.port(), "POST", "/detokenize", json{{"model", "q3km"}, {"tokens", ids}}.dump());
  REQUIRE(r.status == 200);
  const std::string want = Json(r.body)["content"];
  for (const char* model : {"q3km", "q3km-rows"}) {
    INFO(model);
    const json c = Completion(d.port(), {{"model", model},
                                         {"prompt", p["prompt"]},
                                         {"max_tokens", 48},
                                         {"temperature", 0},
                                         {"ignore_eos", true}});
    CHECK(p["prompt"].get<std::string>() + c["choices"][0]["text"].get<std::string>() == want);
    CHECK(c["usage"]["completion_tokens"] == 48);
  }
}

TEST_CASE("tokenize and detokenize round-trip", "[server][api]") {
  REQUIRE_STORIES_MODEL();
  DaemonProcess d;
  const json ref = LoadReference("stories260K.reference.json");
  HttpResponse r = Http(d.port(), "POST", "/tokenize",
                        json{{"content", "Once upon a time"}, {"add_special", true}}.dump());
  REQUIRE(r.status == 200);
  CHECK(Json(r.body)["tokens"] == ref["prompts"][0]["prompt_ids"]);
  r = Http(d.port(), "POST", "/tokenize",
           json{{"model", kModelName}, {"content", "Once"}, {"with_pieces", true}}.dump());
  REQUIRE(r.status == 200);
  CHECK(Json(r.body)["tokens"][0]["piece"] == " Once");
  r = Http(d.port(), "POST", "/detokenize",
           json{{"tokens", ref["prompts"][0]["prompt_ids"]}}.dump());
  REQUIRE(r.status == 200);
  CHECK(Json(r.body)["content"] == "Once upon a time");
  r = Http(d.port(), "POST", "/detokenize", json{{"tokens", {1, 99999}}}.dump());
  CHECK(r.status == 400);
}

TEST_CASE("health, metrics and the access log", "[server][api]") {
  REQUIRE_STORIES_MODEL();
  DaemonProcess d;
  HttpResponse h = Http(d.port(), "GET", "/health");
  CHECK(h.status == 200);
  CHECK(Json(h.body)["status"] == "ok");
  Completion(d.port(), {{"model", kModelName}, {"prompt", "Once upon a time"}, {"max_tokens", 5}});
  Http(d.port(), "GET", "/nope");
  HttpResponse m = Http(d.port(), "GET", "/metrics");
  REQUIRE(m.status == 200);
  CHECK(m.header("content-type").find("text/plain") == 0);
  INFO(m.body);
  CHECK(
      MetricValue(
          m.body,
          R"(thermocline_requests_total{frontend="http",endpoint="/v1/completions",status="200"})") ==
      1);
  CHECK(MetricValue(
            m.body,
            R"(thermocline_requests_total{frontend="http",endpoint="other",status="404"})") == 1);
  CHECK(MetricValue(m.body, "thermocline_prompt_tokens_total") == 5);
  CHECK(MetricValue(m.body, "thermocline_generated_tokens_total") == 5);
  CHECK(MetricValue(m.body, "thermocline_time_to_first_token_seconds_count") == 1);
  CHECK(MetricValue(m.body, "thermocline_inter_token_latency_seconds_count") == 4);
  CHECK(MetricValue(m.body, R"(thermocline_inter_token_latency_seconds_bucket{le="+Inf"})") == 4);
  CHECK(MetricValue(m.body, "thermocline_queue_depth") == 0);
  CHECK(MetricValue(m.body, "thermocline_slots_busy") == 0);
  CHECK(MetricValue(m.body, "thermocline_slots") == 1);
  CHECK(MetricValue(m.body, R"(thermocline_cancellations_total{reason="client_disconnected"})") ==
        0);
  // An access log line is written once its response is out, by the connection's thread: the
  // completion's may come after the 404's. Wait for both.
  std::string log;
  auto both_logged = [&] {
    log = d.Log();
    return log.find("POST /v1/completions 200") != std::string::npos &&
           log.find("GET /nope 404") != std::string::npos;
  };
  for (int i = 0; i < 250 && !both_logged(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  INFO(log);
  CHECK(log.find("POST /v1/completions 200 prompt=5 completion=5 ttft=") != std::string::npos);
  CHECK(log.find("GET /nope 404") != std::string::npos);
}

}  // namespace
}  // namespace thermocline::testing
