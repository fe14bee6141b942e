// The HTTP front end under hostile clients, over real sockets: bodies bounded by their decoded
// size while they are read (gzip, brotli, chunked), the key checked before a body is read,
// bounded heads, slow clients that hold no worker, /health served while every worker is busy,
// connections per client, the in-flight byte budget, the listen backlog, and the small framing
// cases (bodyless POST, half-closed connections, Range, duplicate Content-Length, NUL in a path).
#include <brotli/encode.h>
#include <zlib.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <fstream>
#include <sstream>
#include <thread>

#include "daemon_fixture.h"
#include "http_client.h"

namespace thermocline::testing {
namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// Peak resident memory of a process, in bytes.
int64_t PeakRss(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stoll(line.substr(6)) * 1024;
  }
  return -1;
}

std::string Gzip(const std::string& data) {
  z_stream z{};
  REQUIRE(deflateInit2(&z, 9, Z_DEFLATED, 15 + 16, 9, Z_DEFAULT_STRATEGY) == Z_OK);
  std::string out(deflateBound(&z, data.size()), '\0');
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(data.data()));
  z.avail_in = static_cast<uInt>(data.size());
  z.next_out = reinterpret_cast<Bytef*>(out.data());
  z.avail_out = static_cast<uInt>(out.size());
  REQUIRE(deflate(&z, Z_FINISH) == Z_STREAM_END);
  out.resize(z.total_out);
  deflateEnd(&z);
  return out;
}

std::string Brotli(const std::string& data) {
  size_t size = BrotliEncoderMaxCompressedSize(data.size());
  std::string out(size, '\0');
  REQUIRE(BrotliEncoderCompress(5, BROTLI_DEFAULT_WINDOW, BROTLI_MODE_GENERIC, data.size(),
                                reinterpret_cast<const uint8_t*>(data.data()), &size,
                                reinterpret_cast<uint8_t*>(out.data())) == BROTLI_TRUE);
  out.resize(size);
  return out;
}

std::string Head(const std::string& method, const std::string& path,
                 const std::vector<std::string>& fields) {
  std::string h = method + " " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\n";
  for (const std::string& f : fields) h += f + "\r\n";
  return h + "\r\n";
}

std::string ErrorCode(const HttpResponse& r) {
  const nlohmann::json j = nlohmann::json::parse(r.body, nullptr, false);
  return j.is_discarded() || !j.contains("error") ? "" : j["error"]["code"].get<std::string>();
}

const std::string kCompletion = R"({"model":"stories","prompt":"Once upon","max_tokens":4})";

TEST_CASE("a compressed body is bounded by its decoded size while it is read",
          "[server][hostile]") {
  REQUIRE_STORIES_MODEL();
  DaemonProcess d("[server]\nmax_body_bytes = 1048576\n");
  // 64 MiB of JSON that compresses to a few dozen KiB: inflated whole, it would cost the daemon
  // hundreds of MiB (the text, then its JSON tree).
  const std::string json = "{\"content\":\"" + std::string(64 << 20, 'a') + "\"}";
  const int64_t before = PeakRss(d.pid());
  for (const auto& [coding, body] : {std::pair{"gzip", Gzip(json)}, {"br", Brotli(json)}}) {
    INFO(coding);
    CHECK(body.size() < (1 << 20));
    HttpConnection c(d.port(), 10000);
    const auto start = Clock::now();
    c.SendRaw(Head("POST", "/tokenize",
                   {"Content-Type: application/json", std::string("Content-Encoding: ") + coding,
                    "Content-Length: " + std::to_string(body.size())}) +
              body);
    const HttpResponse r = c.ReadResponse();
    INFO(r.body);
    CHECK(r.status == 413);
    CHECK(ErrorCode(r) == "payload_too_large");
    CHECK(SecondsSince(start) < 5);
  }
  // Reading stops at the limit (1 MiB), far below the 64 MiB the bodies inflate to. Tolerance:
  // the limit, the decompressor's buffers and the allocator's slack.
  const int64_t grown = PeakRss(d.pid()) - before;
  INFO("peak RSS grew by " << grown << " bytes");
  CHECK(grown < (16 << 20));
  CHECK(Http(d.port(), "GET", "/health").status == 200);
}

