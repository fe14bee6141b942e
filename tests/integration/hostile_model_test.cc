// Model files under attack while the daemon serves them: a FIFO in a model's place (it must
// block nothing), a file truncated or rewritten under its mapping (no SIGBUS, no silent new
// weights: the model fails with why, the others keep serving), and files that load but cannot
// serve: a context of millions of positions, NaN weights, a corrupt sidecar.
#include <sys/stat.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <limits>
#include <thread>

#include "daemon_fixture.h"
#include "engine/gguf/gguf.h"
#include "http_client.h"
#include "registry_test_util.h"

namespace thermocline::testing {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

std::string StateToml(const fs::path& state) {
  return "[registry]\nstate_dir = \"" + state.string() + "\"\n";
}

std::string ModelToml(const fs::path& path, const std::string& name) {
  return "[[models]]\npath = \"" + path.string() + "\"\nname = \"" + name + "\"\n";
}

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

std::string Completion(const std::string& model, int max_tokens) {
  return Post({{"model", model}, {"prompt", "Once"}, {"max_tokens", max_tokens}});
}

// stories260K rewritten: `edit` may change metadata and the bytes of any tensor.
using Edit = std::function<void(GgufWriter&, const GgufTensorInfo&, std::vector<uint8_t>&)>;
std::string RewrittenStories(const std::string& name, const Edit& edit) {
  auto file = GgufFile::Open(StoriesModel());
  REQUIRE(file.ok());
  GgufWriter w;
  for (const GgufKeyValue& kv : (*file)->metadata()) w.Set(kv.key, kv.value);
  for (const GgufTensorInfo& t : (*file)->tensors()) {
    std::vector<uint8_t> bytes(t.data, t.data + t.size_bytes);
    edit(w, t, bytes);
    REQUIRE(w.AddTensorCopy(t.name, t.type, t.dims, std::move(bytes)).ok());
  }
  const fs::path dir = TempDir() / "hostile-models";
  fs::create_directories(dir);
  const std::string path = (dir / name).string();
  REQUIRE(w.Write(path).ok());
  return path;
}

// Item 3: a registered model file replaced by a FIFO must not block the serving path (open()
// of a FIFO blocks until a writer comes) nor, through the registry's load lock, the admin API,
// other models' loads, a delete and the shutdown.
TEST_CASE("a model file replaced by a FIFO blocks nothing", "[hostile][admin]") {
  REQUIRE_STORIES_MODEL();
  const fs::path state = TempDir() / "hostile-fifo.state";
  fs::remove_all(state);
  fs::create_directories(state);
  const fs::path model = state / "swapped.gguf";
  const fs::path other = state / "other.gguf";
  fs::copy_file(StoriesModel(), model);
  fs::copy_file(StoriesModel(), other);
  DaemonProcess d(StateToml(state));
  for (const auto& [path, name] : {std::pair{model, "swapped"}, std::pair{other, "other"}}) {
    REQUIRE(Http(d.port(), "POST", "/admin/models", Post({{"path", path.string()}, {"name", name}}))
                .status == 201);
  }
  fs::remove(model);
  REQUIRE(::mkfifo(model.c_str(), 0644) == 0);
  auto gen = std::async(std::launch::async, [&] {
    HttpConnection c(d.port(), 10000);
    c.Send("POST", "/v1/completions", Completion("swapped", 4));
    return c.ReadResponse();
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  auto start = Clock::now();
  CHECK(Http(d.port(), "GET", "/admin/models").status == 200);
  CHECK(SecondsSince(start) < 1.0);
  REQUIRE(gen.wait_for(std::chrono::seconds(5)) == std::future_status::ready);
  const HttpResponse refused = gen.get();
  INFO(refused.body);
  CHECK(refused.status == 503);  // an error naming the file, not a hang
  CHECK(refused.body.find("not a regular file") != std::string::npos);
  // Another registered model still loads (its first request), a delete still goes through.
  start = Clock::now();
  CHECK(Http(d.port(), "POST", "/v1/completions", Completion("other", 4)).status == 200);
  CHECK(Http(d.port(), "DELETE", "/admin/models/swapped").status == 200);
  CHECK(SecondsSince(start) < 10.0);
  CHECK(d.Stop(SIGTERM, 15) == 0);
}

// Item 3, the lock: a model whose load is slow (a slow disk, a huge file: here the debug delay
// before its file is opened) holds no lock that the admin API, other models' loads or deletes
// need; deleted while it loads, it is dropped and its request answered.
TEST_CASE("a slow model load blocks no other request", "[hostile][admin]") {
  REQUIRE_STORIES_MODEL();
  const fs::path state = TempDir() / "hostile-slow-load.state";
  fs::remove_all(state);
  fs::create_directories(state);
  // The registrations' jobs stay in their first stage (their results would change what is in
  // memory), and measure no hardware meanwhile.
  std::ofstream(state / "hardware.toml") << "[cpu]\nbandwidth_gbps = 10\n";
  DaemonProcess d(StateToml(state) +
                  "[debug]\njob_stage_delay_ms = 600000\nload_delay_ms = 6000\n"
                  "load_delay_model = \"slow\"\n");
  for (const char* name : {"slow", "other", "gone"}) {
    REQUIRE(
        Http(d.port(), "POST", "/admin/models", Post({{"path", StoriesModel()}, {"name", name}}))
            .status == 201);
  }
  REQUIRE(Http(d.port(), "POST", "/v1/completions", Completion("gone", 2)).status == 200);
  const auto held = Clock::now();
  auto slow = std::async(std::launch::async, [&] {
    HttpConnection c(d.port(), 20000);
    c.Send("POST", "/v1/completions", Completion("slow", 2));
    return c.ReadResponse();
  });
  for (const auto end = Clock::now() + std::chrono::seconds(5);
       Json(Http(d.port(), "GET", "/v1/models/slow").body)["status"] != "loading";) {
    REQUIRE(Clock::now() < end);  // its load has begun
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  // Each on its own takes milliseconds; the slow load holds for 6 s.
  auto start = Clock::now();
  CHECK(Http(d.port(), "GET", "/admin/models").status == 200);
  CHECK(Http(d.port(), "GET", "/v1/models").status == 200);
  CHECK(SecondsSince(start) < 2.0);
  start = Clock::now();
  CHECK(Http(d.port(), "DELETE", "/admin/models/gone").status == 200);
  CHECK(SecondsSince(start) < 2.0);
  start = Clock::now();
  CHECK(Http(d.port(), "POST", "/v1/completions", Completion("other", 2)).status == 200);
  CHECK(SecondsSince(start) < 2.0);
  // Deleted while it loads: the request ends with the model gone, the load is dropped.
  start = Clock::now();
  CHECK(Http(d.port(), "DELETE", "/admin/models/slow").status == 200);
  CHECK(SecondsSince(start) < 2.0);
  CHECK(SecondsSince(held) < 6.0);  // all of the above while the load was held
  REQUIRE(slow.wait_for(std::chrono::seconds(15)) == std::future_status::ready);
  const HttpResponse dropped = slow.get();
  INFO(dropped.body);
  CHECK(dropped.status == 404);
  // In memory: the configured model and "other"; nothing of "slow" or "gone".
  const std::string metrics = Http(d.port(), "GET", "/metrics").body;
  INFO(metrics);
  CHECK(MetricValue(metrics, "thermocline_models_loaded") == 2);
  CHECK(MetricValue(metrics, "thermocline_model_memory_bytes") ==
        2 * static_cast<double>(fs::file_size(StoriesModel())));
  CHECK(d.Log().find("model 'slow': its load was dropped (deleted meanwhile)") !=
        std::string::npos);
}

// A configured model loaded from a file that a FIFO then replaces: taken out of service at the
// next request, and its reload refuses the FIFO without opening it.
TEST_CASE("a served model whose file becomes a FIFO fails, and only it", "[hostile][server]") {
  REQUIRE_STORIES_MODEL();
  const fs::path dir = TempDir() / "hostile-fifo-served";
  fs::remove_all(dir);
  fs::create_directories(dir);
  const fs::path model = dir / "m.gguf";
  fs::copy_file(StoriesModel(), model);
  DaemonProcess d(ModelToml(model, "m"));
  REQUIRE(Http(d.port(), "POST", "/v1/completions", Completion("m", 2)).status == 200);
  fs::remove(model);
  REQUIRE(::mkfifo(model.c_str(), 0644) == 0);
  for (int i = 0; i < 2; ++i) {  // the check of the loaded file, then the reload
    const auto start = Clock::now();
    const HttpResponse r = Http(d.port(), "POST", "/v1/completions", Completion("m", 2));
    INFO(r.body);
    CHECK(r.status == 503);
    CHECK(SecondsSince(start) < 2.0);
  }
  const nlohmann::json m = Json(Http(d.port(), "GET", "/v1/models/m").body);
  CHECK(m["status"] == "failed");
  CHECK(!m["error"].get<std::string>().empty());
  CHECK(Http(d.port(), "POST", "/v1/completions", Completion(kModelName, 2)).status == 200);
  CHECK(d.Stop(SIGTERM, 15) == 0);
}

// Item 4: truncating a model file that is being served must not kill the daemon (SIGBUS on the
// mapping); the model is unloaded with an error, the other models keep serving. A rewrite of
// the same size is noticed too, and never served.
TEST_CASE("a served model file truncated is an error, not SIGBUS", "[hostile][server]") {
  REQUIRE_STORIES_MODEL();
  const fs::path dir = TempDir() / "hostile-truncate";
  fs::remove_all(dir);
  fs::create_directories(dir);
  const fs::path copy = dir / "copy.gguf";
  fs::copy_file(StoriesModel(), copy);
  DaemonProcess d(ModelToml(copy, "copy"));
  const std::string body = Completion("copy", 8);
  REQUIRE(Http(d.port(), "POST", "/v1/completions", body).status == 200);
  fs::resize_file(copy, 4096);
  const HttpResponse r = Http(d.port(), "POST", "/v1/completions", body);
  INFO(r.body);
  CHECK(r.status == 503);
  CHECK(Json(r.body)["error"]["code"] == "model_failed");
  CHECK(r.body.find("truncated") != std::string::npos);
  CHECK(Http(d.port(), "GET", "/health").status == 200);  // alive
  CHECK(Http(d.port(), "POST", "/v1/completions", Completion(kModelName, 4)).status == 200);
  const nlohmann::json failed = Json(Http(d.port(), "GET", "/v1/models/copy").body);
  CHECK(failed["status"] == "failed");
  CHECK(failed["loaded"] == false);
  // Restored to the original size with other bytes: still refused (a reload would serve
  // weights nobody registered).
  fs::copy_file(StoriesModel(), copy, fs::copy_options::overwrite_existing);
  {
    std::fstream f(copy, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(fs::file_size(copy) / 2));
    f.write("\x7f\x7f\x7f\x7f", 4);
  }
  const HttpResponse again = Http(d.port(), "POST", "/v1/completions", body);
  INFO(again.body);
  CHECK(again.status == 503);
  CHECK(again.body.find("changed since it was first loaded") != std::string::npos);
  const HttpResponse changed = Http(d.port(), "GET", "/v1/models/copy");
  INFO(changed.body);
  CHECK(Json(changed.body)["status"] != "ready");
}

TEST_CASE("a served model file rewritten in place is noticed, never served", "[hostile][server]") {
  REQUIRE_STORIES_MODEL();
  const fs::path dir = TempDir() / "hostile-rewrite";
  fs::remove_all(dir);
  fs::create_directories(dir);
  const fs::path copy = dir / "copy.gguf";
  fs::copy_file(StoriesModel(), copy);
  DaemonProcess d(ModelToml(copy, "copy"));
  REQUIRE(Http(d.port(), "POST", "/v1/completions", Completion("copy", 4)).status == 200);
  // The same size, four bytes of the weights changed (what a mapped file shows at once).
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // a later modification time
  {
    std::fstream f(copy, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(fs::file_size(copy) / 2));
    f.write("\x7f\x7f\x7f\x7f", 4);
  }
  // Noticed by the model list alone, before any request computes on it.
  const nlohmann::json m = Json(Http(d.port(), "GET", "/v1/models/copy").body);
  INFO(m.dump());
  CHECK(m["status"] == "failed");
  CHECK(m["error"].get<std::string>().find("modified") != std::string::npos);
  CHECK(Http(d.port(), "POST", "/v1/completions", Completion("copy", 4)).status == 503);
  CHECK(Http(d.port(), "POST", "/v1/completions", Completion(kModelName, 4)).status == 200);
}

// The SIGBUS itself: a file truncated while a request computes on it. The request fails, the
// daemon and the other model live on.
TEST_CASE("a model file truncated during a request fails that request only", "[hostile][server]") {
  REQUIRE_STORIES_MODEL();
  const fs::path dir = TempDir() / "hostile-sigbus";
  fs::remove_all(dir);
  fs::create_directories(dir);
  const fs::path copy = dir / "copy.gguf";
  fs::copy_file(StoriesModel(), copy);
  DaemonProcess d(ModelToml(copy, "copy") + "\n[debug]\ndecode_delay_ms = 30\n");
  HttpConnection c(d.port(), 20000);
  c.Send("POST", "/v1/completions",
         Post({{"model", "copy"},
               {"prompt", "Once"},
               {"max_tokens", 200},
               {"ignore_eos", true},
               {"stream", true}}));
  const HttpResponse head = c.ReadHead();
  REQUIRE(head.status == 200);
  std::string chunk;
  REQUIRE(c.ReadChunk(&chunk));  // tokens flow
  fs::resize_file(copy, 4096);   // every weight page past 4 KiB is gone from the mapping
  std::string rest;
  try {
    while (c.ReadChunk(&chunk)) rest += chunk;
  } catch (const std::exception&) {
    // the connection may end without the final chunk; the daemon must live on regardless
  }
  INFO(rest);
  CHECK(rest.find("error") != std::string::npos);
  CHECK(rest.find("[DONE]") == std::string::npos);  // not the end of a normal stream
  CHECK(Http(d.port(), "GET", "/health").status == 200);
  CHECK(Http(d.port(), "POST", "/v1/completions", Completion(kModelName, 4)).status == 200);
  CHECK(Http(d.port(), "POST", "/v1/completions", Completion("copy", 4)).status == 503);
  CHECK(Json(Http(d.port(), "GET", "/v1/models/copy").body)["status"] == "failed");
  CHECK(d.Stop(SIGTERM, 15) == 0);
}

// A file that claims 16M positions: served at scheduler.max_context, not a 500 per request.
TEST_CASE("a model claiming a 16M context is capped at load", "[hostile][server]") {
  REQUIRE_STORIES_MODEL();
  const std::string path =
      RewrittenStories("ctx16m.gguf", [](GgufWriter& w, const GgufTensorInfo&, auto&) {
        w.SetUint32("llama.context_length", 16u << 20);
      });
  DaemonProcess d(ModelToml(path, "long") + "\n[scheduler]\nmax_context = 1024\n");
  const nlohmann::json m = Json(Http(d.port(), "GET", "/v1/models/long").body);
  CHECK(m["status"] == "ready");
  CHECK(m["context_length"] == 1024);
  const HttpResponse r = Http(d.port(), "POST", "/v1/completions", Completion("long", 4));
  INFO(r.body);
  CHECK(r.status == 200);
  CHECK(d.Log().find("training context of 16777216 positions is served as 1024") !=
        std::string::npos);
}

// NaN weights: refused at load with the tensor named, not `ready` with empty answers.
TEST_CASE("NaN weights fail the load, naming the tensor", "[hostile][server]") {
  REQUIRE_STORIES_MODEL();
  const std::string path = RewrittenStories(
      "nan.gguf", [](GgufWriter&, const GgufTensorInfo& t, std::vector<uint8_t>& bytes) {
        if (t.name != "blk.2.ffn_up.weight") return;
        REQUIRE(t.type == GgmlType::kF32);
        // One value in the middle of the tensor: found by the sampled rows only if it lies in
        // one; put it in the last row, which is always checked.
        const float nan = std::numeric_limits<float>::quiet_NaN();
        std::memcpy(bytes.data() + bytes.size() - 4 * 7, &nan, 4);
      });
  DaemonProcess d(ModelToml(path, "nan"), /*wait_ready=*/false);
  CHECK(d.Wait(30) != 0);  // a configured model that does not load stops the start-up
  const std::string log = d.Log();
  INFO(log);
  CHECK(log.find("blk.2.ffn_up.weight") != std::string::npos);
  CHECK(log.find("NaN") != std::string::npos);
}

TEST_CASE("NaN weights of a registered model: failed with the tensor named", "[hostile][admin]") {
  REQUIRE_STORIES_MODEL();
  const fs::path state = TempDir() / "hostile-nan.state";
  fs::remove_all(state);
  fs::create_directories(state);
  const std::string written = RewrittenStories(
      "inf.gguf", [](GgufWriter&, const GgufTensorInfo& t, std::vector<uint8_t>& bytes) {
        if (t.name != "output_norm.weight") return;
        const float inf = std::numeric_limits<float>::infinity();
        std::memcpy(bytes.data(), &inf, 4);
      });
  const fs::path path = state / "inf.gguf";
  fs::copy_file(written, path);
  DaemonProcess d(StateToml(state));
  REQUIRE(Http(d.port(), "POST", "/admin/models", Post({{"path", path.string()}, {"name", "inf"}}))
              .status == 201);
  const HttpResponse r = Http(d.port(), "POST", "/v1/completions", Completion("inf", 2));
  INFO(r.body);
  CHECK(r.status == 503);
  CHECK(r.body.find("output_norm.weight") != std::string::npos);
  const nlohmann::json m = Json(Http(d.port(), "GET", "/admin/models/inf").body);
  CHECK(m["state"] == "failed");
  CHECK(m["last_error"].get<std::string>().find("output_norm.weight") != std::string::npos);
}

// A sidecar that does not load leaves the model dense, and says so where the user looks.
TEST_CASE("a corrupt sidecar beside a model is reported, not silent", "[hostile][server]") {
  REQUIRE_STORIES_MODEL();
  const fs::path dir = TempDir() / "hostile-sidecar";
  fs::remove_all(dir);
  fs::create_directories(dir);
  const fs::path copy = dir / "copy.gguf";
  fs::copy_file(StoriesModel(), copy);
  std::ofstream(dir / "copy.gguf.thermo.gguf") << "GGUF this is no sidecar";
  DaemonProcess d(ModelToml(copy, "copy"));
  const nlohmann::json m = Json(Http(d.port(), "GET", "/v1/models/copy").body);
  INFO(m.dump());
  CHECK(m["status"] == "ready");
  CHECK(m["mode"] == "dense");
  CHECK(m["warning"].get<std::string>().find("copy.gguf.thermo.gguf") != std::string::npos);
  CHECK(!Json(Http(d.port(), "GET", "/v1/models/stories").body).contains("warning"));
}

TEST_CASE("a registered model's corrupt sidecar shows in the admin API", "[hostile][admin]") {
  if (!HaveReluModel()) THERMOCLINE_SKIP("no relu-tiny model or corpus");
  const fs::path state = TempDir() / "hostile-sidecar.state";
  fs::remove_all(state);
  const std::string toml = StateToml(state);
  std::string sidecar;
  {
    DaemonProcess d(toml);
    REQUIRE(Http(d.port(), "POST", "/admin/models", Post(ReluRegistration("relu"))).status == 201);
    const nlohmann::json ready = WatchEvents(d.port(), "relu").back();
    INFO(ready.dump());
    REQUIRE(ready["state"] == "ready");
    CHECK(ready["warning"].is_null());
    sidecar = ready["sidecar_path"];
    CHECK(d.Stop() == 0);
  }
  // Its header kept, the rest cut: the sidecar no longer loads.
  fs::resize_file(sidecar, 64);
  DaemonProcess d(toml);
  CHECK(Http(d.port(), "POST", "/v1/completions", Completion("relu", 2)).status == 200);
  const nlohmann::json m = Json(Http(d.port(), "GET", "/admin/models/relu").body);
  INFO(m.dump());
  CHECK(m["mode"] == "dense");
  REQUIRE(m["warning"].is_string());
  CHECK(m["warning"].get<std::string>().find("sidecar") != std::string::npos);
}

}  // namespace
}  // namespace thermocline::testing
