// The admin API and the registry under hostile requests and damaged state: registration confined
// to the allowed folders (no file oracle), FIFOs and NUL bytes refused, storage failures answered
// 503 registry_unavailable, and a registry database that was emptied, hand-edited or corrupted.
#include <sched.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <map>
#include <thread>

#include "daemon_fixture.h"
#include "http_client.h"
#include "registry_test_util.h"
#include "server/errors.h"
#include "server/registry_store.h"

namespace thermocline::testing {
namespace {

namespace fs = std::filesystem;

std::string ErrorCode(const HttpResponse& r) {
  const nlohmann::json j = nlohmann::json::parse(r.body, nullptr, false);
  return j.is_discarded() || !j.contains("error") ? "" : j["error"]["code"].get<std::string>();
}
std::string ErrorMessage(const HttpResponse& r) {
  const nlohmann::json j = nlohmann::json::parse(r.body, nullptr, false);
  return j.is_discarded() || !j.contains("error") ? "" : j["error"]["message"].get<std::string>();
}

std::string StateToml(const fs::path& state) {
  return "[registry]\nstate_dir = \"" + state.string() + "\"\n";
}

TEST_CASE("admin: registration is confined to the allowed folders", "[admin][hostile]") {
  REQUIRE_STORIES_MODEL();
  const fs::path state = TempDir() / "confined.state";
  fs::create_directories(state);
  fs::create_symlink("/etc/passwd", state / "link.gguf");
  DaemonProcess d(StateToml(state));
  const HttpResponse passwd =
      Http(d.port(), "POST", "/admin/models", Post({{"path", "/etc/passwd"}, {"name", "p"}}));
  INFO(passwd.body);
  CHECK(passwd.status == 403);
  CHECK(ErrorCode(passwd) == "path_not_allowed");
  // A file that does not exist gets the same words: no oracle of what is there.
  const HttpResponse missing =
      Http(d.port(), "POST", "/admin/models", Post({{"path", "/no/such/file"}, {"name", "p"}}));
  CHECK(missing.status == 403);
  CHECK(ErrorMessage(missing) == ErrorMessage(passwd));
  // A link inside an allowed folder to a file outside: outside.
  CHECK(Http(d.port(), "POST", "/admin/models",
             Post({{"path", (state / "link.gguf").string()}, {"name", "l"}}))
            .status == 403);
  // The corpus too.
  const HttpResponse corpus =
      Http(d.port(), "POST", "/admin/models",
           Post({{"path", StoriesModel()}, {"name", "c"}, {"corpus", "/etc/shadow"}}));
  CHECK(corpus.status == 403);
  CHECK(ErrorCode(corpus) == "path_not_allowed");
  CHECK(Json(Http(d.port(), "GET", "/admin/models").body)["models"].empty());
}

TEST_CASE("admin: a FIFO or a path with a NUL byte is refused", "[admin][hostile]") {
  REQUIRE_STORIES_MODEL();
  const fs::path state = TempDir() / "fifo.state";
  fs::create_directories(state);
  REQUIRE(::mkfifo((state / "fifo.gguf").c_str(), 0644) == 0);
  DaemonProcess d(StateToml(state));
  const HttpResponse fifo = Http(d.port(), "POST", "/admin/models",
                                 Post({{"path", (state / "fifo.gguf").string()}, {"name", "f"}}));
  INFO(fifo.body);
  CHECK(fifo.status == 400);
  CHECK(ErrorMessage(fifo).find("not a regular file") != std::string::npos);
  // "stories260K.gguf\0anything": C APIs would open the file before the NUL.
  const HttpResponse nul =
      Http(d.port(), "POST", "/admin/models",
           Post({{"path", StoriesModel() + std::string(1, '\0') + "x"}, {"name", "n"}}));
  CHECK(nul.status == 400);
  CHECK(ErrorCode(nul) == "invalid_value");
  CHECK(Http(d.port(), "GET", "/admin/models").status == 200);
}

TEST_CASE("admin: a full disk is 503 registry_unavailable, never 500", "[admin][hostile]") {
  REQUIRE_STORIES_MODEL();
  // Every file the daemon writes stops growing at 192 KiB: the registry's WAL fills up after a
  // few dozen registrations.
  DaemonProcess d("", true, 192 << 10);
  int unavailable = 0;
  for (int i = 0; i < 400 && unavailable == 0; ++i) {
    const HttpResponse r =
        Http(d.port(), "POST", "/admin/models",
             Post({{"path", TestModelPath("missing-" + std::to_string(i) + ".gguf")},
                   {"name", "m" + std::to_string(i)}}));
    INFO(r.body);
    REQUIRE(r.status != 500);
    if (r.status == 503) {
      ++unavailable;
      CHECK(ErrorCode(r) == "registry_unavailable");
      CHECK(!r.header("retry-after").empty());
    } else {
      REQUIRE(r.status == 201);
    }
  }
  CHECK(unavailable == 1);
  // A delete meets the same full disk.
  const HttpResponse del = Http(d.port(), "DELETE", "/admin/models/m0");
  INFO(del.body);
  CHECK(del.status != 500);
  CHECK(Http(d.port(), "GET", "/health").status == 200);
}

// A delete that cannot be written leaves the model as it was: not "unloading" in memory while
// the database says otherwise. A cancel likewise.
TEST_CASE("admin: a delete or cancel on a full disk changes nothing", "[admin][hostile]") {
  REQUIRE_STORIES_MODEL();
  DaemonProcess d("[debug]\njob_stage_delay_ms = 600000\n", true, 192 << 10);
  std::vector<std::string> names;
  for (int i = 0; i < 400; ++i) {
    const std::string name = "m" + std::to_string(i);
    const HttpResponse r =
        Http(d.port(), "POST", "/admin/models", Post({{"path", StoriesModel()}, {"name", name}}));
    if (r.status != 201) break;
    names.push_back(name);
  }
  REQUIRE(names.size() >= 2);
  const std::string last = names.back();  // queued behind m0's job, which sleeps in its stage
  const nlohmann::json before = Json(Http(d.port(), "GET", "/admin/models/m0").body);
  const HttpResponse del = Http(d.port(), "DELETE", "/admin/models/m0");
  INFO(del.body);
  REQUIRE(del.status == 503);
  CHECK(ErrorCode(del) == "registry_unavailable");
  const nlohmann::json after = Json(Http(d.port(), "GET", "/admin/models/m0").body);
  CHECK(after["state"] == before["state"]);
  CHECK(after["state"] != "unloading");
  const nlohmann::json queued = Json(Http(d.port(), "GET", "/admin/models/" + last).body);
  const HttpResponse cancel = Http(d.port(), "POST", "/admin/models/" + last + "/cancel");
  INFO(cancel.body);
  CHECK(cancel.status == 503);
  CHECK(Json(Http(d.port(), "GET", "/admin/models/" + last).body)["state"] == queued["state"]);
  CHECK(Json(Http(d.port(), "GET", "/admin/models").body)["models"].size() == names.size());
}

// A job's progress written to a full disk: the job stops, the model is reported failed saying
// its state could not be stored, and memory keeps what the database holds (its last stored
// stage), from which the next start runs the job again. A job that cannot store its start does
// not run.
TEST_CASE("admin: a job whose state cannot be stored stops and says so", "[admin][hostile]") {
  REQUIRE_STORIES_MODEL();
  const fs::path state = TempDir() / "job-store.state";
  fs::remove_all(state);
  fs::create_directories(state);
  std::ofstream(state / "hardware.toml") << "[cpu]\nbandwidth_gbps = 10\n";  // nothing measured
  std::vector<std::string> names;
  std::string stage;  // the job's stage as the API reported it
  {
    // The job sleeps 4 s after each stage; meanwhile the registrations below fill the disk.
    DaemonProcess d(StateToml(state) + "[debug]\njob_stage_delay_ms = 4000\n", true, 192 << 10);
    REQUIRE(
        Http(d.port(), "POST", "/admin/models", Post({{"path", StoriesModel()}, {"name", "job"}}))
            .status == 201);
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    nlohmann::json job;
    do {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      job = Json(Http(d.port(), "GET", "/admin/models/job").body);
    } while (job["stage"] != "load" && std::chrono::steady_clock::now() < end);
    REQUIRE(job["stage"] == "load");
    REQUIRE(job["state"] == "profiling");
    bool full = false;
    for (int i = 0; i < 400 && !full; ++i) {
      const std::string name = "f" + std::to_string(i);
      const HttpResponse r =
          Http(d.port(), "POST", "/admin/models",
               Post({{"path", TestModelPath("missing-" + std::to_string(i) + ".gguf")},
                     {"name", name}}));
      full = r.status == 503;
      if (r.status == 201) names.push_back(name);
    }
    REQUIRE(full);
    REQUIRE(!names.empty());
    // Still running (a job of 4 stages sleeps 16 s): its next stage's write meets the full disk.
    REQUIRE(Json(Http(d.port(), "GET", "/admin/models/job").body)["state"] == "profiling");
    const nlohmann::json ended = WatchEvents(d.port(), "job").back();
    INFO(ended.dump());
    CHECK(ended["state"] == "failed");
    const std::string error = ended["last_error"];
    CHECK(error.find("the job stopped: its stage could not be stored") != std::string::npos);
    CHECK(error.find("registry_unavailable") == std::string::npos);  // words, not codes
    CHECK(error.find("runs again at the next start") != std::string::npos);
    stage = ended["stage"];  // checked against the database below
    // The job queued behind it cannot store its start: it does not run, and says so.
    nlohmann::json next;
    const auto next_end = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    do {
      next = Json(Http(d.port(), "GET", "/admin/models/" + names.front()).body);
      if (next["state"] == "failed") break;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    } while (std::chrono::steady_clock::now() < next_end);
    INFO(next.dump());
    CHECK(next["state"] == "failed");
    CHECK(next["last_error"].get<std::string>().find("its start could not be stored") !=
          std::string::npos);
    CHECK(Http(d.port(), "GET", "/health").status == 200);
  }
  // The database says what memory said, under the failure: the stage it stored last.
  {
    auto store = server::RegistryStore::Open(state.string());
    REQUIRE(store.ok());
    auto rows = (*store)->LoadAll();
    REQUIRE(rows.ok());
    std::map<std::string, server::ModelRecord> by_name;
    for (const server::ModelRecord& r : *rows) by_name[r.name] = r;
    REQUIRE(by_name.contains("job"));
    CHECK(by_name["job"].state == server::ModelState::kProfiling);
    CHECK(by_name["job"].stage == stage);
    REQUIRE(by_name.contains(names.front()));
    CHECK(by_name[names.front()].state == server::ModelState::kRegistered);
  }
  // With room again, the next start runs the job again.
  DaemonProcess d(StateToml(state) + "[debug]\njob_stage_delay_ms = 600000\n");
  CHECK(d.Log().find("model 'job': its job was interrupted (state profiling, stage '" + stage +
                     "')") != std::string::npos);
}

TEST_CASE("registry: a read-only state directory is 503 registry_unavailable", "[admin][hostile]") {
  const fs::path state = TempDir() / "readonly.state";
  {
    auto store = server::RegistryStore::Open(state.string());
    REQUIRE(store.ok());
  }
  // In a child with a mount namespace of its own, the state directory is bound read-only (root
  // ignores file permissions, so chmod would not do): a write must fail as unavailable storage.
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    if (::unshare(CLONE_NEWNS) != 0 ||
        ::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) ||
        ::mount(state.c_str(), state.c_str(), nullptr, MS_BIND, nullptr) != 0 ||
        ::mount(nullptr, state.c_str(), nullptr, MS_BIND | MS_REMOUNT | MS_RDONLY, nullptr) != 0) {
      ::_exit(77);
    }
    auto store = server::RegistryStore::Open(state.string());
    absl::Status s = store.ok() ? [&] {
      server::ModelRecord r;
      r.name = "x";
      r.path = "/x.gguf";
      return (*store)->Insert(r);
    }()
                                : store.status();
    const server::ApiError e = server::ToApiError(s);
    ::_exit(e.http_status == 503 && e.code == "registry_unavailable" ? 0 : 1);
  }
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  REQUIRE(WIFEXITED(status));
  if (WEXITSTATUS(status) == 77) THERMOCLINE_SKIP("no mount namespaces here (needs root)");
  CHECK(WEXITSTATUS(status) == 0);
}

