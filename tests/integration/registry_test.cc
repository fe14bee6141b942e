// The model registry end to end, through a real daemon: serving from a sidecar (--sparse),
// register → job → ready → served sparse, restart and kill -9 mid-job (state intact, the job
// resumed), delete, cancel, a missing or corrupt model file, duplicate names.
#include <atomic>
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <thread>

#include "daemon_fixture.h"
#include "offline/sidecar/sidecar.h"
#include "registry_test_util.h"

namespace thermocline::testing {
namespace {

TEST_CASE("serve --sparse: a sidecar serves relu-tiny sparse with the dense greedy text",
          "[registry][sparse]") {
  if (!HaveReluModel()) THERMOCLINE_SKIP("no relu-tiny model or corpus");
  const std::string sidecar = SharedReluSidecar();
  DaemonProcess d("[[models]]\npath = \"" + ReluModel() +
                  "\"\nname = \"relu-sparse\"\nsparse = \"on\"\nsidecar = \"" + sidecar +
                  "\"\n[[models]]\npath = \"" + ReluModel() +
                  "\"\nname = \"relu-dense\"\nsparse = \"off\"\n");
  const nlohmann::json models = Json(Http(d.port(), "GET", "/v1/models").body);
  std::map<std::string, nlohmann::json> by_id;
  for (const auto& m : models["data"]) by_id[m["id"]] = m;
  CHECK(by_id["relu-sparse"]["mode"] == "sparse");
  CHECK(by_id["relu-sparse"]["placement"]["cpu_neurons"].get<int64_t>() +
            by_id["relu-sparse"]["placement"]["gpu_neurons"].get<int64_t>() ==
        6 * 512);
  CHECK(by_id["relu-dense"]["mode"] == "dense");
  CHECK(by_id["relu-dense"]["placement"].is_null());
  for (const char* prompt : {"Once upon a time", "Lily and Ben", "The cat"}) {
    INFO(prompt);
    CHECK(GreedyText(d.port(), "relu-sparse", prompt) ==
          GreedyText(d.port(), "relu-dense", prompt));
  }
  const std::string metrics = Http(d.port(), "GET", "/metrics").body;
  CHECK(MetricValue(metrics, "thermocline_model_sparse{model=\"relu-sparse\"}") == 1);
  CHECK(MetricValue(metrics, "thermocline_model_sparse{model=\"relu-dense\"}") == 0);
  // The budget counts both mapped files and the sparse model's copies of its FFN rows (gate,
  // up and down_t in firing order): more than nothing, less than the whole file.
  const double file = static_cast<double>(std::filesystem::file_size(ReluModel()));
  const double copies = MetricValue(metrics, "thermocline_model_memory_bytes") - 2 * file;
  CHECK(copies > 0);
  CHECK(copies < file);
}

TEST_CASE("serve: sparse = on without a sidecar fails with what to do", "[registry][sparse]") {
  REQUIRE_STORIES_MODEL();
  DaemonProcess d("[[models]]\npath = \"" + StoriesModel() + "\"\nname = \"s2\"\nsparse = \"on\"\n",
                  /*wait_ready=*/false);
  CHECK(d.Wait(30) != 0);
  CHECK(d.Log().find("needs a sidecar") != std::string::npos);
}

TEST_CASE("register relu-tiny: job to ready, then served sparse with the dense greedy text",
          "[registry][admin]") {
  if (!HaveReluModel()) THERMOCLINE_SKIP("no relu-tiny model or corpus");
  DaemonProcess d("[[models]]\npath = \"" + ReluModel() +
                  "\"\nname = \"relu-dense\"\nsparse = \"off\"\n[scheduler]\nslots = 2\n");
  const HttpResponse created =
      Http(d.port(), "POST", "/admin/models", Post(ReluRegistration("relu")));
  INFO(created.body);
  REQUIRE(created.status == 201);
  // Requests to the model run back to back while its job runs: none fails or is cut short
  // when the slots switch from dense to sparse.
  std::atomic<bool> stop{false};
  std::atomic<int> ok{0}, bad{0};
  std::thread client([&] {
    while (!stop.load()) {
      try {
        const HttpResponse r = Http(d.port(), "POST", "/v1/completions",
                                    Post({{"model", "relu"},
                                          {"prompt", "Once upon a time"},
                                          {"max_tokens", 16},
                                          {"ignore_eos", true}}));
        const nlohmann::json j = nlohmann::json::parse(r.body, nullptr, false);
        const bool full =
            r.status == 200 && !j.is_discarded() && j["usage"]["completion_tokens"] == 16;
        (full ? ok : bad)++;
      } catch (const std::exception&) {
        bad++;
      }
    }
  });
  struct Joiner {  // also when a REQUIRE below throws
    std::atomic<bool>& stop;
    std::thread& t;
    ~Joiner() {
      stop = true;
      if (t.joinable()) t.join();
    }
  } joiner{stop, client};
  const nlohmann::json first = Json(created.body);
  CHECK(first["name"] == "relu");
  CHECK((first["state"] == "registered" || first["state"] == "profiling"));
  // Served dense meanwhile, not refused.
  CHECK(Json(Http(d.port(), "GET", "/admin/models/relu").body)["mode"] == "dense");

  const std::vector<nlohmann::json> events = WatchEvents(d.port(), "relu");
  // A few more after the switch.
  const int before_switch = ok.load();
  while (ok.load() < before_switch + 3 && bad.load() == 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  stop = true;
  client.join();
  CHECK(bad.load() == 0);
  CHECK(ok.load() >= 3);
  REQUIRE(!events.empty());
  const nlohmann::json& last = events.back();
  INFO(last.dump() << "\nlog:\n" << d.Log());
  REQUIRE(last["state"] == "ready");
  CHECK(last["stage"] == "done");
  CHECK(last["percent"] == 100);
  CHECK(last["placement"]["cpu_neurons"].get<int64_t>() +
            last["placement"]["gpu_neurons"].get<int64_t>() ==
        6 * 512);
  CHECK(last["report"]["layers"] == 6);
  CHECK(last["report"]["sparsity"].get<double>() > 0.5);
  CHECK(last["report"]["speed_check"].is_null());  // the fixture's registry.speed_check = false
  CHECK(last["mode"] == "sparse");
  // Versions increase and the stages come in order.
  std::vector<std::string> stages;
  for (size_t i = 0; i < events.size(); ++i) {
    if (i > 0) CHECK(events[i]["version"].get<int64_t>() > events[i - 1]["version"].get<int64_t>());
    const std::string stage = events[i]["stage"];
    if (stages.empty() || stages.back() != stage) stages.push_back(stage);
  }
  CHECK(std::find(stages.begin(), stages.end(), "profile") != stages.end());
  CHECK(std::find(stages.begin(), stages.end(), "solve") != stages.end());
  // The sidecar is in the state directory, not beside the user's model.
  const std::string sidecar = last["sidecar_path"];
  CHECK(std::filesystem::exists(sidecar));
  CHECK(std::filesystem::path(sidecar).parent_path() !=
        std::filesystem::path(ReluModel()).parent_path());

  for (const char* prompt : {"Once upon a time", "Lily and Ben"}) {
    INFO(prompt);
    CHECK(GreedyText(d.port(), "relu", prompt) == GreedyText(d.port(), "relu-dense", prompt));
  }
  const nlohmann::json v1 = Json(Http(d.port(), "GET", "/v1/models/relu").body);
  CHECK(v1["mode"] == "sparse");
  CHECK(v1["placement"]["cpu_neurons"].is_number());
  const std::string metrics = Http(d.port(), "GET", "/metrics").body;
  CHECK(MetricValue(metrics, "thermocline_model_sparse{model=\"relu\"}") == 1);
  CHECK(MetricValue(metrics, "thermocline_model_cpu_neurons{model=\"relu\"}") >= 0);
}

TEST_CASE("registry.speed_check: a registered model is served sparse only where that pays here",
          "[registry][admin][sparse]") {
  if (!HaveReluModel()) THERMOCLINE_SKIP("no relu-tiny model or corpus");
  const std::filesystem::path state = TempDir() / "speed-check.state";
  std::filesystem::remove_all(state);
  DaemonProcess d("[registry]\nstate_dir = \"" + state.string() + "\"\n");  // the default: on
  REQUIRE(Http(d.port(), "POST", "/admin/models", Post(ReluRegistration("relu"))).status == 201);
  const nlohmann::json last = WatchEvents(d.port(), "relu").back();
  INFO(last.dump() << "\nlog:\n" << d.Log());
  REQUIRE(last["state"] == "ready");
  auto sidecar = offline::ReadSidecar(last["sidecar_path"].get<std::string>());
  REQUIRE(sidecar.ok());
  const offline::SidecarSpeed& speed = sidecar->speed;
  REQUIRE(speed.present);
  CHECK(speed.dense_tokens_per_s > 0);
  CHECK(speed.predicted_tokens_per_s > 0);
  CHECK(speed.gate_first_tokens_per_s == 0);    // ReLU: no gate-first
  CHECK(speed.input_sparse_tokens_per_s == 0);  // nor input-sparse
  CHECK(d.Log().find("job 'relu': speed check: dense") != std::string::npos);
  const nlohmann::json& reported = last["report"]["speed_check"];
  CHECK(reported["cpu"] == speed.cpu);
  CHECK(reported["dense_tokens_per_s"].get<double>() == Approx(speed.dense_tokens_per_s));
  CHECK(reported["predicted_tokens_per_s"].get<double>() == Approx(speed.predicted_tokens_per_s));
  CHECK(reported["input_sparse_tokens_per_s"].get<double>() == 0);
  // Served as the measurement says, and said why when dense.
  const bool pays = speed.predicted_tokens_per_s >= speed.dense_tokens_per_s;
  CHECK(!GreedyText(d.port(), "relu", "Once upon a time").empty());  // loads it
  const nlohmann::json loaded = Json(Http(d.port(), "GET", "/admin/models/relu").body);
  INFO(loaded.dump());
  CHECK(loaded["mode"] == (pays ? "sparse" : "dense"));
  if (!pays) {
    CHECK(loaded["warning"].get<std::string>().find("slower than dense on this machine") !=
          std::string::npos);
  }
}

TEST_CASE("registry.target_ppl_increase: a SwiGLU model's job calibrates its sparsity",
          "[registry][admin][sparse]") {
  const std::string model = TestModelPath("stories260K.gguf");
  if (!std::filesystem::exists(model) || !std::filesystem::exists(ProfileCorpus())) {
    THERMOCLINE_SKIP("no stories260K model or corpus");
  }
  // Its own state directory (a [registry] table in the config replaces the fixture's).
  const std::filesystem::path state = TempDir() / "calibrating-registry.state";
  std::filesystem::remove_all(state);
  DaemonProcess d("[registry]\nstate_dir = \"" + state.string() +
                  "\"\ntarget_ppl_increase = 0.03\nspeed_check = false\n");
  const HttpResponse created = Http(
      d.port(), "POST", "/admin/models",
      Post(
          {{"path", model}, {"name", "s"}, {"corpus", ProfileCorpus()}, {"profile_tokens", 2048}}));
  INFO(created.body);
  REQUIRE(created.status == 201);
  const std::vector<nlohmann::json> events = WatchEvents(d.port(), "s");
  REQUIRE(!events.empty());
  const nlohmann::json& last = events.back();
  INFO(last.dump() << "\nlog:\n" << d.Log());
  REQUIRE(last["state"] == "ready");
  CHECK(last["mode"] == "sparse");
  auto sidecar = offline::ReadSidecar(last["sidecar_path"].get<std::string>());
  REQUIRE(sidecar.ok());
  const offline::SidecarCalibration& c = sidecar->calibration;
  REQUIRE(c.present);
  CHECK(c.held_out);  // the corpus's part the profile did not read
  CHECK(c.max_ppl_increase == static_cast<float>(0.03));
  REQUIRE(c.gate_first);
  CHECK(c.gate_first_sparsity > 0);
  CHECK(c.gate_first_ppl <= c.dense_ppl * 1.03 * (1 + 1e-6));
  CHECK(d.Log().find("job 's': gate-first at sparsity") != std::string::npos);
  REQUIRE(c.input_sparse);
  CHECK(d.Log().find("job 's': input-sparse at sparsity") != std::string::npos);
  // Served at the calibrated level: a completion works and the text is the model's.
  CHECK(!GreedyText(d.port(), "s", "Once upon a time").empty());

  // A registration's own target wins over the daemon's; out of range is refused.
  const HttpResponse own = Http(d.port(), "POST", "/admin/models",
                                Post({{"path", model},
                                      {"name", "s2"},
                                      {"corpus", ProfileCorpus()},
                                      {"profile_tokens", 2048},
                                      {"target_ppl_increase", 0.06}}));
  INFO(own.body);
  REQUIRE(own.status == 201);
  const std::vector<nlohmann::json> events2 = WatchEvents(d.port(), "s2");
  REQUIRE(!events2.empty());
  REQUIRE(events2.back()["state"] == "ready");
  auto sidecar2 = offline::ReadSidecar(events2.back()["sidecar_path"].get<std::string>());
  REQUIRE(sidecar2.ok());
  CHECK(sidecar2->calibration.max_ppl_increase == static_cast<float>(0.06));
  // A looser target allows at least the sparsity of the tighter one.
  CHECK(sidecar2->calibration.gate_first_sparsity >= c.gate_first_sparsity);
  for (const nlohmann::json& bad :
       {nlohmann::json(-0.01), nlohmann::json(10), nlohmann::json("x")}) {
    const HttpResponse r =
        Http(d.port(), "POST", "/admin/models",
             Post({{"path", model}, {"name", "s3"}, {"target_ppl_increase", bad}}));
    INFO(r.body);
    CHECK(r.status == 400);
    CHECK(r.body.find("target_ppl_increase") != std::string::npos);
  }
}

TEST_CASE("registered models survive a restart", "[registry][admin]") {
  if (!HaveReluModel()) THERMOCLINE_SKIP("no relu-tiny model or corpus");
  const std::string state = (TempDir() / "restart.state").string();
  std::filesystem::remove_all(state);
  const std::string toml = "[registry]\nstate_dir = \"" + state + "\"\nspeed_check = false\n";
  nlohmann::json before;
  {
    DaemonProcess d(toml);
    REQUIRE(Http(d.port(), "POST", "/admin/models", Post(ReluRegistration("relu"))).status == 201);
    before = WatchEvents(d.port(), "relu").back();
    INFO(before.dump());
    REQUIRE(before["state"] == "ready");
    CHECK(d.Stop() == 0);
  }
  DaemonProcess d(toml);
  const nlohmann::json after = Json(Http(d.port(), "GET", "/admin/models/relu").body);
  CHECK(after["state"] == "ready");
  CHECK(after["sidecar_path"] == before["sidecar_path"]);
  CHECK(after["placement"] == before["placement"]);
  CHECK(after["report"] == before["report"]);
  CHECK(after["created_at"] == before["created_at"]);
  CHECK(after["loaded"] == false);  // lazily, on the first request
  CHECK(after["mode"] == "sparse");
  CHECK(!GreedyText(d.port(), "relu", "Once upon a time").empty());
  CHECK(Json(Http(d.port(), "GET", "/admin/models/relu").body)["loaded"] == true);
  CHECK(Json(Http(d.port(), "GET", "/v1/models/relu").body)["mode"] == "sparse");
}

TEST_CASE("kill -9 in the middle of a job: the job resumes after its last finished stage",
          "[registry][admin]") {
  if (!HaveReluModel()) THERMOCLINE_SKIP("no relu-tiny model or corpus");
  const std::string state = (TempDir() / "kill9.state").string();
  std::filesystem::remove_all(state);
  const std::string registry = "[registry]\nstate_dir = \"" + state + "\"\nspeed_check = false\n";
  {
    // Stages pause 4 s: the kill lands after the profile, before the solve ends.
    DaemonProcess d(registry + "[debug]\njob_stage_delay_ms = 4000\n");
    REQUIRE(Http(d.port(), "POST", "/admin/models", Post(ReluRegistration("relu"))).status == 201);
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(90);
    std::string stage;
    while (stage != "solve" && std::chrono::steady_clock::now() < end) {
      stage = Json(Http(d.port(), "GET", "/admin/models/relu").body)["stage"];
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    REQUIRE(stage == "solve");
    d.Signal(SIGKILL);
    d.Wait();
  }
  DaemonProcess d(registry);
  const std::vector<nlohmann::json> events = WatchEvents(d.port(), "relu");
  REQUIRE(!events.empty());
  INFO(events.back().dump() << "\nlog:\n" << d.Log());
  CHECK(events.back()["state"] == "ready");
  for (const auto& e : events) CHECK(e["stage"] != "profile");  // not profiled again
  CHECK(d.Log().find("resuming after the profile") != std::string::npos);
  CHECK(!GreedyText(d.port(), "relu", "The cat").empty());
}

TEST_CASE("delete, duplicate names, cancel", "[registry][admin]") {
  if (!HaveReluModel()) THERMOCLINE_SKIP("no relu-tiny model or corpus");
  DaemonProcess d("[debug]\njob_stage_delay_ms = 2000\n");
  REQUIRE(Http(d.port(), "POST", "/admin/models", Post(ReluRegistration("relu"))).status == 201);
  // Duplicate names: a registered one and a configured one.
  for (const char* name : {"relu", kModelName}) {
    const HttpResponse dup = Http(d.port(), "POST", "/admin/models", Post(ReluRegistration(name)));
    CHECK(dup.status == 409);
    CHECK(Json(dup.body)["error"]["code"] == "already_exists");
  }
  // Served dense while its job runs, not refused.
  CHECK(Json(Http(d.port(), "GET", "/admin/models/relu").body)["state"] != "ready");
  CHECK(!GreedyText(d.port(), "relu", "The cat").empty());
  // Cancel: the job stops, the model stays usable dense.
  const HttpResponse cancelled = Http(d.port(), "POST", "/admin/models/relu/cancel");
  CHECK(cancelled.status == 200);
  const nlohmann::json last = WatchEvents(d.port(), "relu").back();
  CHECK(last["state"] == "failed");
  CHECK(last["last_error"].get<std::string>().find("cancelled") != std::string::npos);
  CHECK(last["mode"] == "dense");
  CHECK(!GreedyText(d.port(), "relu", "Once upon a time").empty());
  CHECK(Http(d.port(), "POST", "/admin/models/relu/cancel").status == 400);  // nothing to cancel

  const HttpResponse deleted = Http(d.port(), "DELETE", "/admin/models/relu");
  CHECK(deleted.status == 200);
  CHECK(Json(deleted.body) == nlohmann::json{{"name", "relu"}, {"deleted", true}});
  CHECK(Http(d.port(), "GET", "/admin/models/relu").status == 404);
  CHECK(Http(d.port(), "DELETE", "/admin/models/relu").status == 404);
  CHECK(Http(d.port(), "GET", "/v1/models/relu").status == 404);
  CHECK(Json(Http(d.port(), "GET", "/admin/models").body)["models"].empty());
  // The name is free again.
  CHECK(Http(d.port(), "POST", "/admin/models", Post(ReluRegistration("relu"))).status == 201);
  CHECK(Http(d.port(), "DELETE", "/admin/models/relu").status == 200);
}

TEST_CASE("a missing or corrupt model file: the job fails with the reason", "[registry][admin]") {
  REQUIRE_STORIES_MODEL();
  const std::string corrupt = (TempDir() / "corrupt.gguf").string();
  {
    std::ofstream f(corrupt, std::ios::binary);
    f << "GGUF this is not a model file at all";
  }
  // The scratch folder is one the daemon may read models from.
  DaemonProcess d("[registry]\nstate_dir = \"" + (TempDir() / "missing-corrupt.state").string() +
                  "\"\nallowed_paths = [\"" + TempDir().string() + "\"]\n");
  REQUIRE(
      Http(d.port(), "POST", "/admin/models",
           Post({{"path", (TempDir() / "nonexistent/model.gguf").string()}, {"name", "missing"}}))
          .status == 201);
  REQUIRE(Http(d.port(), "POST", "/admin/models", Post({{"path", corrupt}, {"name", "corrupt"}}))
              .status == 201);
  const nlohmann::json missing = WatchEvents(d.port(), "missing").back();
  CHECK(missing["state"] == "failed");
  CHECK(missing["last_error"].get<std::string>().find("does not exist") != std::string::npos);
  const nlohmann::json bad = WatchEvents(d.port(), "corrupt").back();
  CHECK(bad["state"] == "failed");
  CHECK(bad["last_error"].get<std::string>().find(corrupt) != std::string::npos);
  // Requests to it say why; the daemon's other models are unaffected.
  const HttpResponse r = Http(d.port(), "POST", "/v1/completions",
                              Post({{"model", "corrupt"}, {"prompt", "Hi"}, {"max_tokens", 4}}));
  CHECK(r.status == 503);
  CHECK(!GreedyText(d.port(), kModelName, "Once upon a time").empty());
}

}  // namespace
}  // namespace thermocline::testing
