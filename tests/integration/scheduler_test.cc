// The scheduler seen from outside: a client that vanishes mid-stream frees its slot at once,
// a full queue answers 503 with Retry-After, concurrent greedy streams get exactly what a lone
// request gets, deadlines end generation, and SIGTERM drains in-flight streams before exit 0.
// [debug] decode_delay_ms slows the tiny test model down so that requests overlap for sure.
#include <atomic>
#include <thread>

#include "daemon_fixture.h"
#include "model_fixtures.h"

namespace thermocline::testing {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

json StreamBody(const std::string& prompt, int max_tokens) {
  return {{"model", kModelName}, {"prompt", prompt}, {"max_tokens", max_tokens},
          {"temperature", 0},    {"stream", true},   {"ignore_eos", true}};
}

// Reads the next SSE event of a streamed response ("" at the end of the body). Throws on bad
// framing; safe to use from several threads (no Catch2 macros).
class EventReader {
 public:
  explicit EventReader(HttpConnection& c) : c_(c) {}
  std::string Next() {
    while (pending_.empty()) {
      std::string chunk;
      if (!c_.ReadChunk(&chunk)) return "";
      for (std::string& e : ParseSseOrThrow(chunk)) pending_.push_back(std::move(e));
    }
    std::string e = pending_.front();
    pending_.erase(pending_.begin());
    return e;
  }

