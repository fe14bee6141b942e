// Unit tests of the HTTP front end's pure parts: the bounded request-head parser and its
// rewrite for cpp-httplib, the chunked-body follower, the request policy (Host, Origin, keys,
// media types, routes with bodies) and the path policy of registrations.
#include "server/http_head.h"

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>

#include "server/config.h"
#include "server/http_policy.h"
#include "server/path_policy.h"
#include "test_util.h"

namespace thermocline::server {
namespace {

HeadParse Parse(const std::string& text, RequestHead* head, HeadError* error,
                HeadLimits limits = {}) {
  return ParseRequestHead(text, limits, head, error);
}

int ErrorStatus(const std::string& text, HeadLimits limits = {}) {
  RequestHead head;
  HeadError error;
  return Parse(text, &head, &error, limits) == HeadParse::kError ? error.status : 0;
}

TEST_CASE("request head: parse, framing and the rewrite for cpp-httplib", "[server][http_head]") {
  RequestHead h;
  HeadError e;
  CHECK(Parse("GET /health HTTP/1.1\r\nHost: x\r\n", &h, &e) == HeadParse::kIncomplete);
  REQUIRE(Parse("\r\nGET /v1/models/a%2Fb?x=1 HTTP/1.1\r\nHost:  x  \r\nRange: bytes=0-1\r\n"
                "\r\nrest",
                &h, &e) == HeadParse::kComplete);
  CHECK(h.method == "GET");
  CHECK(h.path == "/v1/models/a/b");
  CHECK(h.Field("host") == "x");
  CHECK(h.head_bytes == std::string("\r\nGET /v1/models/a%2Fb?x=1 HTTP/1.1\r\nHost:  x  \r\n"
                                    "Range: bytes=0-1\r\n\r\n")
                            .size());
  CHECK(h.normalized == "GET /v1/models/a%2Fb?x=1 HTTP/1.1\r\nHost: x\r\n\r\n");  // no Range
  CHECK(h.framing == BodyFraming::kNone);
  // Bare LF line ends are accepted and written back with CRLF.
  REQUIRE(Parse("POST /tokenize HTTP/1.1\nContent-Length: 3\nContent-Length: 3\n\n", &h, &e) ==
          HeadParse::kComplete);
  CHECK(h.framing == BodyFraming::kLength);
  CHECK(h.content_length == 3);
  CHECK(h.normalized == "POST /tokenize HTTP/1.1\r\nContent-Length: 3\r\n\r\n");
  // A POST without framing has no body: said explicitly for cpp-httplib.
  REQUIRE(Parse("POST /x HTTP/1.1\r\nExpect: 100-continue\r\n\r\n", &h, &e) ==
          HeadParse::kComplete);
  CHECK(h.expect_continue);
  CHECK(h.normalized == "POST /x HTTP/1.1\r\nContent-Length: 0\r\n\r\n");
  REQUIRE(Parse("POST /x HTTP/1.1\r\ntransfer-encoding: Chunked\r\n\r\n", &h, &e) ==
          HeadParse::kComplete);
  CHECK(h.framing == BodyFraming::kChunked);
  CHECK(h.normalized == "POST /x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n");
  REQUIRE(Parse("GET / HTTP/1.0\r\n\r\n", &h, &e) == HeadParse::kComplete);
  CHECK(h.close);
  REQUIRE(Parse("GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n", &h, &e) ==
          HeadParse::kComplete);
  CHECK(!h.close);
}

TEST_CASE("request head: what is refused", "[server][http_head]") {
  CHECK(ErrorStatus("POST / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n") == 400);
  CHECK(ErrorStatus("POST / HTTP/1.1\r\nContent-Length: 1, 2\r\n\r\n") == 400);
  CHECK(ErrorStatus("POST / HTTP/1.1\r\nContent-Length: -1\r\n\r\n") == 400);
  CHECK(ErrorStatus("POST / HTTP/1.1\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n") ==
        400);
  CHECK(ErrorStatus("POST / HTTP/1.1\r\nTransfer-Encoding: gzip, chunked\r\n\r\n") == 501);
  CHECK(ErrorStatus("POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n") == 400);
  CHECK(ErrorStatus("GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n") == 400);
  CHECK(ErrorStatus("GET / HTTP/1.1\r\nX: a\r\n folded\r\n\r\n") == 400);
  CHECK(ErrorStatus("GET / HTTP/1.1\r\nBad Name: a\r\n\r\n") == 400);
  CHECK(ErrorStatus("GET / HTTP/1.1\r\nX: a\rb\r\n\r\n") == 400);
  CHECK(ErrorStatus("GET / HTTP/2.0\r\n\r\n") == 505);
  CHECK(ErrorStatus("GET /a%00b HTTP/1.1\r\n\r\n") == 400);
  CHECK(ErrorStatus("GET /a%u0000b HTTP/1.1\r\n\r\n") == 400);
  CHECK(ErrorStatus("GET relative HTTP/1.1\r\n\r\n") == 400);
  CHECK(ErrorStatus("GET / HTTP/1.1\r\nExpect: something\r\n\r\n") == 417);
  HeadLimits small;
  small.max_bytes = 64;
  small.max_fields = 2;
  CHECK(ErrorStatus("GET / HTTP/1.1\r\nA: 1\r\nB: 2\r\nC: 3\r\n\r\n", small) == 431);
  CHECK(ErrorStatus("GET / HTTP/1.1\r\nA: " + std::string(100, 'a'), small) == 431);
  small.max_target = 8;
  CHECK(ErrorStatus("GET /123456789 HTTP/1.1\r\n\r\n", small) == 414);
}

TEST_CASE("chunked body: followed across reads, bounded, no trailers", "[server][http_head]") {
  const std::string body = "4;ext=1\r\nWiki\r\n5\r\npedia\r\n0\r\n\r\nNEXT";
  for (size_t split = 0; split < body.size() - 4; ++split) {
    ChunkedBody c(100);
    size_t used = 0;
    auto r = c.Feed(std::string_view(body).substr(0, split), &used);
    REQUIRE(r == ChunkedBody::Result::kIncomplete);
    REQUIRE(used == split);
    r = c.Feed(std::string_view(body).substr(split), &used);
    REQUIRE(r == ChunkedBody::Result::kComplete);
    CHECK(split + used == body.size() - 4);
    CHECK(c.data_bytes() == 9);
  }
  ChunkedBody big(8);
  size_t used = 0;
  CHECK(big.Feed("9\r\n", &used) == ChunkedBody::Result::kError);
  CHECK(big.error().status == 413);
  ChunkedBody trailer(100);
  CHECK(trailer.Feed("0\r\nX-T: 1\r\n\r\n", &used) == ChunkedBody::Result::kError);
  ChunkedBody bad(100);
  CHECK(bad.Feed("zz\r\n", &used) == ChunkedBody::Result::kError);
  ChunkedBody endless(100);
  CHECK(endless.Feed(std::string(2000, '1'), &used) == ChunkedBody::Result::kError);
}

RequestPolicy::Fields FieldsOf(std::map<std::string, std::string> m) {
  return [m](std::string_view name) {
    for (const auto& [k, v] : m) {
      if (k.size() == name.size() &&
          std::equal(k.begin(), k.end(), name.begin(),
                     [](char a, char b) { return std::tolower(a) == std::tolower(b); })) {
        return v;
      }
    }
    return std::string();
  };
}

TEST_CASE("request policy: hosts, origins, keys, media types", "[server][http_policy]") {
  ServerConfig loopback;
  RequestPolicy p(loopback);  // 127.0.0.1, no keys, CORS off
  CHECK(p.HostAllowed("127.0.0.1:8080"));
  CHECK(p.HostAllowed("LOCALHOST"));
  CHECK(p.HostAllowed("[::1]:8080"));
  CHECK(!p.HostAllowed("attacker.example:8080"));
  CHECK(!p.HostAllowed("127.0.0.1.attacker.example"));
  ServerConfig wildcard;
  wildcard.host = "0.0.0.0";
  CHECK(RequestPolicy(wildcard).HostAllowed("thermocline.default.svc"));
  ServerConfig listed;
  listed.allowed_hosts = {"api.example.com", "*.internal"};
  RequestPolicy lp(listed);
  CHECK(lp.HostAllowed("api.example.com:443"));
  CHECK(lp.HostAllowed("a.b.internal"));
  CHECK(!lp.HostAllowed("localhost"));

  auto check = [&](const RequestPolicy& policy, std::string method, std::string path,
                   std::map<std::string, std::string> fields, bool body) {
    auto e = policy.Check(method, path, FieldsOf(fields), body);
    return e ? e->http_status : 0;
  };
  CHECK(check(p, "POST", "/v1/completions", {{"Content-Type", "application/json"}}, true) == 0);
  CHECK(check(p, "POST", "/v1/completions", {}, true) == 0);  // no type: a script, not a page
  CHECK(check(p, "POST", "/v1/completions", {{"Content-Type", "text/plain"}}, true) == 415);
  CHECK(check(p, "POST", "/v1/completions",
              {{"Content-Type", "application/vnd.api+json; charset=utf-8"}}, true) == 0);
  CHECK(check(p, "POST", "/v1/completions", {{"Content-Encoding", "zstd"}}, true) == 415);
  CHECK(check(p, "POST", "/v1/completions", {{"Origin", "http://evil.example"}}, true) == 403);
  CHECK(check(p, "POST", "/v1/completions",
              {{"Origin", "http://127.0.0.1:8080"}, {"Host", "127.0.0.1:8080"}}, true) == 0);
  CHECK(check(p, "POST", "/health", {}, true) == 404);  // a body where no route takes one
  CHECK(check(p, "PUT", "/v1/models", {}, true) == 404);
  CHECK(check(p, "DELETE", "/admin/models/x", {}, true) == 0);

  ServerConfig keyed;
  keyed.api_keys = {"user"};
  keyed.admin_key = "adm";
  keyed.cors_allowed_origins = {"http://app.example"};
  RequestPolicy kp(keyed);
  CHECK(check(kp, "GET", "/v1/models", {}, false) == 401);
  CHECK(check(kp, "GET", "/v1/models", {{"Authorization", "Bearer user"}}, false) == 0);
  CHECK(check(kp, "GET", "/v1/models", {{"X-Api-Key", "user"}}, false) == 0);
  CHECK(check(kp, "GET", "/admin/models", {{"Authorization", "Bearer user"}}, false) == 401);
  CHECK(check(kp, "GET", "/admin/models", {{"Authorization", "Bearer adm"}}, false) == 0);
  CHECK(check(kp, "GET", "/health", {}, false) == 0);
  CHECK(check(kp, "OPTIONS", "/v1/chat/completions", {{"Origin", "http://app.example"}}, false) ==
        0);
  CHECK(kp.AllowedOrigin("HTTP://APP.EXAMPLE") == "HTTP://APP.EXAMPLE");
  CHECK(kp.AllowedOrigin("http://app.example.evil") == "");
  CHECK(kp.CorsHeaders("http://other.example", true).empty());
}

TEST_CASE("path policy: only files under the roots, resolved", "[server][path_policy]") {
  namespace fs = std::filesystem;
  const fs::path root = testing::TempDir() / "paths" / "models";
  fs::create_directories(root / "sub");
  fs::create_directories(root.string() + "-evil");
  std::ofstream(root / "sub" / "m.gguf") << "x";
  std::ofstream(root.string() + "-evil/m.gguf") << "x";
  fs::create_symlink(root.string() + "-evil/m.gguf", root / "escape.gguf");
  fs::create_symlink(root / "sub" / "m.gguf", root.parent_path() / "inward.gguf");
  PathPolicy policy({root.string() + "/"});
  auto ok = policy.Confine("path", (root / "sub" / ".." / "sub" / "m.gguf").string());
  REQUIRE(ok.ok());
  CHECK(*ok == fs::weakly_canonical(root / "sub" / "m.gguf").string());
  CHECK(policy.Confine("path", (root / "missing.gguf").string()).ok());  // the job says why
  CHECK(absl::IsPermissionDenied(
      policy.Confine("path", root.string() + "-evil/m.gguf").status()));  // a prefix, not a root
  CHECK(absl::IsPermissionDenied(policy.Confine("path", (root / "escape.gguf").string()).status()));
  CHECK(absl::IsPermissionDenied(
      policy.Confine("path", (root / ".." / ".." / "paths" / "x").string()).status()));
  // A link from outside to a file inside is judged by where it leads.
  CHECK(policy.Confine("path", (root.parent_path() / "inward.gguf").string()).ok());
  CHECK(absl::IsInvalidArgument(policy.Confine("path", (root / "sub").string()).status()));
  CHECK(absl::IsInvalidArgument(policy.Confine("path", std::string("a\0b", 3)).status()));
  CHECK(absl::IsPermissionDenied(PathPolicy({}).Confine("path", "/etc/passwd").status()));
}

}  // namespace
}  // namespace thermocline::server