TEST_CASE("a chunked body over the limit is refused as it arrives", "[server][hostile]") {
  REQUIRE_STORIES_MODEL();
  DaemonProcess d("[server]\nmax_body_bytes = 1048576\n");
  HttpConnection c(d.port(), 5000);
  c.SendRaw(
      Head("POST", "/tokenize", {"Content-Type: application/json", "Transfer-Encoding: chunked"}));
  const std::string chunk(64 << 10, 'a');
  char size_line[32];
  std::snprintf(size_line, sizeof(size_line), "%zx\r\n", chunk.size());
  // 1.25 MiB of a body that would go on for ever: the answer must come without its end.
  for (int i = 0; i < 20; ++i) c.SendRaw(size_line + chunk + "\r\n");
  const HttpResponse r = c.ReadResponse();
  INFO(r.body);
  CHECK(r.status == 413);
  CHECK(r.header("connection") == "close");
}

TEST_CASE("the API key is checked before the body is read", "[server][hostile]") {
  REQUIRE_STORIES_MODEL();
  DaemonProcess d("[server]\napi_keys = [\"k\"]\n");
  // The head promises a body that never comes; without a key the answer comes at once.
  HttpConnection c(d.port(), 3000);
  const auto start = Clock::now();
  c.SendRaw(Head("POST", "/v1/completions",
                 {"Content-Type: application/json", "Content-Length: 1000000"}));
  const HttpResponse r = c.ReadResponse();
  CHECK(r.status == 401);
  CHECK(SecondsSince(start) < 2);
  CHECK(r.header("connection") == "close");
  // The same for the admin API, and with 100-continue (the body is never asked for).
  HttpConnection e(d.port(), 3000);
  e.SendRaw(
      Head("POST", "/admin/models",
           {"Content-Type: application/json", "Content-Length: 100", "Expect: 100-continue"}));
  CHECK(e.ReadResponse().status == 401);
}

