// The admin HTTP API's contract without running a job to its end: request validation, error
// shapes and codes, the admin key, listing, and the events stream of a failing job.
#include <catch2/catch.hpp>

#include "daemon_fixture.h"
#include "engine/gguf/gguf.h"
#include "registry_test_util.h"

namespace thermocline::testing {
namespace {

void CheckError(const HttpResponse& r, int status, const std::string& code) {
  INFO(r.body);
  CHECK(r.status == status);
  const nlohmann::json j = Json(r.body);
  CHECK(j["error"]["code"] == code);
  CHECK(!j["error"]["message"].get<std::string>().empty());
}

// stories260K with `general.architecture` (and its keys' prefix) renamed to `arch`.
std::string WithArchitecture(const std::string& arch) {
  auto in = GgufFile::Open(StoriesModel());
  REQUIRE(in.ok());
  GgufWriter w;
  for (const GgufKeyValue& kv : (*in)->metadata()) {
    std::string key = kv.key;
    if (key.rfind("llama.", 0) == 0) key = arch + key.substr(5);
    w.Set(key, kv.value);
  }
  w.SetString("general.architecture", arch);
  for (const GgufTensorInfo& t : (*in)->tensors()) {
    REQUIRE(w.AddTensor(t.name, t.type, t.dims, t.data, t.size_bytes).ok());
  }
  const std::string path = (TempDir() / (arch + ".gguf")).string();
  REQUIRE(w.Write(path).ok());
  return path;
}

TEST_CASE("admin API: an architecture the engine cannot run is refused at registration",
          "[admin][arch]") {
  REQUIRE_STORIES_MODEL();
  // The scratch folder is one the daemon may read models from.
  DaemonProcess d("[registry]\nstate_dir = \"" + (TempDir() / "unsupported.state").string() +
                  "\"\nallowed_paths = [\"" + TempDir().string() + "\"]\n");
  const HttpResponse r = Http(d.port(), "POST", "/admin/models",
                              Post({{"path", WithArchitecture("mamba")}, {"name", "m"}}));
  CheckError(r, 400, "unsupported_model");
  CHECK_THAT(Json(r.body)["error"]["message"].get<std::string>(), Catch::Contains("mamba"));
  // Nothing was recorded and no job started.
  CHECK(Json(Http(d.port(), "GET", "/admin/models").body)["models"].empty());
  CHECK(Http(d.port(), "GET", "/admin/models/m").status == 404);
}

TEST_CASE("admin API: bad bodies are 400 naming the field", "[admin]") {
  REQUIRE_STORIES_MODEL();
  DaemonProcess d;
  CheckError(Http(d.port(), "POST", "/admin/models", "{not json"), 400, "invalid_json");
  CheckError(Http(d.port(), "POST", "/admin/models", "{}"), 400, "missing_required_parameter");
  CheckError(Http(d.port(), "POST", "/admin/models", Post({{"path", 7}})), 400, "invalid_type");
  CheckError(
      Http(d.port(), "POST", "/admin/models", Post({{"path", StoriesModel()}, {"name", "a/b"}})),
      400, "invalid_value");
  CheckError(Http(d.port(), "POST", "/admin/models",
                  Post({{"path", StoriesModel()}, {"name", "x"}, {"activation", "gelu"}})),
             400, "invalid_value");
  CheckError(Http(d.port(), "POST", "/admin/models",
                  Post({{"path", StoriesModel()}, {"name", "x"}, {"profile_tokens", -1}})),
             400, "invalid_value");
  CheckError(Http(d.port(), "POST", "/admin/models",
                  Post({{"path", StoriesModel()},
                        {"name", "x"},
                        {"corpus", TestModelPath("no-such-corpus.txt")}})),
             400, "invalid_value");
  CheckError(Http(d.port(), "POST", "/admin/models",
                  Post({{"path", StoriesModel()}, {"name", "x"}, {"colour", "blue"}})),
             400, "unknown_parameter");
  CheckError(Http(d.port(), "GET", "/admin/models/nobody"), 404, "model_not_found");
  CHECK(Json(Http(d.port(), "GET", "/admin/models").body) ==
        nlohmann::json{{"models", nlohmann::json::array()}});
}

TEST_CASE("admin API: the admin key guards /admin, the API key the rest", "[admin]") {
  REQUIRE_STORIES_MODEL();
  DaemonProcess d("[server]\napi_keys = [\"user\"]\nadmin_key = \"boss\"\n");
  CheckError(Http(d.port(), "GET", "/admin/models"), 401, "invalid_api_key");
  CheckError(Http(d.port(), "GET", "/admin/models", "", {{"Authorization", "Bearer user"}}), 401,
             "invalid_api_key");
  CHECK(Http(d.port(), "GET", "/admin/models", "", {{"Authorization", "Bearer boss"}}).status ==
        200);
  CHECK(Http(d.port(), "GET", "/v1/models", "", {{"Authorization", "Bearer user"}}).status == 200);
}

TEST_CASE("admin API: without an admin key the API key opens /admin", "[admin]") {
  REQUIRE_STORIES_MODEL();
  DaemonProcess d("[server]\napi_keys = [\"user\"]\n");
  CheckError(Http(d.port(), "GET", "/admin/models"), 401, "invalid_api_key");
  CHECK(Http(d.port(), "GET", "/admin/models", "", {{"Authorization", "Bearer user"}}).status ==
        200);
}

TEST_CASE("admin API: register returns the model JSON, list shows it, events end", "[admin]") {
  REQUIRE_STORIES_MODEL();
  DaemonProcess d;
  // The name defaults to the file name; the file is missing (in a folder the daemon may read),
  // so the job fails and the stream ends with that terminal state.
  const std::string missing =
      std::filesystem::weakly_canonical(TestModelPath("no-such-dir/tiny.gguf")).string();
  const HttpResponse r =
      Http(d.port(), "POST", "/admin/models", Post({{"path", missing}, {"activation", "relu"}}));
  INFO(r.body);
  REQUIRE(r.status == 201);
  const nlohmann::json j = Json(r.body);
  CHECK(j["name"] == "tiny");
  CHECK(j["path"] == missing);
  CHECK(j["activation"] == "relu");
  for (const char* key :
       {"state", "stage", "percent", "eta_s", "last_error", "sidecar_path", "mode", "loaded",
        "created_at", "updated_at", "placement", "report", "version"}) {
    CHECK(j.contains(key));
  }
  CHECK(j["mode"] == "dense");
  CHECK(j["loaded"] == false);
  const nlohmann::json list = Json(Http(d.port(), "GET", "/admin/models").body);
  REQUIRE(list["models"].size() == 1);
  CHECK(list["models"][0]["name"] == "tiny");
  const std::vector<nlohmann::json> events = WatchEvents(d.port(), "tiny");
  REQUIRE(!events.empty());
  CHECK(events.back()["state"] == "failed");
  CHECK(events.back()["last_error"].get<std::string>().find(missing) != std::string::npos);
  // The configured model is not in the registry's list and cannot be deleted through it.
  CheckError(Http(d.port(), "DELETE", "/admin/models/" + std::string(kModelName)), 404,
             "model_not_found");
}

}  // namespace
}  // namespace thermocline::testing
