// Helpers of the registry and admin API tests: the relu-tiny model and its corpus, a sidecar
// made once per test run with `thermocline profile`, greedy completions, the events stream.
#pragma once

#include <catch2/catch.hpp>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "daemon_fixture.h"
#include "http_client.h"
#include "test_util.h"

namespace thermocline::testing {

inline std::string ReluModel() { return TestModelPath("relu-tiny.f32.gguf"); }
inline std::string ProfileCorpus() { return TestModelPath("tinystories-profile.txt"); }
inline bool HaveReluModel() {
  return std::filesystem::exists(ReluModel()) && std::filesystem::exists(ProfileCorpus());
}

// A profile of 3072 corpus tokens: long enough that sparse greedy text equals dense (the
// engine's sparse quality test uses the same), short enough for a job of seconds.
inline nlohmann::json ReluRegistration(const std::string& name) {
  return {
      {"path", ReluModel()}, {"name", name}, {"corpus", ProfileCorpus()}, {"profile_tokens", 3072}};
}

inline std::string SharedReluSidecar() {
  static const std::string path = [] {
    const std::string out = (TempDir() / "registry-relu.thermo.gguf").string();
    const CliResult r =
        RunThermocline("profile -m " + ReluModel() + " --corpus " + ProfileCorpus() +
                       " --tokens 3072 --samples 3072 --quiet -t 2 -o " + out);
    INFO(r.out);
    REQUIRE(r.exit_code == 0);
    return out;
  }();
  return path;
}

// 24 greedy tokens of `model` after `prompt`.
inline std::string GreedyText(int port, const std::string& model, const std::string& prompt) {
  const HttpResponse r = Http(port, "POST", "/v1/completions",
                              Post({{"model", model},
                                    {"prompt", prompt},
                                    {"max_tokens", 24},
                                    {"temperature", 0},
                                    {"ignore_eos", true}}));
  INFO(r.body);
  REQUIRE(r.status == 200);
  return Json(r.body)["choices"][0]["text"];
}

// The events stream of one model until it ends (terminal state or deletion): every event's JSON.
inline std::vector<nlohmann::json> WatchEvents(int port, const std::string& name) {
  HttpConnection c(port, 120000);
  c.Send("GET", "/admin/models/" + name + "/events", "", {{"Connection", "close"}});
  const HttpResponse r = c.ReadResponse();
  INFO(r.body);
  REQUIRE(r.status == 200);
  CHECK(r.header("content-type").find("text/event-stream") == 0);
  std::vector<nlohmann::json> events;
  size_t pos = 0;
  while (pos < r.body.size()) {
    size_t end = r.body.find("\n\n", pos);
    if (end == std::string::npos) end = r.body.size();
    const std::string event = r.body.substr(pos, end - pos);
    if (event.rfind("data: ", 0) == 0)
      events.push_back(Json(event.substr(6)));
    else
      CHECK(event.rfind(":", 0) == 0);  // comments (keep-alive) only
    pos = end + 2;
  }
  return events;
}

}  // namespace thermocline::testing
