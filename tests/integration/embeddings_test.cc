// /v1/embeddings over real HTTP: the OpenAI shape, unit vectors that depend on the input and the
// pooling and not on the batch they come in, base64 equal to the floats, usage, and the refusals.
#include <cmath>
#include <cstring>

#include "daemon_fixture.h"

namespace thermocline::testing {
namespace {

using nlohmann::json;

json Embeddings(int port, const json& body, int status = 200) {
  HttpResponse r = Http(port, "POST", "/v1/embeddings", body.dump());
  INFO(r.body);
  REQUIRE(r.status == status);
  return Json(r.body);
}

std::vector<float> Vector(const json& item) { return item["embedding"].get<std::vector<float>>(); }

double Norm(const std::vector<float>& v) {
  double s = 0;
  for (float x : v) s += double{x} * x;
  return std::sqrt(s);
}

double MaxDiff(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(double{a[i]} - b[i]));
  return m;
}

std::vector<float> FromBase64(const std::string& s) {
  auto value = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    return c == '+' ? 62 : c == '/' ? 63 : -1;
  };
  std::string bytes;
  uint32_t acc = 0;
  int bits = 0;
  for (char c : s) {
    if (c == '=') break;
    const int v = value(c);
    REQUIRE(v >= 0);
    acc = (acc << 6) | static_cast<uint32_t>(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      bytes.push_back(static_cast<char>((acc >> bits) & 0xff));
    }
  }
  REQUIRE(bytes.size() % 4 == 0);
  std::vector<float> out(bytes.size() / 4);
  std::memcpy(out.data(), bytes.data(), bytes.size());
  return out;
}

TEST_CASE("/v1/embeddings: unit vectors that depend on the input and the pooling",
          "[server][embeddings]") {
  REQUIRE_STORIES_MODEL();
  DaemonProcess d;
  const json one = Embeddings(d.port(), {{"model", kModelName}, {"input", "Once upon a time"}});
  CHECK(one["object"] == "list");
  CHECK(one["model"] == kModelName);
  REQUIRE(one["data"].size() == 1);
  CHECK(one["data"][0]["object"] == "embedding");
  CHECK(one["data"][0]["index"] == 0);
  const std::vector<float> a = Vector(one["data"][0]);
  CHECK(a.size() == 64);  // stories260K's width
  CHECK(std::abs(Norm(a) - 1.0) < 1e-5);
  // BOS + 4 tokens (the reference's prompt_ids of this text).
  CHECK(one["usage"]["prompt_tokens"] == 5);
  CHECK(one["usage"]["total_tokens"] == 5);

  const json three = Embeddings(
      d.port(), {{"model", kModelName},
                 {"input", {"Once upon a time", "The cat sat on the mat", "Once upon a time"}}});
  REQUIRE(three["data"].size() == 3);
  for (int i = 0; i < 3; ++i) CHECK(three["data"][i]["index"] == i);
  const std::vector<float> b = Vector(three["data"][1]);
  CHECK(Vector(three["data"][0]) == a);  // the same input, alone or in a batch
  CHECK(Vector(three["data"][2]) == a);
  CHECK(MaxDiff(a, b) > 1e-2);
  CHECK(std::abs(Norm(b) - 1.0) < 1e-5);
  CHECK(three["usage"]["prompt_tokens"].get<int>() > 10);

  // Token ids: the same tokens give the same vector.
  const json ids =
      Embeddings(d.port(), {{"model", kModelName}, {"input", {1, 403, 407, 261, 378}}});
  CHECK(Vector(ids["data"][0]) == a);
  const json id_arrays =
      Embeddings(d.port(), {{"model", kModelName}, {"input", {{1, 403, 407, 261, 378}, {1, 365}}}});
  REQUIRE(id_arrays["data"].size() == 2);
  CHECK(Vector(id_arrays["data"][0]) == a);

  const json last = Embeddings(
      d.port(), {{"model", kModelName}, {"input", "Once upon a time"}, {"pooling", "last"}});
  const std::vector<float> l = Vector(last["data"][0]);
  CHECK(std::abs(Norm(l) - 1.0) < 1e-5);
  CHECK(MaxDiff(a, l) > 1e-2);

  const json b64 = Embeddings(d.port(), {{"model", kModelName},
                                         {"input", "Once upon a time"},
                                         {"encoding_format", "base64"},
                                         {"dimensions", 64}});
  REQUIRE(b64["data"][0]["embedding"].is_string());
  CHECK(FromBase64(b64["data"][0]["embedding"]) == a);
}

TEST_CASE("/v1/embeddings: refusals name the field", "[server][embeddings]") {
  REQUIRE_STORIES_MODEL();
  DaemonProcess d;
  auto param = [&](const json& body, int status = 400) {
    return Embeddings(d.port(), body, status)["error"]["param"];
  };
  CHECK(param({{"model", kModelName}}) == "input");
  CHECK(param({{"model", kModelName}, {"input", ""}}) == "input");
  CHECK(param({{"model", kModelName}, {"input", json::array()}}) == "input");
  CHECK(param({{"model", kModelName}, {"input", {"a", 3}}}) == "input[1]");
  CHECK(param({{"model", kModelName}, {"input", {1, 99999}}}) == "input");
  CHECK(param({{"model", kModelName}, {"input", "x"}, {"dimensions", 32}}) == "dimensions");
  CHECK(param({{"model", kModelName}, {"input", "x"}, {"encoding_format", "int8"}}) ==
        "encoding_format");
  CHECK(param({{"model", kModelName}, {"input", "x"}, {"pooling", "max"}}) == "pooling");
  CHECK(param({{"input", "x"}}) == "model");
  const json unknown = Embeddings(d.port(), {{"model", "nope"}, {"input", "x"}}, 404);
  CHECK(unknown["error"]["code"] == "model_not_found");
  // Longer than the 512-token context.
  std::string text;
  for (int i = 0; i < 600; ++i) text += " cat";
  const json long_input = Embeddings(d.port(), {{"model", kModelName}, {"input", text}}, 400);
  CHECK(long_input["error"]["type"] == "exceed_context_size_error");
}

TEST_CASE("the embedding and Ollama routes need the API key", "[server][embeddings]") {
  REQUIRE_STORIES_MODEL();
  DaemonProcess d("[server]\napi_keys = [\"k1\"]\n");
  const std::string body = json{{"model", kModelName}, {"input", "x"}}.dump();
  CHECK(Http(d.port(), "POST", "/v1/embeddings", body).status == 401);
  CHECK(Http(d.port(), "GET", "/api/tags").status == 401);
  CHECK(Http(d.port(), "POST", "/api/embed", body).status == 401);
  CHECK(Http(d.port(), "POST", "/v1/embeddings", body, {{"Authorization", "Bearer k1"}}).status ==
        200);
  CHECK(Http(d.port(), "GET", "/api/tags", "", {{"Authorization", "Bearer k1"}}).status == 200);
}

}  // namespace
}  // namespace thermocline::testing