 private:
  HttpConnection& c_;
  std::vector<std::string> pending_;
};

std::string Metrics(int port) { return Http(port, "GET", "/metrics").body; }

TEST_CASE("a client that disconnects mid-stream frees its slot", "[server][scheduler]") {
  REQUIRE_STORIES_MODEL();
  DaemonProcess d("[scheduler]\nslots = 1\nqueue = 4\n[debug]\ndecode_delay_ms = 20\n");
  {
    HttpConnection a(d.port());
    a.Send("POST", "/v1/completions", StreamBody("Once upon a time", 400).dump());
    REQUIRE(a.ReadHead().status == 200);
    EventReader events(a);
    for (int i = 0; i < 3; ++i) REQUIRE(!events.Next().empty());
  }  // the client vanishes; 400 tokens would take 8 s
  const auto start = Clock::now();
  HttpResponse b =
      Http(d.port(), "POST", "/v1/completions",
           json{{"model", kModelName}, {"prompt", "The cat"}, {"max_tokens", 5}}.dump());
  REQUIRE(b.status == 200);
  CHECK(SecondsSince(start) < 2.0);
  const std::string m = Metrics(d.port());
  INFO(m);
  CHECK(MetricValue(m, R"(thermocline_cancellations_total{reason="client_disconnected"})") == 1);
  CHECK(MetricValue(m, "thermocline_generated_tokens_total") < 100);
  CHECK(MetricValue(m, "thermocline_slots_busy") == 0);
  CHECK(d.Log().find("client_disconnected") != std::string::npos);
}

TEST_CASE("a full queue answers 503 with Retry-After", "[server][scheduler]") {
  REQUIRE_STORIES_MODEL();
  DaemonProcess d(
      "[scheduler]\nslots = 1\nqueue = 1\nretry_after_s = 3\n"
      "[debug]\ndecode_delay_ms = 20\n");
  HttpConnection a(d.port());
  a.Send("POST", "/v1/completions", StreamBody("Once upon a time", 400).dump());
  REQUIRE(a.ReadHead().status == 200);
  EventReader a_events(a);
  REQUIRE(!a_events.Next().empty());  // A runs
  HttpConnection b(d.port());
  b.Send("POST", "/v1/completions", StreamBody("The cat", 400).dump());
  REQUIRE(b.ReadHead().status == 200);  // B waits in the queue
  const auto until = Clock::now() + std::chrono::seconds(5);
  while (MetricValue(Metrics(d.port()), "thermocline_queue_depth") != 1 && Clock::now() < until) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  HttpResponse c = Http(d.port(), "POST", "/v1/completions", StreamBody("Lily", 4).dump());
  INFO(c.body);
  REQUIRE(c.status == 503);
  CHECK(c.header("retry-after") == "3");
  const json e = Json(c.body)["error"];
  CHECK(e["type"] == "unavailable_error");
  CHECK(e["code"] == "queue_full");
  CHECK(MetricValue(Metrics(d.port()), "thermocline_rejected_requests_total") == 1);
  // When A goes, B runs next.
  a.Close();
  EventReader b_events(b);
  const auto start = Clock::now();
  REQUIRE(!b_events.Next().empty());
  CHECK(SecondsSince(start) < 2.0);
}

// The text deltas of a greedy stream, and when its first and last events came (seconds after
// t0). Throws on any protocol error; safe to use from several threads (no Catch2 macros).
std::vector<std::string> Deltas(int port, const std::string& prompt, double* first = nullptr,
                                double* last = nullptr, Clock::time_point t0 = {}) {
  HttpConnection c(port);
  c.Send("POST", "/v1/completions", StreamBody(prompt, 48).dump(), {{"Connection", "close"}});
  if (c.ReadHead().status != 200) throw std::runtime_error("status is not 200");
  EventReader events(c);
  std::vector<std::string> deltas;
  std::string e;
  while (!(e = events.Next()).empty()) {
    if (e == "[DONE]") break;
    if (first != nullptr && deltas.empty()) *first = SecondsSince(t0);
    const json j = json::parse(e);  // throws when not JSON
    if (j.at("choices").at(0).at("finish_reason").is_null()) {
      deltas.push_back(j["choices"][0].at("text"));
    }
  }
  if (last != nullptr) *last = SecondsSince(t0);
  if (e != "[DONE]") throw std::runtime_error("the stream did not end with [DONE]");
  return deltas;
}

TEST_CASE("8 concurrent greedy streams each get what a lone request gets", "[server][scheduler]") {
  REQUIRE_STORIES_MODEL();
  DaemonProcess d("[scheduler]\nslots = 4\nqueue = 8\n[debug]\ndecode_delay_ms = 4\n");
  const json ref = LoadReference("stories260K.reference.json");
  std::vector<std::string> prompts;
  std::vector<std::vector<std::string>> lone;
  for (const json& p : ref["prompts"]) {
    prompts.push_back(p["prompt"]);
    lone.push_back(Deltas(d.port(), prompts.back()));
    std::string text;
    for (const std::string& s : lone.back()) text += s;
    CHECK(text == p["full_text"].get<std::string>().substr(prompts.back().size()));
  }
  constexpr int kStreams = 8;
  std::vector<std::vector<std::string>> got(kStreams);
  std::vector<double> first(kStreams), last(kStreams);
  std::vector<std::string> failures(kStreams);
  const auto t0 = Clock::now();
  std::vector<std::thread> threads;
  for (int i = 0; i < kStreams; ++i) {
    threads.emplace_back([&, i] {
      try {
        got[i] = Deltas(d.port(), prompts[i % prompts.size()], &first[i], &last[i], t0);
      } catch (const std::exception& e) {
        failures[i] = e.what();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  int overlapping = 0;  // streams that were generating while stream 0 was
  for (int i = 0; i < kStreams; ++i) {
    INFO("stream " << i << " " << failures[i]);
    CHECK(failures[i].empty());
    CHECK(got[i] == lone[i % prompts.size()]);
    overlapping += first[i] < last[0] && first[0] < last[i];
  }
  CHECK(overlapping >= 4);  // itself and the 3 other slots
}

TEST_CASE("the request deadline ends generation as 'length'", "[server][scheduler]") {
  REQUIRE_STORIES_MODEL();
  DaemonProcess d("[scheduler]\nrequest_timeout_s = 0.4\n[debug]\ndecode_delay_ms = 20\n");
  const auto start = Clock::now();
  HttpResponse r = Http(d.port(), "POST", "/v1/completions",
                        json{{"model", kModelName},
                             {"prompt", "Once upon a time"},
                             {"max_tokens", 400},
                             {"ignore_eos", true}}
                            .dump());
  REQUIRE(r.status == 200);
  CHECK(SecondsSince(start) < 2.0);
  const json j = Json(r.body);
  CHECK(j["choices"][0]["finish_reason"] == "length");
  CHECK(j["usage"]["completion_tokens"].get<int>() < 100);
  CHECK(MetricValue(Metrics(d.port()), R"(thermocline_cancellations_total{reason="deadline"})") ==
        1);
}

TEST_CASE("SIGTERM lets in-flight streams finish, then exits 0", "[server][scheduler]") {
  REQUIRE_STORIES_MODEL();
  DaemonProcess d("[debug]\ndecode_delay_ms = 10\n");
  HttpConnection a(d.port());
  a.Send("POST", "/v1/completions", StreamBody("Once upon a time", 60).dump());
  REQUIRE(a.ReadHead().status == 200);
  EventReader events(a);
  REQUIRE(!events.Next().empty());
  d.Signal(SIGTERM);
  int deltas = 1;
  std::string e, last;
  while (!(e = events.Next()).empty()) {
    if (e == "[DONE]") break;
    last = e;
    deltas += Json(e)["choices"][0]["finish_reason"].is_null();
  }
  CHECK(e == "[DONE]");
  CHECK(deltas == 60);
  CHECK(Json(last)["choices"][0]["finish_reason"] == "length");
  CHECK(d.Wait() == 0);
  CHECK_THROWS(HttpConnection(d.port()));
}

TEST_CASE("past the shutdown budget, streams end with an error event", "[server][scheduler]") {
  REQUIRE_STORIES_MODEL();
  DaemonProcess d("[server]\nshutdown_timeout_s = 1\n[debug]\ndecode_delay_ms = 20\n");
  HttpConnection a(d.port());
  a.Send("POST", "/v1/completions", StreamBody("Once upon a time", 400).dump());
  REQUIRE(a.ReadHead().status == 200);
  EventReader events(a);
  REQUIRE(!events.Next().empty());
  const auto start = Clock::now();
  d.Signal(SIGINT);
  std::string e, last;
  while (!(e = events.Next()).empty()) last = e;
  INFO(last);
  CHECK(Json(last)["error"]["code"] == "shutting_down");
  CHECK(d.Wait() == 0);
  CHECK(SecondsSince(start) < 4.0);
}

}  // namespace
}  // namespace thermocline::testing
