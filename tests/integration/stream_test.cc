// Streaming over SSE, parsed strictly: HTTP chunked framing, `data: {json}\n\n` events only,
// the role chunk first, content deltas, the finish_reason chunk, the include_usage chunk with
// empty choices, then `data: [DONE]`. Streamed text equals the non-streamed text.
#include "daemon_fixture.h"
#include "model_fixtures.h"

namespace thermocline::testing {
namespace {

using nlohmann::json;

struct Stream {
  HttpResponse head;
  std::vector<json> events;  // parsed chunks before [DONE]
  bool done = false;         // ended with [DONE]
};

Stream ReadStream(int port, const std::string& path, const json& body) {
  HttpConnection c(port);
  c.Send("POST", path, body.dump(), {{"Connection", "close"}});
  Stream s;
  s.head = c.ReadHead();
  REQUIRE(s.head.status == 200);
  CHECK(s.head.header("content-type").find("text/event-stream") == 0);
  REQUIRE(s.head.header("transfer-encoding") == "chunked");
  std::string chunk;
  while (c.ReadChunk(&chunk)) {
    // Every chunk holds whole events.
    for (const std::string& payload : ParseSse(chunk)) {
      REQUIRE(!s.done);  // nothing after [DONE]
      if (payload == "[DONE]") {
        s.done = true;
        continue;
      }
      s.events.push_back(Json(payload));
    }
  }
  return s;
}

std::string NonStreamed(int port, const std::string& path, json body) {
  body["stream"] = false;
  HttpResponse r = Http(port, "POST", path, body.dump());
  REQUIRE(r.status == 200);
  const json j = Json(r.body);
  return path == "/v1/completions" ? j["choices"][0]["text"].get<std::string>()
                                   : j["choices"][0]["message"]["content"].get<std::string>();
}

TEST_CASE("chat streams follow the OpenAI chunk protocol", "[server][stream]") {
  REQUIRE_STORIES_MODEL();
  DaemonProcess d;
  const json body = {
      {"model", kModelName}, {"messages", {{{"role", "user"}, {"content", "Once upon a time"}}}},
      {"max_tokens", 24},    {"temperature", 0},
      {"stream", true},      {"stream_options", {{"include_usage", true}}}};
  Stream s = ReadStream(d.port(), "/v1/chat/completions", body);
  REQUIRE(s.done);
  REQUIRE(s.events.size() >= 4);
  const std::string id = s.events[0]["id"];
  CHECK(id.rfind("chatcmpl-", 0) == 0);
  std::string content;
  for (size_t i = 0; i < s.events.size(); ++i) {
    const json& e = s.events[i];
    INFO(i << ": " << e.dump());
    CHECK(e["id"] == id);
    CHECK(e["object"] == "chat.completion.chunk");
    CHECK(e["model"] == kModelName);
    CHECK(e["created"] == s.events[0]["created"]);
    const bool last = i + 1 == s.events.size();
    const bool finish = i + 2 == s.events.size();
    if (last) {  // include_usage: empty choices, usage filled
      CHECK(e["choices"].empty());
      CHECK(e["usage"]["prompt_tokens"].get<int>() > 0);
      CHECK(e["usage"]["total_tokens"] ==
            e["usage"]["prompt_tokens"].get<int>() + e["usage"]["completion_tokens"].get<int>());
      continue;
    }
    CHECK(e["usage"].is_null());
    REQUIRE(e["choices"].size() == 1);
    const json& choice = e["choices"][0];
    CHECK(choice["index"] == 0);
    if (i == 0) {
      CHECK(choice["delta"]["role"] == "assistant");
      CHECK(choice["delta"]["content"] == "");
      CHECK(choice["finish_reason"].is_null());
    } else if (finish) {
      CHECK(choice["delta"].empty());
      CHECK((choice["finish_reason"] == "stop" || choice["finish_reason"] == "length"));
    } else {
      CHECK(!choice["delta"].contains("role"));
      CHECK(choice["finish_reason"].is_null());
      content += choice["delta"]["content"].get<std::string>();
    }
  }
  CHECK(s.events.back()["usage"]["completion_tokens"].get<int>() <= 24);
  CHECK(content == NonStreamed(d.port(), "/v1/chat/completions", body));
}

TEST_CASE("completion streams carry text chunks and end with [DONE]", "[server][stream]") {
  REQUIRE_STORIES_MODEL();
  DaemonProcess d;
  const json ref = LoadReference("stories260K.reference.json");
  const json body = {{"model", kModelName},
                     {"prompt", "Once upon a time"},
                     {"max_tokens", 48},
                     {"temperature", 0},
                     {"stream", true}};
  Stream s = ReadStream(d.port(), "/v1/completions", body);
  REQUIRE(s.done);
  std::string text;
  for (size_t i = 0; i + 1 < s.events.size(); ++i) {
    const json& e = s.events[i];
    CHECK(e["object"] == "text_completion");
    CHECK(e["id"].get<std::string>().rfind("cmpl-", 0) == 0);
    CHECK(e["choices"][0]["finish_reason"].is_null());
    CHECK(!e.contains("usage"));  // no include_usage: no usage key
    text += e["choices"][0]["text"].get<std::string>();
  }
  // One chunk per token for this ASCII text, then the finish chunk.
  CHECK(s.events.size() == 49);
  CHECK(s.events.back()["choices"][0]["finish_reason"] == "length");
  CHECK(s.events.back()["choices"][0]["text"] == "");
  const std::string prompt = ref["prompts"][0]["prompt"];
  CHECK(text == ref["prompts"][0]["full_text"].get<std::string>().substr(prompt.size()));
}

TEST_CASE("stop strings never reach the stream, even split across tokens", "[server][stream]") {
  REQUIRE_STORIES_MODEL();
  DaemonProcess d;
  const std::string full = NonStreamed(d.port(), "/v1/completions",
                                       {{"model", kModelName},
                                        {"prompt", "Once upon a time"},
                                        {"max_tokens", 48},
                                        {"temperature", 0}});
  for (const std::string stop : {"re wa", "little girl", "d Lily."}) {
    INFO(stop);
    Stream s = ReadStream(d.port(), "/v1/completions",
                          {{"model", kModelName},
                           {"prompt", "Once upon a time"},
                           {"max_tokens", 48},
                           {"temperature", 0},
                           {"stream", true},
                           {"stop", {stop}}});
    REQUIRE(s.done);
    std::string text;
    for (const json& e : s.events) text += e["choices"][0]["text"].get<std::string>();
    CHECK(text == full.substr(0, full.find(stop)));
    CHECK(s.events.back()["choices"][0]["finish_reason"] == "stop");
  }
}

TEST_CASE("streamed logprobs cover exactly the streamed tokens", "[server][stream]") {
  REQUIRE_STORIES_MODEL();
  DaemonProcess d;
  Stream s = ReadStream(d.port(), "/v1/chat/completions",
                        {{"model", kModelName},
                         {"messages", {{{"role", "user"}, {"content", "Hi"}}}},
                         {"max_tokens", 10},
                         {"temperature", 0},
                         {"stream", true},
                         {"logprobs", true},
                         {"top_logprobs", 2},
                         {"stream_options", {{"include_usage", true}}}});
  REQUIRE(s.done);
  std::string content, tokens;
  size_t n = 0;
  for (const json& e : s.events) {
    if (e["choices"].empty()) continue;
    const json& c = e["choices"][0];
    if (c["delta"].contains("content")) content += c["delta"]["content"].get<std::string>();
    if (!c["logprobs"].is_null()) {
      for (const json& t : c["logprobs"]["content"]) {
        tokens += t["token"].get<std::string>();
        CHECK(t["top_logprobs"].size() == 2);
        ++n;
      }
    }
  }
  CHECK(tokens == content);
  CHECK(n == s.events.back()["usage"]["completion_tokens"].get<size_t>());
}

}  // namespace
}  // namespace thermocline::testing
