// Every error the API documents, over real HTTP: status, {"error":{message,type,code,param}},
// and the daemon still serving afterwards.
#include "daemon_fixture.h"

namespace thermocline::testing {
namespace {

using nlohmann::json;

// Checks the error body's shape and returns it.
json ExpectError(const HttpResponse& r, int status, const std::string& type) {
  INFO(r.status << " " << r.body);
  REQUIRE(r.status == status);
  CHECK(r.header("content-type").find("application/json") == 0);
  const json j = Json(r.body);
  REQUIRE(j.contains("error"));
  const json& e = j["error"];
  CHECK(e["message"].is_string());
  CHECK(!e["message"].get<std::string>().empty());
  CHECK(e["type"] == type);
  CHECK(e.contains("code"));
  CHECK(e.contains("param"));
  return e;
}

json ChatBody() {
  return {{"model", kModelName},
          {"messages", {{{"role", "user"}, {"content", "Hi"}}}},
          {"max_tokens", 4}};
}

HttpResponse PostChat(int port, const std::string& body,
                      const std::map<std::string, std::string>& headers = {}) {
  return Http(port, "POST", "/v1/chat/completions", body, headers);
}

TEST_CASE("invalid requests get 400 invalid_request_error naming the field", "[server][errors]") {
  REQUIRE_STORIES_MODEL();
  DaemonProcess d;
  const int port = d.port();
  CHECK(ExpectError(PostChat(port, "{\"model\":"), 400, "invalid_request_error")["code"] ==
        "invalid_json");
  CHECK(ExpectError(PostChat(port, "[]"), 400, "invalid_request_error")["code"] == "invalid_json");
  CHECK(ExpectError(PostChat(port, std::string(5000, '[')), 400, "invalid_request_error")["code"] ==
        "invalid_json");
  struct Case {
    const char* field;
    json value;  // null: remove the field
    const char* code;
    const char* param;
  };
  const Case cases[] = {
      {"model", nullptr, "missing_required_parameter", "model"},
      {"messages", nullptr, "missing_required_parameter", "messages"},
      {"messages", json::array(), "invalid_value", "messages"},
      {"messages", "hi", "invalid_type", "messages"},
      {"temperature", "hot", "invalid_type", "temperature"},
      {"temperature", 2.5, "invalid_value", "temperature"},
      {"top_p", 1.5, "invalid_value", "top_p"},
      {"top_k", -1, "invalid_value", "top_k"},
      {"min_p", -0.1, "invalid_value", "min_p"},
      {"presence_penalty", 3, "invalid_value", "presence_penalty"},
      {"frequency_penalty", -3, "invalid_value", "frequency_penalty"},
      {"max_tokens", 0, "invalid_value", "max_tokens"},
      {"max_tokens", 1.5, "invalid_type", "max_tokens"},
      {"max_tokens", 1e300, "invalid_type", "max_tokens"},  // whole, but past int64
      {"max_completion_tokens", -4, "invalid_value", "max_completion_tokens"},
      {"n", 2, "unsupported_value", "n"},
      {"stream", "yes", "invalid_type", "stream"},
      {"stop", json::array({1}), "invalid_type", "stop"},
      {"top_logprobs", 3, "invalid_value", "top_logprobs"},  // without logprobs: true
      {"logit_bias", {{"99999", 1}}, "invalid_value", "logit_bias"},
      {"seed", "x", "invalid_type", "seed"},
  };
  for (const Case& c : cases) {
    json body = ChatBody();
    if (c.value.is_null()) {
      body.erase(c.field);
    } else {
      body[c.field] = c.value;
    }
    INFO(body.dump());
    const json e = ExpectError(PostChat(port, body.dump()), 400, "invalid_request_error");
    CHECK(e["code"] == c.code);
    CHECK(e["param"] == c.param);
  }
  const json e =
      ExpectError(Http(port, "POST", "/v1/completions", json{{"model", kModelName}}.dump()), 400,
                  "invalid_request_error");
  CHECK(e["param"] == "prompt");
  // Unknown fields are ignored.
  json extra = ChatBody();
  extra["frobnicate"] = {{"x", 1}};
  CHECK(PostChat(port, extra.dump()).status == 200);
}

TEST_CASE("a prompt beyond the context gets 400 exceed_context_size_error", "[server][errors]") {
  REQUIRE_STORIES_MODEL();
  DaemonProcess d;
  json body = ChatBody();
  body["max_tokens"] = 600;  // the context is 512
  ExpectError(PostChat(d.port(), body.dump()), 400, "exceed_context_size_error");
  std::string long_prompt;
  for (int i = 0; i < 300; ++i) long_prompt += "the cat ";
  ExpectError(Http(d.port(), "POST", "/v1/completions",
                   json{{"model", kModelName}, {"prompt", long_prompt}}.dump()),
              400, "exceed_context_size_error");
  // Right at the limit is fine.
  HttpResponse ok = Http(d.port(), "POST", "/v1/completions",
                         json{{"model", kModelName},
                              {"prompt", "Once upon a time"},
                              {"max_tokens", 507},
                              {"ignore_eos", true}}
                             .dump());
  REQUIRE(ok.status == 200);
  CHECK(Json(ok.body)["usage"]["total_tokens"] == 512);
}

TEST_CASE("unknown models and routes get 404 not_found_error", "[server][errors]") {
  REQUIRE_STORIES_MODEL();
  DaemonProcess d;
  json body = ChatBody();
  body["model"] = "gpt-4o";
  CHECK(ExpectError(PostChat(d.port(), body.dump()), 404, "not_found_error")["code"] ==
        "model_not_found");
  ExpectError(Http(d.port(), "GET", "/v1/nothing"), 404, "not_found_error");
  ExpectError(Http(d.port(), "GET", "/v1/chat/completions"), 404, "not_found_error");
}

TEST_CASE("bodies over the limit get 413", "[server][errors]") {
  REQUIRE_STORIES_MODEL();
  DaemonProcess d("[server]\nmax_body_bytes = 4096\n");
  json body = ChatBody();
  body["messages"][0]["content"] = std::string(8000, 'a');
  HttpResponse r = PostChat(d.port(), body.dump());
  CHECK(r.status == 413);
  CHECK(Json(r.body)["error"]["code"] == "payload_too_large");
  CHECK(PostChat(d.port(), ChatBody().dump()).status == 200);
}

TEST_CASE("API keys: 401 without one, Bearer or X-Api-Key accepted, /health public",
          "[server][errors]") {
  REQUIRE_STORIES_MODEL();
  DaemonProcess d("[server]\napi_keys = [\"sekret\", \"other\"]\n", /*wait_ready=*/false);
  d.WaitReady();  // /health needs no key
  ExpectError(PostChat(d.port(), ChatBody().dump()), 401, "authentication_error");
  ExpectError(PostChat(d.port(), ChatBody().dump(), {{"Authorization", "Bearer wrong"}}), 401,
              "authentication_error");
  ExpectError(Http(d.port(), "GET", "/v1/models"), 401, "authentication_error");
  ExpectError(Http(d.port(), "GET", "/metrics"), 401, "authentication_error");
  CHECK(PostChat(d.port(), ChatBody().dump(), {{"Authorization", "Bearer sekret"}}).status == 200);
  CHECK(PostChat(d.port(), ChatBody().dump(), {{"X-Api-Key", "other"}}).status == 200);
  CHECK(Http(d.port(), "GET", "/v1/models", "", {{"Authorization", "Bearer other"}}).status == 200);
  CHECK(Http(d.port(), "GET", "/health").status == 200);
}

TEST_CASE("a bad config fails fast with the key named", "[server][errors]") {
  const std::string path = (TempDir() / "bad.toml").string();
  std::ofstream(path) << "[scheduler]\nslotz = 2\n";
  const std::string cmd = "timeout 20 " + ThermoclineBinary() + " serve --config " + path + " 2>&1";
  FILE* p = ::popen(cmd.c_str(), "r");
  REQUIRE(p != nullptr);
  char buf[512];
  std::string out;
  while (size_t n = std::fread(buf, 1, sizeof(buf), p)) out.append(buf, n);
  const int status = ::pclose(p);
  INFO(out);
  CHECK(WEXITSTATUS(status) == 2);
  CHECK(out.find("scheduler.slotz") != std::string::npos);
}

}  // namespace
}  // namespace thermocline::testing
