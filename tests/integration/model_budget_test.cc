// Several models under registry.model_memory_budget, through a real daemon: requests to models
// that do not fit together unload the least recently used (seen in /metrics and model info) and
// all succeed, reloading lazily; a model alone over the budget loads anyway; a model with a
// stream in flight is unloaded but not freed under it (the stream completes with the right
// text) while another model's request loads that one.
#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <string>
#include <thread>

#include "daemon_fixture.h"
#include "registry_test_util.h"

namespace thermocline::testing {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

std::string Relu16Model() { return TestModelPath("relu-tiny.f16.gguf"); }
int64_t FileBytes(const std::string& path) {
  return static_cast<int64_t>(std::filesystem::file_size(path));
}

// The [registry] table with the budget, and a state directory of the test's own.
std::string RegistryToml(int64_t budget) {
  static int counter = 0;
  const std::filesystem::path state = TempDir() / ("budget" + std::to_string(counter++) + ".state");
  std::filesystem::remove_all(state);
  return "[registry]\nstate_dir = \"" + state.string() +
         "\"\nmodel_memory_budget = " + std::to_string(budget) + "\n";
}

// stories260K (configured first, as "stories") and relu-tiny F16 (as "relu16") each fit the
// budget, the two together do not.
std::string TwoModelsToml(int64_t budget, const std::string& extra = "") {
  return "[[models]]\npath = \"" + Relu16Model() + "\"\nname = \"relu16\"\n\n" +
         RegistryToml(budget) + extra;
}

std::string MetricsText(int port) { return Http(port, "GET", "/metrics").body; }

double Loaded(const std::string& metrics, const std::string& model) {
  return MetricValue(metrics, "thermocline_model_loaded{model=\"" + model + "\"}");
}

json ModelObject(int port, const std::string& model) {
  const HttpResponse r = Http(port, "GET", "/v1/models/" + model);
  REQUIRE(r.status == 200);
  return Json(r.body);
}

// Polls /metrics until `pred` holds (memory is freed by whichever thread lets go last).
template <typename Pred>
std::string WaitForMetrics(int port, Pred pred, double timeout_s = 10) {
  const auto end = Clock::now() + std::chrono::duration<double>(timeout_s);
  std::string m = MetricsText(port);
  while (!pred(m) && Clock::now() < end) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    m = MetricsText(port);
  }
  return m;
}

// Exactly `model` is in memory, and nothing else.
void CheckOnlyLoaded(int port, const std::string& model, int64_t bytes) {
  const std::string m = WaitForMetrics(
      port, [](const std::string& t) { return MetricValue(t, "thermocline_models_loaded") == 1; });
  INFO(m);
  CHECK(MetricValue(m, "thermocline_models_loaded") == 1);
  CHECK(MetricValue(m, "thermocline_model_memory_bytes") == bytes);
  for (const char* name : {kModelName, "relu16"}) {
    INFO(name);
    const bool expected = model == name;
    CHECK(Loaded(m, name) == (expected ? 1 : 0));
    const json info = ModelObject(port, name);
    CHECK(info["loaded"] == expected);
    CHECK(info["status"] == (expected ? "ready" : "unloaded"));
  }
}

