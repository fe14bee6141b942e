// The KV cache under the daemon's prefix cache: a session truncated to a prefix and continued
// computes what a fresh prefill of that prefix and the continuation computes, on every engine
// path (CPU dense, CPU sparse, whole layers and the hybrid placement on the CPU stand-in
// device, and on CUDA where one exists: their KV caches live on the device), and Generate's
// cached prompt prefix and cancellable prefill.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <random>

#include "bench/cpu_device.h"
#include "engine/gpu/gpu_backend.h"
#include "engine/runtime/engine.h"
#include "engine/runtime/generate.h"
#include "model_fixtures.h"

namespace thermocline {
namespace {

using testing::CachedModel;
using testing::NewEngineSession;
using testing::TestModelPath;

const std::vector<int32_t> kPrefix = {1, 403, 261, 290, 7, 45, 300, 51, 88};  // 9: crosses chunks
const std::vector<int32_t> kStale = {120, 33, 402, 77, 15, 260};  // overwritten by the next
const std::vector<int32_t> kNext = {99, 310, 12, 404, 61};

EngineOptions Options(const gpu::Device* device) {
  EngineOptions o;
  o.n_ctx = 64;
  o.max_batch = 4;
  o.device = device;
  return o;
}

std::vector<int32_t> Concat(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  std::vector<int32_t> out = a;
  out.insert(out.end(), b.begin(), b.end());
  return out;
}

double MaxRelDiff(const std::vector<float>& got, const std::vector<float>& want) {
  double diff = 0, scale = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    diff = std::max(diff, std::fabs(double{got[i]} - want[i]));
    scale = std::max(scale, std::fabs(double{want[i]}));
  }
  return diff / std::max(scale, 1e-6);
}

// Exact active sets on every layer; with a device, attention on every layer and the head there
// and a random half of the neurons.
SparsePlan Oracle(const LlamaModel& model, bool device) {
  const LlamaHparams& h = model.hparams();
  SparsePlan plan;
  plan.source = SparsePlan::Source::kOracle;
  plan.oracle = true;
  plan.layers.resize(h.n_layer);
  plan.attention_gpu.assign(h.n_layer, device ? 1 : 0);
  plan.output_gpu = device;
  std::mt19937 rng(3);
  if (device) {
    for (SparseLayerPlan& p : plan.layers) {
      for (int32_t i = 0; i < h.n_ff; ++i) {
        if (rng() % 2) p.device_neurons.push_back(i);
      }
    }
  }
  return plan;
}

// kNext's logits after kPrefix, every row.
std::vector<float> NextLogits(Session& s) {
  std::vector<float> rows(kNext.size() * s.model().hparams().n_vocab);
  REQUIRE(s.Eval(kNext, rows.data()).ok());
  return rows;
}

void CheckTruncation(EngineSession& es) {
  Session& s = es.session();
  s.Reset();
  REQUIRE(s.Eval(kPrefix).ok());
  const std::vector<float> want = NextLogits(s);

  // The same prefix with other tokens after it, cut back to the prefix: the stale positions
  // (on the device too, where its layers keep their KV cache) must not be seen.
  s.Reset();
  REQUIRE(s.Eval(Concat(kPrefix, kStale)).ok());
  s.Truncate(static_cast<int64_t>(kPrefix.size()));
  REQUIRE(s.n_past() == static_cast<int64_t>(kPrefix.size()));
  const std::vector<float> got = NextLogits(s);
  // The prefix was computed in other chunks here (its last token in a chunk with stale ones),
  // so sums may run in another order (a lone token's dot and a tile's differ; a sparse FFN
  // takes a lone token through its sparse path, exact for oracle sets), and where that order
  // crosses a rounding boundary of the F16 KV cache an entry moves by 2^-11 of itself: 1e-3
  // relative (AVX2 measured 1.8e-4, AVX-512 under 1e-4). A stale position or a wrong one moves
  // the logits by more than 1e-2, as the control below shows.
  CHECK(MaxRelDiff(got, want) <= 1e-3);

  // Control: without the truncation, kNext follows the stale tokens and its logits differ.
  s.Reset();
  REQUIRE(s.Eval(Concat(kPrefix, kStale)).ok());
  CHECK(MaxRelDiff(NextLogits(s), want) > 1e-2);

  // Generate with the prefix cached gives a fresh prefill's greedy tokens.
  GenerateOptions g;
  g.max_tokens = 16;
  g.sampling.temperature = 0;
  g.stop_at_end_of_generation = false;
  const std::vector<int32_t> prompt = Concat(kPrefix, kNext);
  s.Reset();
  auto fresh = Generate(s, prompt, g);
  REQUIRE(fresh.ok());
  CHECK(fresh->prompt_cached == 0);
  CHECK(fresh->prompt_computed == static_cast<int64_t>(prompt.size()));
  s.Reset();
  REQUIRE(s.Eval(Concat(kPrefix, kStale)).ok());
  s.Truncate(static_cast<int64_t>(kPrefix.size()));
  g.cached_prompt = static_cast<int64_t>(kPrefix.size());
  auto cached = Generate(s, prompt, g);
  REQUIRE(cached.ok());
  CHECK(cached->tokens == fresh->tokens);
  CHECK(cached->prompt_tokens == static_cast<int64_t>(prompt.size()));
  CHECK(cached->prompt_cached == static_cast<int64_t>(kPrefix.size()));
  CHECK(cached->prompt_computed == static_cast<int64_t>(kNext.size()));
}

const char* const kModels[] = {"stories260K.gguf", "relu-tiny.f32.gguf"};

TEST_CASE("prefix cache: a truncated KV cache continues as a fresh prefill, on the CPU",
          "[engine][cache]") {
  ThreadPool pool(2);
  for (const char* name : kModels) {
    const std::string path = TestModelPath(name);
    if (!std::filesystem::exists(path)) THERMOCLINE_SKIP(std::string(name) + " not found");
    INFO(name);
    const LlamaModel& model = CachedModel(path);
    auto dense = NewEngineSession(model, std::nullopt, pool, Options(nullptr));
    CheckTruncation(*dense);
    if (std::string(name) == "relu-tiny.f32.gguf") {
      INFO("sparse, oracle");
      auto sparse = NewEngineSession(model, Oracle(model, false), pool, Options(nullptr));
      REQUIRE(sparse->sparse() != nullptr);
      CheckTruncation(*sparse);
    }
  }
}

void DeviceCases(const gpu::Device* device) {
  const std::string path = TestModelPath("relu-tiny.f32.gguf");
  if (!std::filesystem::exists(path)) THERMOCLINE_SKIP("relu-tiny.f32.gguf not found");
  const LlamaModel& model = CachedModel(path);
  ThreadPool pool(2);
  {
    INFO("whole layers and the head on the device");
    EngineOptions o = Options(device);
    o.gpu_layers = gpu::kAutoLayers;
    auto s = NewEngineSession(model, std::nullopt, pool, o);
    REQUIRE(s->gpu_layers() != nullptr);
    CheckTruncation(*s);
  }
  {
    INFO("hybrid: attention and half the neurons on the device");
    EngineOptions o = Options(device);
    o.gpu_memory = uint64_t{1} << 30;
    auto s = NewEngineSession(model, Oracle(model, true), pool, o);
    INFO(DescribePlacement(s->placement()));
    REQUIRE(s->placement().attention_gpu_layers == model.hparams().n_layer);
    CheckTruncation(*s);
  }
}

TEST_CASE(
    "prefix cache: a truncated KV cache on the device (stand-in) continues as a fresh "
    "prefill",
    "[engine][cache][gpu]") {
  CpuStandInDevice device;
  DeviceCases(&device);
  CHECK(device.layer_calls() > 0);
}

TEST_CASE("prefix cache: a truncated KV cache on the CUDA device continues as a fresh prefill",
          "[cuda]") {
  if (!gpu::DeviceAvailable()) THERMOCLINE_SKIP("no CUDA device: [cuda] case skipped");
  DeviceCases(&gpu::CudaDevice());
}

TEST_CASE("Generate: a cached prefix must match the session; prefill stops between chunks",
          "[engine][cache]") {
  const std::string path = TestModelPath("stories260K.gguf");
  if (!std::filesystem::exists(path)) THERMOCLINE_SKIP("stories260K.gguf not found");
  ThreadPool pool(1);
  auto es = NewEngineSession(CachedModel(path), std::nullopt, pool, Options(nullptr));
  Session& s = es->session();
  const std::vector<int32_t> prompt = Concat(Concat(kPrefix, kStale), kNext);  // 20: 5 chunks
  GenerateOptions g;
  g.max_tokens = 4;
  s.Reset();
  g.cached_prompt = 3;  // the session holds nothing
  CHECK(Generate(s, prompt, g).status().code() == absl::StatusCode::kInvalidArgument);
  REQUIRE(s.Eval(prompt).ok());
  g.cached_prompt = static_cast<int64_t>(prompt.size());  // nothing left to evaluate
  CHECK(Generate(s, prompt, g).status().code() == absl::StatusCode::kInvalidArgument);

  s.Reset();
  g.cached_prompt = 0;
  int asked = 0;
  g.cancel_prefill = [&] { return ++asked == 2; };  // before the third chunk
  auto r = Generate(s, prompt, g);
  REQUIRE(r.ok());
  CHECK(r->stop_reason == StopReason::kCancelled);
  CHECK(r->prompt_computed == 8);
  CHECK(r->tokens.empty());
  CHECK(s.n_past() == 8);
  CHECK(asked == 2);
}

}  // namespace
}  // namespace thermocline