TEST_CASE("request heads are bounded in size and in fields", "[server][hostile]") {
  REQUIRE_STORIES_MODEL();
  DaemonProcess d;
  std::vector<std::string> many;
  for (int i = 0; i < 200; ++i) many.push_back("X-F" + std::to_string(i) + ": v");
  HttpConnection c(d.port(), 5000);
  c.SendRaw(Head("GET", "/health", many));
  HttpResponse r = c.ReadResponse();
  CHECK(r.status == 431);
  CHECK(ErrorCode(r) == "request_header_fields_too_large");
  // One endless field: refused once it passes the limit (32 KiB), not read to its end.
  HttpConnection big(d.port(), 5000);
  big.SendRaw("GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + std::string(40 << 10, 'b'));
  CHECK(big.ReadResponse().status == 431);
  CHECK(Http(d.port(), "GET", "/health").status == 200);
}

// Opens `n` connections that each send the start of a head, then a byte every 200 ms.
class SlowClients {
 public:
  SlowClients(int port, int n) {
    for (int i = 0; i < n; ++i) {
      conns_.push_back(std::make_unique<HttpConnection>(port, 5000));
      conns_.back()->SendRaw("G");
    }
    thread_ = std::thread([this] {
      const std::string rest = "ET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ";
      for (size_t k = 0; !stop_ && k < 300; ++k) {
        for (auto& c : conns_) {
          try {
            c->SendRaw(std::string(1, k < rest.size() ? rest[k] : 'x'));
          } catch (const std::exception&) {
          }
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
      }
    });
  }
  ~SlowClients() { Stop(); }
  void Stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }
  std::vector<std::unique_ptr<HttpConnection>>& conns() { return conns_; }

 private:
  std::vector<std::unique_ptr<HttpConnection>> conns_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

TEST_CASE("slow clients hold no worker", "[server][hostile]") {
  REQUIRE_STORIES_MODEL();
  // Two workers: 30 clients sending a byte every 200 ms would hold them all, were a connection a
  // worker.
  DaemonProcess d("[server]\nhttp_threads = 2\n");
  SlowClients slow(d.port(), 30);
  for (int i = 0; i < 5; ++i) {
    const auto start = Clock::now();
    CHECK(Http(d.port(), "GET", "/health").status == 200);
    CHECK(Http(d.port(), "POST", "/v1/completions", kCompletion).status == 200);
    CHECK(SecondsSince(start) < 1.0);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

TEST_CASE("a slow request head has a deadline", "[server][hostile]") {
  REQUIRE_STORIES_MODEL();
  DaemonProcess d("[server]\nheader_timeout_s = 2\n");
  SlowClients slow(d.port(), 5);
  // After the header deadline each slow client has had a 408 and its connection is closed.
  std::this_thread::sleep_for(std::chrono::milliseconds(2600));
  slow.Stop();
  for (auto& c : slow.conns()) {
    CHECK(c->ReadResponse().status == 408);
    CHECK(c->ClosedByServer(2000));
  }
}

TEST_CASE("/health and /metrics are answered while every worker is busy", "[server][hostile]") {
  REQUIRE_STORIES_MODEL();
  // One worker, held by a slow streamed generation.
  DaemonProcess d("[server]\nhttp_threads = 1\n[debug]\ndecode_delay_ms = 50\n");
  HttpConnection stream(d.port(), 20000);
  stream.Send("POST", "/v1/completions",
              R"({"model":"stories","prompt":"Once","max_tokens":60,"stream":true,)"
              R"("ignore_eos":true})");
  REQUIRE(stream.ReadHead().status == 200);
  for (const char* path : {"/health", "/metrics"}) {
    INFO(path);
    const auto start = Clock::now();
    CHECK(Http(d.port(), "GET", path).status == 200);
    CHECK(SecondsSince(start) < 1.0);
  }
}

TEST_CASE("connections per client are bounded", "[server][hostile]") {
  REQUIRE_STORIES_MODEL();
  DaemonProcess d;  // server.max_connections_per_client = 64
  std::vector<std::unique_ptr<HttpConnection>> open;
  for (int i = 0; i < 64; ++i) open.push_back(std::make_unique<HttpConnection>(d.port(), 3000));
  HttpConnection more(d.port(), 3000);
  more.Send("GET", "/v1/models");
  const HttpResponse r = more.ReadResponse();
  CHECK(r.status == 503);
  CHECK(ErrorCode(r) == "too_many_connections");
  // Probes still pass: a few connections beyond the limit serve /health and /metrics only.
  CHECK(Http(d.port(), "GET", "/health").status == 200);
  CHECK(Http(d.port(), "GET", "/metrics").status == 200);
  // A connection that closes frees its place, once the server has seen it close (within
  // milliseconds; up to 5 s allowed for a loaded machine).
  open.pop_back();
  int status = 0;
  for (int tries = 0; tries < 50 && status != 200; ++tries) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    status = Http(d.port(), "GET", "/v1/models").status;
  }
  CHECK(status == 200);
}

TEST_CASE("request bodies held at once are bounded", "[server][hostile]") {
  REQUIRE_STORIES_MODEL();
  // server.max_inflight_bytes is 16 bodies of the largest size by default.
  DaemonProcess d("[server]\nmax_body_bytes = 65536\n");
  const std::string head =
      Head("POST", "/tokenize", {"Content-Type: application/json", "Content-Length: 65536"});
  std::vector<std::unique_ptr<HttpConnection>> held;
  for (int i = 0; i < 16; ++i) {
    held.push_back(std::make_unique<HttpConnection>(d.port(), 3000));
    held.back()->SendRaw(head + "{");
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  HttpConnection c(d.port(), 3000);
  c.SendRaw(head + "{");
  const HttpResponse r = c.ReadResponse();
  CHECK(r.status == 503);
  CHECK(ErrorCode(r) == "server_busy");
  CHECK(!r.header("retry-after").empty());
  held.pop_back();
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  CHECK(Http(d.port(), "POST", "/tokenize", Post({{"content", "hi"}})).status == 200);
}

TEST_CASE("a tokenize call is bounded in text", "[server][hostile]") {
  REQUIRE_STORIES_MODEL();
  DaemonProcess d;  // server.max_tokenize_bytes = 1 MiB
  const HttpResponse big =
      Http(d.port(), "POST", "/tokenize", Post({{"content", std::string((1 << 20) + 1, 'a')}}));
  CHECK(big.status == 400);
  CHECK(ErrorCode(big) == "text_too_long");
  CHECK(Http(d.port(), "POST", "/tokenize", Post({{"content", std::string(1000, 'a')}})).status ==
        200);
}

TEST_CASE("the listen backlog is larger than cpp-httplib's 5", "[server][hostile]") {
  REQUIRE_STORIES_MODEL();
  DaemonProcess d;  // server.listen_backlog = 1024
  // ss shows a listening socket's backlog as its Send-Q.
  FILE* p =
      ::popen(("ss -ltnH 'sport = :" + std::to_string(d.port()) + "' 2>/dev/null").c_str(), "r");
  std::string out;
  char buf[512];
  while (p != nullptr && std::fgets(buf, sizeof(buf), p) != nullptr) out += buf;
  const int rc = p == nullptr ? -1 : ::pclose(p);
  if (rc != 0 || out.empty()) THERMOCLINE_SKIP("ss (iproute2) is not installed");
  INFO(out);
  std::istringstream fields(out);
  std::string state, recv_q, send_q;
  fields >> state >> recv_q >> send_q;
  // The kernel caps it at net.core.somaxconn (4096 by default).
  CHECK(std::stoi(send_q) >= 1024);
}

TEST_CASE("JSON routes take JSON only; Host and Origin are checked", "[server][hostile]") {
  REQUIRE_STORIES_MODEL();
  DaemonProcess d;
  // A page of another site can send text/plain without a preflight: refused.
  HttpResponse r =
      Http(d.port(), "POST", "/v1/completions", kCompletion, {{"Content-Type", "text/plain"}});
  CHECK(r.status == 415);
  CHECK(ErrorCode(r) == "unsupported_media_type");
  CHECK(Http(d.port(), "POST", "/v1/completions", kCompletion,
             {{"Content-Type", "application/x-www-form-urlencoded"}})
            .status == 415);
  CHECK(Http(d.port(), "POST", "/v1/completions", kCompletion,
             {{"Content-Type", "application/json; charset=utf-8"}})
            .status == 200);
  // DNS rebinding: a name that is not this loopback server's.
  HttpConnection c(d.port());
  c.SendRaw("GET /v1/models HTTP/1.1\r\nHost: attacker.example:" + std::to_string(d.port()) +
            "\r\nConnection: close\r\n\r\n");
  r = c.ReadResponse();
  CHECK(r.status == 403);
  CHECK(ErrorCode(r) == "host_not_allowed");
  HttpConnection ok(d.port());
  ok.SendRaw("GET /v1/models HTTP/1.1\r\nHost: localhost:" + std::to_string(d.port()) +
             "\r\nConnection: close\r\n\r\n");
  CHECK(ok.ReadResponse().status == 200);
  // CORS is off by default: a page's request is refused, not only kept from reading the answer.
  r = Http(d.port(), "POST", "/v1/completions", kCompletion,
           {{"Origin", "http://attacker.example"}});
  CHECK(r.status == 403);
  CHECK(ErrorCode(r) == "origin_not_allowed");
  CHECK(Http(d.port(), "OPTIONS", "/v1/completions", "",
             {{"Origin", "http://attacker.example"}, {"Access-Control-Request-Method", "POST"}})
            .status == 403);
}

TEST_CASE("CORS: allowed origins, preflights answered without the key", "[server][hostile]") {
  REQUIRE_STORIES_MODEL();
  DaemonProcess d(
      "[server]\napi_keys = [\"k\"]\ncors_allowed_origins = [\"http://app.example:3000\"]\n");
  const std::map<std::string, std::string> preflight = {
      {"Origin", "http://app.example:3000"},
      {"Access-Control-Request-Method", "POST"},
      {"Access-Control-Request-Headers", "authorization, content-type"}};
  HttpResponse r = Http(d.port(), "OPTIONS", "/v1/chat/completions", "", preflight);
  CHECK(r.status == 204);
  CHECK(r.header("access-control-allow-origin") == "http://app.example:3000");
  CHECK(r.header("access-control-allow-methods").find("POST") != std::string::npos);
  CHECK(r.header("access-control-allow-headers").find("Authorization") != std::string::npos);
  r = Http(d.port(), "POST", "/v1/completions", kCompletion,
           {{"Origin", "http://app.example:3000"}, {"Authorization", "Bearer k"}});
  CHECK(r.status == 200);
  CHECK(r.header("access-control-allow-origin") == "http://app.example:3000");
  CHECK(r.header("vary") == "Origin");
  // The browser can read a refusal too.
  r = Http(d.port(), "GET", "/v1/models", "", {{"Origin", "http://app.example:3000"}});
  CHECK(r.status == 401);
  CHECK(r.header("access-control-allow-origin") == "http://app.example:3000");
  auto other = preflight;
  other["Origin"] = "http://other.example";
  CHECK(Http(d.port(), "OPTIONS", "/v1/chat/completions", "", other).status == 403);
}

TEST_CASE("framing: bodyless POST, duplicate Content-Length, Range, NUL in a path",
          "[server][hostile]") {
  REQUIRE_STORIES_MODEL();
  DaemonProcess d;
  // No Content-Length, no chunked coding: no body (not "read until the client closes").
  HttpConnection bodyless(d.port(), 3000);
  auto start = Clock::now();
  bodyless.SendRaw(Head("POST", "/tokenize", {"Content-Type: application/json"}));
  HttpResponse r = bodyless.ReadResponse();
  CHECK(r.status == 400);
  CHECK(ErrorCode(r) == "invalid_json");
  CHECK(SecondsSince(start) < 2);
  // Two Content-Lengths that disagree: which one frames the body is ambiguous (smuggling).
  HttpConnection two(d.port(), 3000);
  const std::string body = R"({"content":"hello"})";
  two.SendRaw(Head("POST", "/tokenize",
                   {"Content-Type: application/json", "Content-Length: 5",
                    "Content-Length: " + std::to_string(body.size())}) +
              body);
  r = two.ReadResponse();
  CHECK(r.status == 400);
  CHECK(two.ClosedByServer(2000));
  HttpConnection same(d.port(), 3000);
  same.SendRaw(
      Head("POST", "/tokenize",
           {"Content-Type: application/json", "Content-Length: " + std::to_string(body.size()),
            "Content-Length: " + std::to_string(body.size()), "Connection: close"}) +
      body);
  CHECK(same.ReadResponse().status == 200);
  // API responses are not byte ranges.
  r = Http(d.port(), "GET", "/v1/models", "", {{"Range", "bytes=0-3"}});
  CHECK(r.status == 200);
  CHECK(Json(r.body)["object"] == "list");
  // A NUL byte in the path (percent-encoded) is refused, not routed.
  CHECK(Http(d.port(), "GET", "/v1/models/stories%00.gguf").status == 400);
  CHECK(Http(d.port(), "GET", "/v1/models/stories%u0000x").status == 400);
}

TEST_CASE("a half-closed connection gets its response", "[server][hostile]") {
  REQUIRE_STORIES_MODEL();
  DaemonProcess d;
  HttpConnection health(d.port(), 5000);
  health.Send("GET", "/health");
  health.ShutdownWrite();
  CHECK(health.ReadResponse().status == 200);
  // Also a generation, which watches for a client that leaves while it waits.
  HttpConnection gen(d.port(), 10000);
  gen.Send("POST", "/v1/completions",
           R"({"model":"stories","prompt":"Once","max_tokens":16,"ignore_eos":true})");
  gen.ShutdownWrite();
  const HttpResponse r = gen.ReadResponse();
  INFO(r.body);
  REQUIRE(r.status == 200);
  CHECK(Json(r.body)["usage"]["completion_tokens"] == 16);
}

TEST_CASE("a non-streamed request stops when its client leaves", "[server][hostile]") {
  REQUIRE_STORIES_MODEL();
  // One slot and 20 ms a token: 400 tokens would hold the slot for 8 s.
  DaemonProcess d("[scheduler]\nslots = 1\n[debug]\ndecode_delay_ms = 20\n");
  {
    HttpConnection gone(d.port());
    gone.Send("POST", "/v1/completions",
              R"({"model":"stories","prompt":"Once","max_tokens":400,"ignore_eos":true})");
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
  }  // closed
  const auto start = Clock::now();
  HttpConnection next(d.port(), 6000);
  next.Send("POST", "/v1/completions", kCompletion);
  CHECK(next.ReadResponse().status == 200);
  CHECK(SecondsSince(start) < 3);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  CHECK(d.Log().find("client_disconnected") != std::string::npos);
}

TEST_CASE("the access log of an early error has no counts of the request before",
          "[server][hostile]") {
  REQUIRE_STORIES_MODEL();
  DaemonProcess d;
  HttpConnection c(d.port(), 5000);
  c.Send("POST", "/v1/completions", kCompletion);
  REQUIRE(c.ReadResponse().status == 200);
  // A method cpp-httplib does not know: answered before routing, on the same thread.
  c.SendRaw("BREW /pot HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
  CHECK(c.ReadResponse().status == 400);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const std::string log = d.Log();
  const size_t line = log.rfind(" BREW ");
  REQUIRE(line != std::string::npos);
  const std::string text = log.substr(line, log.find('\n', line) - line);
  INFO(text);
  CHECK(text.find(" 400 ") != std::string::npos);
  CHECK(text.find("prompt=") == std::string::npos);
}

}  // namespace
}  // namespace thermocline::testing
