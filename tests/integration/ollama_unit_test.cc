// Pieces of the Ollama and embedding front ends without a daemon: keep_alive durations, the
// timestamp format, the float and base64 encodings.
#include "server/embeddings.h"
#include "server/ollama_api.h"
#include "test_util.h"

namespace thermocline::server {
namespace {

using nlohmann::json;

int64_t Ms(const json& v) {
  auto d = ParseKeepAlive(v);
  INFO(v.dump() << ": " << d.status().ToString());
  REQUIRE(d.ok());
  return d->count();
}

TEST_CASE("keep_alive: Go durations, seconds, negative forever", "[server][ollama]") {
  CHECK(Ms("5m") == 300000);
  CHECK(Ms("1h30m") == 5400000);
  CHECK(Ms("250ms") == 250);
  CHECK(Ms("1.5s") == 1500);
  CHECK(Ms("2h45m30.5s") == 9930500);
  CHECK(Ms("0") == 0);
  CHECK(Ms("3600") == 3600000);
  CHECK(Ms(10) == 10000);
  CHECK(Ms(0.5) == 500);
  CHECK(Ms(0) == 0);
  CHECK(Ms(-1) == -1);
  CHECK(Ms("-1") == -1);
  CHECK(Ms("-5m") == -1);
  for (const json& bad :
       {json("5x"), json(""), json("m"), json("5 m"), json(true), json::array()}) {
    INFO(bad.dump());
    CHECK_FALSE(ParseKeepAlive(bad).ok());
  }
}

TEST_CASE("Ollama timestamps are RFC 3339 UTC with nanoseconds", "[server][ollama]") {
  const auto t = std::chrono::system_clock::time_point(
      std::chrono::duration_cast<std::chrono::system_clock::duration>(
          std::chrono::nanoseconds(int64_t{1700000000} * 1000000000 + 123456789)));
  CHECK(OllamaTimestamp(t) == "2023-11-14T22:13:20.123456789Z");
  CHECK(OllamaTaggedName("stories") == "stories:latest");
  CHECK(OllamaTaggedName("llama3:8b") == "llama3:8b");
}

TEST_CASE("embedding encodings: shortest floats, base64 of float32", "[server][embeddings]") {
  std::string out;
  AppendFloatArray({1.0f, -0.5f, 0.1f, 3.0e-8f}, &out);
  CHECK(out == "[1,-0.5,0.1,3e-08]");
  CHECK(Base64Floats({1.0f}) == "AACAPw==");
  CHECK(Base64Floats({1.0f, -2.0f}) == "AACAPwAAAMA=");
  CHECK(Base64Floats({1.0f, -2.0f, 0.0f}) == "AACAPwAAAMAAAAAA");
  CHECK(Base64Floats({}).empty());
}

}  // namespace
}  // namespace thermocline::server
