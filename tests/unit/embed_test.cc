// Embeddings (engine/runtime/embed.h): the final hidden states are the ones the output head reads
// (their product with the head gives Eval's logits), pooling and normalisation, and the same
// vector whether the prompt is evaluated in one chunk or many, on the CPU or through a layer
// backend that owns the head.
#include "engine/runtime/embed.h"

#include <cmath>
#include <filesystem>
#include <vector>

#include "bench/cpu_device.h"
#include "model_fixtures.h"

namespace thermocline {
namespace {

using testing::CachedModel;
using testing::LoadReference;
using testing::NewEngineSession;
using testing::TestModelPath;

std::string Stories() { return TestModelPath("stories260K.gguf"); }

double Norm(const std::vector<float>& v) {
  double s = 0;
  for (float x : v) s += static_cast<double>(x) * x;
  return std::sqrt(s);
}

double MaxAbsDiff(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(double{a[i]} - b[i]));
  return m;
}

const std::vector<int32_t> kPrompt = {1, 403, 407, 261, 378, 432, 383, 290, 262, 281, 300};

TEST_CASE("final hidden states times the head are the logits", "[embed]") {
  if (!std::filesystem::exists(Stories())) THERMOCLINE_SKIP("stories260K.gguf not found");
  const LlamaModel& model = CachedModel(Stories());
  const LlamaHparams& h = model.hparams();
  REQUIRE(model.output().type == GgmlType::kF32);  // the rows below are read as floats
  ThreadPool pool(1);
  EngineOptions o;
  o.kv_type = KvType::kF32;  // the reference computes attention in full precision
  auto s = NewEngineSession(model, std::nullopt, pool, o);
  const nlohmann::json ref = LoadReference("stories260K.reference.json");
  for (const nlohmann::json& p : ref["prompts"]) {
    INFO(p["prompt"].get<std::string>());
    const std::vector<int32_t> ids = p["prompt_ids"];
    const std::vector<float> first = p["first_logits"];
    std::vector<float> hidden(ids.size() * h.n_embd);
    s->session().Reset();
    REQUIRE(s->session().EvalHidden(ids, hidden.data()).ok());
    CHECK(s->session().n_past() == static_cast<int64_t>(ids.size()));
    const float* last = hidden.data() + (ids.size() - 1) * h.n_embd;
    double max_err = 0;
    for (int64_t v = 0; v < h.n_vocab; ++v) {
      const float* row = reinterpret_cast<const float*>(model.output().row(v));
      double dot = 0;
      for (int64_t c = 0; c < h.n_embd; ++c) dot += double{row[c]} * last[c];
      max_err = std::max(max_err, std::abs(dot - first[v]));
    }
    // The reference's logits are independent (llama.cpp-checked); 1e-3 absolute on logits of
    // magnitude ~10 is float summation order, a wrong norm or position moves them by O(1).
    CHECK(max_err < 1e-3);
  }
}

TEST_CASE("embeddings: unit norm, deterministic, pooling and inputs matter", "[embed]") {
  if (!std::filesystem::exists(Stories())) THERMOCLINE_SKIP("stories260K.gguf not found");
  const LlamaModel& model = CachedModel(Stories());
  ThreadPool pool(1);
  auto s = NewEngineSession(model, std::nullopt, pool);
  auto mean = Embed(s->session(), kPrompt, {});
  REQUIRE(mean.ok());
  CHECK(mean->size() == static_cast<size_t>(model.hparams().n_embd));
  CHECK(std::abs(Norm(*mean) - 1.0) < 1e-5);  // float rounding of a normalised double vector
  auto again = Embed(s->session(), kPrompt, {});
  REQUIRE(again.ok());
  CHECK(*again == *mean);
  const std::vector<int32_t> other = {1, 365, 417, 262, 285};
  auto different = Embed(s->session(), other, {});
  REQUIRE(different.ok());
  CHECK(MaxAbsDiff(*different, *mean) > 1e-2);
  EmbedOptions last;
  last.pooling = Pooling::kLast;
  auto last_vec = Embed(s->session(), kPrompt, last);
  REQUIRE(last_vec.ok());
  CHECK(std::abs(Norm(*last_vec) - 1.0) < 1e-5);
  CHECK(MaxAbsDiff(*last_vec, *mean) > 1e-2);
  EmbedOptions raw;
  raw.normalize = false;
  auto unnormed = Embed(s->session(), kPrompt, raw);
  REQUIRE(unnormed.ok());
  const double n = Norm(*unnormed);
  CHECK(std::abs(n - 1.0) > 1e-3);
  for (size_t i = 0; i < mean->size(); ++i) CHECK(std::abs((*unnormed)[i] / n - (*mean)[i]) < 1e-5);
  // A one-token input: mean and last are the same state.
  const std::vector<int32_t> one = {1};
  auto m1 = Embed(s->session(), one, {});
  auto l1 = Embed(s->session(), one, last);
  REQUIRE(m1.ok());
  REQUIRE(l1.ok());
  CHECK(MaxAbsDiff(*m1, *l1) < 1e-6);
}

TEST_CASE("embeddings: refused inputs and cancellation", "[embed]") {
  if (!std::filesystem::exists(Stories())) THERMOCLINE_SKIP("stories260K.gguf not found");
  const LlamaModel& model = CachedModel(Stories());
  ThreadPool pool(1);
  EngineOptions o;
  o.n_ctx = 8;
  o.max_batch = 4;
  auto s = NewEngineSession(model, std::nullopt, pool, o);
  CHECK(Embed(s->session(), {}, {}).status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(Embed(s->session(), kPrompt, {}).status().code() == absl::StatusCode::kOutOfRange);
  const std::vector<int32_t> bad = {1, 99999};
  CHECK(Embed(s->session(), bad, {}).status().code() == absl::StatusCode::kInvalidArgument);
  int chunks = 0;
  const std::vector<int32_t> eight(kPrompt.begin(), kPrompt.begin() + 8);
  auto cancelled = Embed(s->session(), eight, {}, [&] { return ++chunks < 2; });
  CHECK(cancelled.status().code() == absl::StatusCode::kCancelled);
  CHECK(chunks == 2);
}

TEST_CASE("embeddings: the same vector in any chunking and through a layer backend", "[embed]") {
  if (!std::filesystem::exists(Stories())) THERMOCLINE_SKIP("stories260K.gguf not found");
  const LlamaModel& model = CachedModel(Stories());
  ThreadPool pool(2);
  EngineOptions big;
  big.n_ctx = 64;
  big.max_batch = 64;
  big.kv_type = KvType::kF32;  // as the stand-in device's cache, for its 1e-4 below
  auto one_chunk = NewEngineSession(model, std::nullopt, pool, big);
  EngineOptions small = big;
  small.max_batch = 3;  // the prompt crosses chunks
  auto chunked = NewEngineSession(model, std::nullopt, pool, small);
  CpuStandInDevice device;
  EngineOptions on_device = small;
  on_device.device = &device;
  on_device.gpu_layers = gpu::kAutoLayers;  // every layer and the head on the "device"
  auto device_session = NewEngineSession(model, std::nullopt, pool, on_device);
  REQUIRE(device_session->placement().output_gpu);
  for (Pooling pooling : {Pooling::kMean, Pooling::kLast}) {
    INFO(PoolingName(pooling));
    EmbedOptions e;
    e.pooling = pooling;
    auto a = Embed(one_chunk->session(), kPrompt, e);
    auto b = Embed(chunked->session(), kPrompt, e);
    auto c = Embed(device_session->session(), kPrompt, e);
    REQUIRE(a.ok());
    REQUIRE(b.ok());
    REQUIRE(c.ok());
    // Chunks change only the matmuls' batch shapes (float summation order): 1e-5 on unit
    // vectors; the stand-in device sums in its own order through 5 layers: 1e-4.
    CHECK(MaxAbsDiff(*a, *b) < 1e-5);
    CHECK(MaxAbsDiff(*a, *c) < 1e-4);
  }
  CHECK(device.layer_calls() > 0);
}

}  // namespace
}  // namespace thermocline