TEST_CASE("registry: an empty registry.db is kept aside, loudly", "[admin][hostile]") {
  REQUIRE_STORIES_MODEL();
  const fs::path state = TempDir() / "empty-db.state";
  fs::create_directories(state);
  std::ofstream(state / "registry.db").close();
  DaemonProcess d(StateToml(state));
  bool kept = false;
  for (const auto& e : fs::directory_iterator(state)) {
    kept |= e.path().filename().string().rfind("registry.db.empty-", 0) == 0;
  }
  CHECK(kept);
  CHECK(d.Log().find("was empty (0 bytes)") != std::string::npos);
  CHECK(Http(d.port(), "GET", "/admin/models").status == 200);
}

TEST_CASE("registry: row names are checked again at start-up", "[admin][hostile]") {
  REQUIRE_STORIES_MODEL();
  const fs::path root = TempDir() / "rowname";
  const fs::path state = root / "state";
  // What start-up removes for a row named N in state "unloading": state/models/N.
  const fs::path victim = root / "victim";
  fs::create_directories(victim);
  fs::create_directories(state / "models");  // as after any job
  std::ofstream(victim / "keep.txt") << "x";
  {
    auto store = server::RegistryStore::Open(state.string());
    REQUIRE(store.ok());
    server::ModelRecord r;
    r.name = "../../victim";
    r.path = "/nowhere.gguf";
    r.state = server::ModelState::kUnloading;
    REQUIRE((*store)->Insert(r).ok());
  }
  DaemonProcess d(StateToml(state));
  CHECK(fs::exists(victim / "keep.txt"));
  CHECK(Json(Http(d.port(), "GET", "/admin/models").body)["models"].empty());
}

TEST_CASE("registry: a corrupt placement_json keeps GET /admin/models valid JSON",
          "[admin][hostile]") {
  REQUIRE_STORIES_MODEL();
  const fs::path state = TempDir() / "corrupt-json.state";
  {
    auto store = server::RegistryStore::Open(state.string());
    REQUIRE(store.ok());
    server::ModelRecord r;
    r.name = "c";
    r.path = TestModelPath("missing-corrupt.gguf");
    r.state = server::ModelState::kFailed;
    r.placement_json = "{\"gpu_neurons\": 12,";
    r.report_json = "not json";
    REQUIRE((*store)->Insert(r).ok());
  }
  DaemonProcess d(StateToml(state));
  const HttpResponse r = Http(d.port(), "GET", "/admin/models");
  const nlohmann::json list = Json(r.body);
  REQUIRE(list["models"].size() == 1);
  CHECK(list["models"][0]["placement"].is_null());
  CHECK(list["models"][0]["report"].is_null());
  CHECK(Json(Http(d.port(), "GET", "/admin/models/c").body)["name"] == "c");
}

}  // namespace
}  // namespace thermocline::testing