TEST_CASE("memory budget: A, B, A unload the least recently used; every request succeeds",
          "[server][registry][budget]") {
  REQUIRE_STORIES_MODEL();
  if (!HaveReluModel() || !std::filesystem::exists(Relu16Model())) {
    THERMOCLINE_SKIP("no relu-tiny model");
  }
  const int64_t stories = FileBytes(StoriesModel()), relu16 = FileBytes(Relu16Model());
  const int64_t budget = std::max(stories, relu16) + std::min(stories, relu16) / 2;
  DaemonProcess d(TwoModelsToml(budget));
  {
    // Both configured models were checked at start; the second waits for its first request.
    const std::string m = MetricsText(d.port());
    INFO(m);
    CHECK(MetricValue(m, "thermocline_model_memory_budget_bytes") == budget);
    CHECK(MetricValue(m, "thermocline_model_unloads_total") == 1);
  }
  CheckOnlyLoaded(d.port(), kModelName, stories);

  const std::string a1 = GreedyText(d.port(), kModelName, "Once upon a time");
  CheckOnlyLoaded(d.port(), kModelName, stories);
  const std::string b = GreedyText(d.port(), "relu16", "Once upon a time");
  CHECK(!b.empty());
  CheckOnlyLoaded(d.port(), "relu16", relu16);
  const std::string a2 = GreedyText(d.port(), kModelName, "Once upon a time");
  CHECK(a2 == a1);  // reloaded, the same model
  CheckOnlyLoaded(d.port(), kModelName, stories);
  // The tokenizer endpoints load a model too.
  const HttpResponse t = Http(d.port(), "POST", "/tokenize",
                              Post({{"model", "relu16"}, {"content", "Once upon a time"}}));
  CHECK(t.status == 200);
  CheckOnlyLoaded(d.port(), "relu16", relu16);
  CHECK(GreedyText(d.port(), "relu16", "Once upon a time") == b);
  // stories, relu16, stories, relu16 since the start-up check.
  CHECK(MetricValue(MetricsText(d.port()), "thermocline_model_unloads_total") == 4);

  // A registered model bigger than the budget alone: loaded anyway (with a warning), alone.
  json reg = ReluRegistration("big");
  reg["profile_tokens"] = 64;
  const HttpResponse created = Http(d.port(), "POST", "/admin/models", Post(reg));
  INFO(created.body);
  REQUIRE(created.status == 201);
  CHECK(Json(Http(d.port(), "GET", "/admin/models/big").body)["loaded"] == false);
  CHECK(!GreedyText(d.port(), "big", "The cat").empty());
  {
    const std::string m = WaitForMetrics(d.port(), [](const std::string& t) {
      return MetricValue(t, "thermocline_models_loaded") == 1;
    });
    INFO(m);
    CHECK(MetricValue(m, "thermocline_models_loaded") == 1);
    CHECK(MetricValue(m, "thermocline_model_memory_bytes") == FileBytes(ReluModel()));
    CHECK(Loaded(m, "big") == 1);
  }
  CHECK(Json(Http(d.port(), "GET", "/admin/models/big").body)["loaded"] == true);
  CHECK(d.Log().find("model 'big' alone") != std::string::npos);
  CHECK(GreedyText(d.port(), kModelName, "Once upon a time") == a1);
  CheckOnlyLoaded(d.port(), kModelName, stories);
  CHECK(Json(Http(d.port(), "GET", "/admin/models/big").body)["loaded"] == false);
  CHECK(d.Stop() == 0);
}

TEST_CASE("memory budget: a model with a stream in flight is not freed under it",
          "[server][registry][budget]") {
  REQUIRE_STORIES_MODEL();
  if (!std::filesystem::exists(Relu16Model())) THERMOCLINE_SKIP("no relu-tiny model");
  const int64_t stories = FileBytes(StoriesModel()), relu16 = FileBytes(Relu16Model());
  const int64_t budget = std::max(stories, relu16) + std::min(stories, relu16) / 2;
  // Two slots, so that the other model's request runs while the stream does; slow tokens.
  DaemonProcess d(TwoModelsToml(budget, "[scheduler]\nslots = 2\n[debug]\ndecode_delay_ms = 15\n"));
  const json request = {{"model", kModelName},
                        {"prompt", "Once upon a time"},
                        {"max_tokens", 200},
                        {"temperature", 0},
                        {"ignore_eos", true}};
  const HttpResponse reference = Http(d.port(), "POST", "/v1/completions", request.dump());
  REQUIRE(reference.status == 200);
  const std::string expected = Json(reference.body)["choices"][0]["text"];

  json streamed = request;
  streamed["stream"] = true;
  HttpConnection stream(d.port());
  stream.Send("POST", "/v1/completions", streamed.dump(), {{"Connection", "close"}});
  REQUIRE(stream.ReadHead().status == 200);
  std::string text, finish, chunk;
  auto take = [&](const std::string& data) {
    for (const std::string& payload : ParseSse(data)) {
      if (payload == "[DONE]") continue;
      const json e = Json(payload);
      text += e["choices"][0]["text"].get<std::string>();
      if (e["choices"][0]["finish_reason"].is_string()) finish = e["choices"][0]["finish_reason"];
    }
  };
  // Wait for the first tokens: the stream is under way on the stories model.
  while (text.empty() && stream.ReadChunk(&chunk)) take(chunk);
  REQUIRE(!text.empty());

  // The other model loads; the budget makes the registry unload stories, but the stream holds it.
  const HttpResponse other = Http(
      d.port(), "POST", "/v1/completions",
      Post({{"model", "relu16"}, {"prompt", "The cat"}, {"max_tokens", 8}, {"ignore_eos", true}}));
  INFO(other.body << "\nlog:\n" << d.Log());
  REQUIRE(other.status == 200);
  CHECK(Json(other.body)["usage"]["completion_tokens"] == 8);
  {
    const std::string m = MetricsText(d.port());
    INFO(m);
    CHECK(Loaded(m, "relu16") == 1);
    CHECK(Loaded(m, kModelName) == 0);
    CHECK(MetricValue(m, "thermocline_models_loaded") == 2);  // stories: still in memory
    CHECK(MetricValue(m, "thermocline_model_memory_bytes") == stories + relu16);
    CHECK(ModelObject(d.port(), kModelName)["status"] == "unloading");
  }

  while (stream.ReadChunk(&chunk)) take(chunk);
  CHECK(finish == "length");
  CHECK(text == expected);

  // Once the stream has ended, its model is freed.
  CheckOnlyLoaded(d.port(), "relu16", relu16);
  CHECK(d.Log().find("model 'stories' unloaded") != std::string::npos);
  // And loads again on its next request.
  CHECK(
      Json(Http(d.port(), "POST", "/v1/completions", request.dump()).body)["choices"][0]["text"] ==
      expected);
  CheckOnlyLoaded(d.port(), kModelName, stories);
}

TEST_CASE("memory budget: a busy model is kept while an idle one can make room",
          "[server][registry][budget]") {
  REQUIRE_STORIES_MODEL();
  if (!std::filesystem::exists(Relu16Model())) THERMOCLINE_SKIP("no relu-tiny model");
  const int64_t stories = FileBytes(StoriesModel()), relu16 = FileBytes(Relu16Model());
  // stories with one relu16 fits, with two does not. stories is the least recently used model
  // when the third one loads, but it is streaming: the idle relu16 makes room instead.
  const int64_t budget = stories + relu16 + relu16 / 2;
  DaemonProcess d("[[models]]\npath = \"" + Relu16Model() +
                  "\"\nname = \"b\"\n[[models]]\npath = \"" + Relu16Model() +
                  "\"\nname = \"c\"\n\n" + RegistryToml(budget) +
                  "[scheduler]\nslots = 2\n[debug]\ndecode_delay_ms = 15\n");
  {
    const std::string m = MetricsText(d.port());  // stories and b fit, c waits
    INFO(m);
    CHECK(Loaded(m, kModelName) == 1);
    CHECK(Loaded(m, "b") == 1);
    CHECK(Loaded(m, "c") == 0);
  }
  HttpConnection stream(d.port());
  stream.Send("POST", "/v1/completions",
              Post({{"model", kModelName},
                    {"prompt", "Once upon a time"},
                    {"max_tokens", 200},
                    {"ignore_eos", true},
                    {"stream", true}}),
              {{"Connection", "close"}});
  REQUIRE(stream.ReadHead().status == 200);
  std::string chunk;
  REQUIRE(stream.ReadChunk(&chunk));                     // under way
  CHECK(!GreedyText(d.port(), "b", "The cat").empty());  // b is used after stories
  CHECK(!GreedyText(d.port(), "c", "The cat").empty());
  const std::string m = MetricsText(d.port());
  INFO(m << "\nlog:\n" << d.Log());
  CHECK(Loaded(m, kModelName) == 1);
  CHECK(Loaded(m, "b") == 0);
  CHECK(Loaded(m, "c") == 1);
  CHECK(MetricValue(m, "thermocline_model_memory_bytes") == stories + relu16);
  std::string rest;
  while (stream.ReadChunk(&chunk)) rest += chunk;
  CHECK(rest.find("[DONE]") != std::string::npos);
}

}  // namespace
}  // namespace thermocline::testing
