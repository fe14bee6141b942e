// The engine's front door (engine/runtime/engine.h) with a device: whole layers (-ngl), the
// hybrid placement (attention layers and hot neurons on the device, the rest on the CPU) under
// caps that hold all of it, only the hot neurons, or nothing, and the one budget that sessions
// share. The device is the CPU stand-in (bench/cpu_device.h), so these are the split and merge
// that `serve --gpu-memory` uses, checked on every machine ([gpu]); the same cases run on the
// CUDA backend where a device exists ([cuda]). Without a device the front door serves from the
// CPU and says why.
#include "engine/runtime/engine.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <tuple>

#include "bench/cpu_device.h"
#include "engine/gpu/gpu_backend.h"
#include "engine/model/quant_mix.h"
#include "engine/model/quantize.h"
#include "model_fixtures.h"
#include "offline/pipeline.h"
#include "offline/solver/hardware.h"
#include "offline/sparse_source.h"

namespace thermocline {
namespace {

using testing::CachedModel;
using testing::NewEngineSession;
using testing::TestModelPath;

const std::vector<int32_t> kPrompt = {1, 403, 261, 290, 7, 45, 300};

EngineOptions Options(const gpu::Device* device) {
  EngineOptions o;
  // F32 KV caches on both sides (the device's follows the session's, docs/cuda.md), so that the
  // device is held to 1e-3 of the logits' range: the F16 cache's half rounding of q and the
  // softmax weights alone moves a quantized relu-tiny's logits by ~1% of their range (F16 vs F32
  // on the CPU). The F16 cache on both sides has its own cases (kF16CacheTolerance).
  o.kv_type = KvType::kF32;
  o.n_ctx = 96;
  o.max_batch = 4;  // the prompt crosses chunks
  o.device = device;
  return o;
}

// Every row's logits of the prompt from an empty cache.
std::vector<float> PromptLogits(Session& s) {
  std::vector<float> all(kPrompt.size() * s.model().hparams().n_vocab);
  s.Reset();
  REQUIRE(s.Eval(kPrompt, all.data()).ok());
  return all;
}

double MaxRelDiff(const std::vector<float>& got, const std::vector<float>& want) {
  double diff = 0, scale = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    diff = std::max(diff, std::fabs(double{got[i]} - want[i]));
    scale = std::max(scale, std::fabs(double{want[i]}));
  }
  return diff / std::max(scale, 1e-6);
}

// The oracle plan (exact active sets: equal to dense up to summation order) with attention on
// the device where `attention` says, the head there when `head`, and a random `fraction` of
// every layer's neurons on the device.
SparsePlan OraclePlan(const LlamaModel& model, std::vector<uint8_t> attention, bool head,
                      double fraction, uint32_t seed) {
  const LlamaHparams& h = model.hparams();
  SparsePlan plan;
  plan.source = SparsePlan::Source::kOracle;
  plan.oracle = true;
  plan.layers.resize(h.n_layer);
  std::mt19937 rng(seed);
  for (SparseLayerPlan& p : plan.layers) {
    for (int32_t i = 0; i < h.n_ff; ++i) {
      if (std::uniform_real_distribution<>(0, 1)(rng) < fraction) p.device_neurons.push_back(i);
    }
  }
  plan.attention_gpu = std::move(attention);
  plan.output_gpu = head;
  return plan;
}

// kv: both sides' KV cache type; tolerance: the logits' relative difference allowed.
void WholeLayers(const gpu::Device* device, const LlamaModel& model, KvType kv = KvType::kF32,
                 double tolerance = 1e-3) {
  const LlamaHparams& h = model.hparams();
  ThreadPool pool(2);
  EngineOptions on_cpu = Options(nullptr);
  on_cpu.kv_type = kv;
  auto cpu = NewEngineSession(model, std::nullopt, pool, on_cpu);
  const std::vector<int32_t> want = testing::GreedyIds(cpu->session(), kPrompt, 24);
  const std::vector<float> want_logits = PromptLogits(cpu->session());
  for (int64_t n : {int64_t{1}, h.n_layer / 2, gpu::kAutoLayers}) {
    INFO("--gpu-layers " << n);
    EngineOptions o = Options(device);
    o.kv_type = kv;
    o.gpu_layers = n;
    auto s = NewEngineSession(model, std::nullopt, pool, o);
    const EnginePlacement& p = s->placement();
    CHECK(p.note.empty());
    CHECK_FALSE(p.device.empty());
    CHECK(p.gpu_layers == (n == gpu::kAutoLayers ? h.n_layer : n));
    CHECK(p.output_gpu == (n == gpu::kAutoLayers));  // the head goes along when all layers do
    CHECK(p.gpu_bytes > 0);
    CHECK(s->device_bytes() == p.gpu_bytes);
    CHECK(testing::GreedyIds(s->session(), kPrompt, 24) == want);
    // The device's layers sum in other orders than the CPU's SIMD: 1e-3 relative leaves room
    // for that through every layer without hiding a wrong position or head (those move logits
    // by O(1)).
    CHECK(MaxRelDiff(PromptLogits(s->session()), want_logits) <= tolerance);
  }
}

// With the engine's default F16 cache the device keeps its layers' K and V in half and rounds q
// and the softmax weights to half, as the CPU's F16 cache does; the two then differ where a
// float sum of another order rounds to the neighbouring half (2^-11 relative) in a product:
// 2e-3 of the logits' range leaves room for that, not for a wrong position or head (O(1)).
constexpr double kF16CacheTolerance = 2e-3;

void Hybrid(const gpu::Device* device, const LlamaModel& model, const CpuStandInDevice* stand_in) {
  const LlamaHparams& h = model.hparams();
  const int64_t n = h.n_layer;
  ThreadPool pool(2);
  auto cpu = NewEngineSession(model, std::nullopt, pool, Options(nullptr));
  const std::vector<int32_t> want = testing::GreedyIds(cpu->session(), kPrompt, 24);
  const std::vector<float> want_logits = PromptLogits(cpu->session());
  std::vector<uint8_t> middle(n, 0), tail(n, 0), alternate(n, 0), none(n, 0), every(n, 1);
  for (int64_t l = 0; l < n; ++l) {
    middle[l] = l >= 1 && l < n - 1;
    tail[l] = l >= n / 2;
    alternate[l] = l % 2;
  }
  struct Case {
    const char* what;
    std::vector<uint8_t> attention;
    bool head;
    double fraction;
    bool odd_layers_without_neurons = false;  // attention on the device, no neuron there
  };
  for (const Case& c :
       {Case{"middle attention, 30% of the neurons", middle, false, 0.3},
        Case{"tail attention and the head", tail, true, 0.5},
        Case{"alternate attention", alternate, false, 0.1},
        Case{"every layer and the head, every neuron", every, true, 1.0},
        Case{"hot neurons only", none, false, 0.4},
        // A solved placement can put a layer's attention on the device and none of its neurons:
        // that layer runs its FFN on the host (the non-resident form), the others resident.
        Case{"every attention layer, neurons in the even layers only", every, true, 0.5, true}}) {
    INFO(c.what);
    const int64_t n_attn = std::count(c.attention.begin(), c.attention.end(), 1);
    EngineOptions o = Options(device);
    o.gpu_memory = uint64_t{4} << 30;
    const int64_t launches = stand_in ? stand_in->ffn_launches() : 0;
    const int64_t calls = stand_in ? stand_in->layer_calls() : 0;
    const int64_t residents = stand_in ? stand_in->resident_calls() : 0;
    SparsePlan plan = OraclePlan(model, c.attention, c.head, c.fraction, 5);
    if (c.odd_layers_without_neurons) {
      for (int64_t l = 1; l < n; l += 2) plan.layers[l].device_neurons.clear();
    }
    auto s = NewEngineSession(model, std::move(plan), pool, o);
    const EnginePlacement& p = s->placement();
    INFO(DescribePlacement(p));
    CHECK(p.note.empty());
    CHECK(p.attention_gpu_layers == n_attn);
    CHECK(p.output_gpu == c.head);
    CHECK(p.gpu_neurons > 0);
    CHECK(p.gpu_neurons < p.ffn_neurons + 1);
    CHECK(testing::GreedyIds(s->session(), kPrompt, 24) == want);
    // Oracle sets are exact: the logits equal dense up to float summation order (the device
    // part's partial sums are added to the host's), as above.
    CHECK(MaxRelDiff(PromptLogits(s->session()), want_logits) <= 1e-3);
    if (stand_in != nullptr) {
      CHECK(stand_in->ffn_launches() > launches);  // the device part ran, and was merged
      CHECK((stand_in->layer_calls() > calls) == (n_attn > 0));
      // Attention on the device: its layers ran resident (only the host's partial came back).
      CHECK((stand_in->resident_calls() > residents) == (n_attn > 0));
    }
  }
}

// Three caps: all of the placement, its hot neurons without its attention layers, nothing.
void HybridCaps(const gpu::Device* device, const LlamaModel& model) {
  const int64_t n = model.hparams().n_layer;
  ThreadPool pool(2);
  auto cpu = NewEngineSession(model, std::nullopt, pool, Options(nullptr));
  const std::vector<int32_t> want = testing::GreedyIds(cpu->session(), kPrompt, 24);
  const std::vector<uint8_t> every(n, 1);
  EngineOptions o = Options(device);
  o.gpu_memory = uint64_t{4} << 30;
  auto roomy = NewEngineSession(model, OraclePlan(model, every, true, 0.5, 9), pool, o);
  REQUIRE(roomy->placement().attention_gpu_layers == n);
  const uint64_t neurons_only = roomy->sparse()->gpu_device_bytes();
  REQUIRE(neurons_only > 0);
  REQUIRE(roomy->device_bytes() > neurons_only);

  o.gpu_memory = neurons_only;  // the hot neurons fit, the attention layers do not
  auto tight = NewEngineSession(model, OraclePlan(model, every, true, 0.5, 9), pool, o);
  INFO(DescribePlacement(tight->placement()));
  CHECK(tight->placement().attention_gpu_layers == 0);
  CHECK(tight->placement().gpu_neurons == roomy->placement().gpu_neurons);
  CHECK_THAT(tight->placement().note, Catch::Contains("hot neurons only"));
  CHECK(tight->device_bytes() <= neurons_only);
  CHECK(testing::GreedyIds(tight->session(), kPrompt, 24) == want);

  o.gpu_memory = 4096;  // nothing fits
  auto none = NewEngineSession(model, OraclePlan(model, every, true, 0.5, 9), pool, o);
  CHECK(none->placement().gpu_neurons == 0);
  CHECK(none->device_bytes() == 0);
  CHECK_THAT(none->placement().note, Catch::Contains("runs on the CPU"));
  CHECK(testing::GreedyIds(none->session(), kPrompt, 24) == want);
}

TEST_CASE("front door, stand-in device: whole layers give the CPU's tokens and logits", "[gpu]") {
  for (const char* name : {"stories260K.gguf", "relu-tiny.f32.gguf"}) {
    const std::string path = TestModelPath(name);
    if (!std::filesystem::exists(path)) THERMOCLINE_SKIP(std::string(name) + " not found");
    INFO(name);
    CpuStandInDevice device;
    WholeLayers(&device, CachedModel(path));
    CHECK(device.layer_calls() > 0);
  }
}

TEST_CASE("front door, stand-in device: the hybrid placement gives the CPU's tokens", "[gpu]") {
  const std::string path = TestModelPath("relu-tiny.f32.gguf");
  if (!std::filesystem::exists(path)) THERMOCLINE_SKIP("relu-tiny.f32.gguf not found");
  CpuStandInDevice device;
  Hybrid(&device, CachedModel(path), &device);
}

TEST_CASE("front door, stand-in device: three caps, the same tokens", "[gpu]") {
  const std::string path = TestModelPath("relu-tiny.f32.gguf");
  if (!std::filesystem::exists(path)) THERMOCLINE_SKIP("relu-tiny.f32.gguf not found");
  CpuStandInDevice device;
  HybridCaps(&device, CachedModel(path));
}

// relu-tiny's sidecar from the offline pipeline (predictors trained on the profile corpus), with a
// placement set here: the hottest `fraction` of every layer's neurons on the device, attention
// where `attention` says.
SparsePlan ProfiledPlan(const LlamaModel& model, ThreadPool& pool, std::vector<uint8_t> attention,
                        double fraction) {
  static const std::string sidecar = [&] {
    offline::PipelineOptions o;  // a short profile keeps the test fast
    o.run.corpus_path = TestModelPath("tinystories-profile.txt");
    o.run.tokens = 2048;
    o.profiler.max_samples = 2048;
    auto r = offline::RunProfilePipeline(model, "relu-tiny.f32.gguf", pool, o, nullptr);
    REQUIRE(r.ok());
    const std::string path = (testing::TempDir() / "engine-relu-tiny.thermo.gguf").string();
    REQUIRE(offline::WriteSidecar(r->sidecar, path).ok());
    return path;
  }();
  auto plan = offline::LoadSparsePlan(sidecar, model);
  REQUIRE(plan.ok());
  for (SparseLayerPlan& p : plan->layers) {
    std::vector<int32_t> order(model.hparams().n_ff);
    for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int32_t>(i);
    std::stable_sort(order.begin(), order.end(),
                     [&](int32_t a, int32_t b) { return p.fire_count[a] > p.fire_count[b]; });
    p.device_neurons.assign(order.begin(),
                            order.begin() + static_cast<int64_t>(fraction * order.size()));
  }
  plan->attention_gpu = std::move(attention);
  plan->output_gpu = true;
  return *std::move(plan);
}

// The profiled plan split between `device` and the host gives the CPU sparse path's greedy
// tokens: attention and hot neurons, hot neurons alone, a cap too small for anything, and whole
// dense layers on the device with the sparse FFN on the CPU layers.
void TrainedPredictorsSplit(const gpu::Device* device, const CpuStandInDevice* stand_in,
                            const LlamaModel& model) {
  const int64_t n = model.hparams().n_layer;
  ThreadPool pool(2);
  std::vector<uint8_t> every(n, 1), none(n, 0);
  auto cpu = NewEngineSession(model, ProfiledPlan(model, pool, every, 0.4), pool, Options(nullptr));
  REQUIRE(cpu->sparse() != nullptr);
  const std::vector<int32_t> want = testing::GreedyIds(cpu->session(), kPrompt, 24);
  struct Case {
    const char* what;
    std::vector<uint8_t> attention;
    uint64_t cap;
    int64_t whole_layers;
  };
  for (const Case& c : {Case{"attention and hot neurons", every, uint64_t{4} << 30, kNoGpuLayers},
                        Case{"hot neurons only", none, uint64_t{4} << 30, kNoGpuLayers},
                        Case{"a cap too small for anything", every, 4096, kNoGpuLayers},
                        Case{"whole layers, sparse CPU layers", every, 0, n / 2}}) {
    INFO(c.what);
    EngineOptions o = Options(device);
    o.gpu_memory = c.cap;
    o.gpu_layers = c.whole_layers;
    const int64_t residents = stand_in ? stand_in->resident_calls() : 0;
    auto s = NewEngineSession(model, ProfiledPlan(model, pool, c.attention, 0.4), pool, o);
    INFO(DescribePlacement(s->placement()));
    CHECK(testing::GreedyIds(s->session(), kPrompt, 24) == want);
    if (c.whole_layers != kNoGpuLayers) {
      CHECK(s->placement().gpu_layers == c.whole_layers);
      CHECK(s->sparse() != nullptr);  // the CPU layers stay sparse
    } else if (c.cap > 4096) {
      CHECK(s->placement().gpu_neurons > 0);
      if (stand_in) CHECK((stand_in->resident_calls() > residents) == (c.attention == every));
    } else {
      CHECK(s->placement().gpu_neurons == 0);
    }
  }
}

TEST_CASE(
    "front door, stand-in device: trained predictors split between device and host give "
    "the CPU sparse path's tokens, at three caps and with whole layers",
    "[gpu][sparse]") {
  const std::string path = TestModelPath("relu-tiny.f32.gguf");
  if (!std::filesystem::exists(path)) THERMOCLINE_SKIP("relu-tiny.f32.gguf not found");
  if (!std::filesystem::exists(TestModelPath("tinystories-profile.txt"))) {
    THERMOCLINE_SKIP("tinystories-profile.txt not found");
  }
  CpuStandInDevice device;
  TrainedPredictorsSplit(&device, &device, CachedModel(path));
}

TEST_CASE("a placement the solver fits under a cap fits under it when it runs", "[gpu][solver]") {
  const std::string path = TestModelPath("relu-tiny.f32.gguf");
  if (!std::filesystem::exists(path)) THERMOCLINE_SKIP("relu-tiny.f32.gguf not found");
  if (!std::filesystem::exists(TestModelPath("tinystories-profile.txt"))) {
    THERMOCLINE_SKIP("tinystories-profile.txt not found");
  }
  const LlamaModel& model = CachedModel(path);
  ThreadPool pool(2);
  offline::PipelineOptions o;
  o.run.corpus_path = TestModelPath("tinystories-profile.txt");
  o.run.tokens = 2048;
  o.profiler.max_samples = 2048;
  auto profiled = offline::RunProfilePipeline(model, "relu-tiny.f32.gguf", pool, o, nullptr);
  REQUIRE(profiled.ok());
  offline::HardwareProfile hw;
  hw.cpu_bandwidth_gbps = 20;  // a figure, not a measurement: the placement, not its speed
  const EngineOptions eo = Options(nullptr);
  // The whole model's weights, and shares of it small enough that the solver must choose.
  const uint64_t weights = model.weight_bytes();
  int solved = 0;
  for (double share : {1.5, 0.6, 0.35}) {
    const uint64_t cap = static_cast<uint64_t>(share * weights) + (uint64_t{2} << 20);
    INFO("cap " << cap << " bytes (" << share << " of the weights)");
    offline::ProblemOptions po;
    po.budget_bytes = static_cast<double>(cap);
    po.context = eo.n_ctx;
    po.max_batch = eo.max_batch;
    po.kv_type = eo.kv_type;
    po.min_neurons = 64;
    offline::SolveOptions so;
    so.time_limit_s = 5;
    auto run = offline::SolvePlacementFor(model, profiled->sidecar, hw, po, so);
    if (!run.ok()) continue;  // too small to place anything
    offline::Sidecar sidecar = profiled->sidecar;
    offline::ApplyPlacement(*run, sidecar);
    auto plan = offline::SparsePlanFromSidecar(sidecar, model);
    REQUIRE(plan.ok());
    int64_t want_neurons = 0;
    for (const SparseLayerPlan& p : plan->layers) want_neurons += p.device_neurons.size();
    const int64_t want_attention =
        std::count(plan->attention_gpu.begin(), plan->attention_gpu.end(), 1);
    CpuStandInDevice device;  // reserves exactly what CUDA would allocate
    EngineOptions run_options = eo;
    run_options.device = &device;
    run_options.gpu_memory = cap;
    auto s = NewEngineSession(model, *std::move(plan), pool, run_options);
    INFO(DescribePlacement(s->placement()));
    CHECK(s->placement().note.empty());
    CHECK(s->placement().attention_gpu_layers == want_attention);
    CHECK(s->placement().gpu_neurons == want_neurons);
    CHECK(s->device_bytes() <= cap);
    CHECK(s->device_bytes() <= sidecar.placement.gpu_bytes);  // the solver's account bounds it
    ++solved;
  }
  CHECK(solved >= 2);
}

TEST_CASE("front door: sessions share one device budget", "[gpu]") {
  const std::string path = TestModelPath("relu-tiny.f32.gguf");
  if (!std::filesystem::exists(path)) THERMOCLINE_SKIP("relu-tiny.f32.gguf not found");
  const LlamaModel& model = CachedModel(path);
  CpuStandInDevice device;
  ThreadPool pool(2);
  EngineOptions o = Options(&device);
  o.gpu_layers = gpu::kAutoLayers;
  auto probe = NewEngineSession(model, std::nullopt, pool, o);
  const uint64_t one = probe->device_bytes();
  REQUIRE(one > 0);
  o.gpu_layers = model.hparams().n_layer;
  o.gpu_memory = one + one / 2;  // one session's layers, not two
  auto engine = Engine::Create(model, std::nullopt, o, pool);
  REQUIRE(engine.ok());
  auto a = (*engine)->NewSession(&pool);
  auto b = (*engine)->NewSession(&pool);
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  CHECK((*a)->device_bytes() == one);
  CHECK((*b)->device_bytes() == 0);
  CHECK_THAT((*b)->placement().note, Catch::Contains("runs on the CPU"));
  // The model reports what its first session got.
  CHECK((*engine)->placement().gpu_layers == model.hparams().n_layer);
  CHECK(testing::GreedyIds((*a)->session(), kPrompt, 16) ==
        testing::GreedyIds((*b)->session(), kPrompt, 16));
  a->reset();  // its budget is free again: a new session gets the device
  auto c = (*engine)->NewSession(&pool);
  REQUIRE(c.ok());
  CHECK((*c)->device_bytes() == one);
}

TEST_CASE("front door without a device: the CPU serves, and says why", "[nodevice]") {
  if (gpu::DeviceAvailable()) THERMOCLINE_SKIP("a CUDA device is present: the [cuda] cases run");
  const std::string path = TestModelPath("relu-tiny.f32.gguf");
  if (!std::filesystem::exists(path)) THERMOCLINE_SKIP("relu-tiny.f32.gguf not found");
  const LlamaModel& model = CachedModel(path);
  ThreadPool pool(2);
  auto cpu = NewEngineSession(model, std::nullopt, pool, Options(nullptr));
  EngineOptions o = Options(nullptr);  // the CUDA backend
  o.gpu_memory = uint64_t{1} << 30;
  auto s =
      NewEngineSession(model, OraclePlan(model, std::vector<uint8_t>(6, 1), true, 0.5, 3), pool, o);
  CHECK(s->placement().gpu_requested);
  CHECK(s->placement().device.empty());
  CHECK_THAT(s->placement().note, Catch::Contains("no CUDA device"));
  CHECK(s->device_bytes() == 0);
  CHECK(testing::GreedyIds(s->session(), kPrompt, 24) ==
        testing::GreedyIds(cpu->session(), kPrompt, 24));
}

TEST_CASE("front door: bad options and plans are clear errors", "[gpu]") {
  const std::string path = TestModelPath("relu-tiny.f32.gguf");
  if (!std::filesystem::exists(path)) THERMOCLINE_SKIP("relu-tiny.f32.gguf not found");
  const LlamaModel& model = CachedModel(path);
  ThreadPool pool(1);
  EngineOptions o;
  o.max_batch = 0;
  CHECK(Engine::Create(model, std::nullopt, o, pool).status().code() ==
        absl::StatusCode::kInvalidArgument);
  SparsePlan short_plan;
  short_plan.layers.resize(2);
  auto bad = Engine::Create(model, std::move(short_plan), EngineOptions{}, pool);
  CHECK(bad.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(bad.status().message()), Catch::Contains("layers"));
  // More whole layers than fit under the cap, asked for by number: refused with the sizes.
  CpuStandInDevice device;
  EngineOptions tight = Options(&device);
  tight.gpu_layers = 3;
  tight.gpu_memory = 1 << 20;
  auto refused = Engine::Create(model, std::nullopt, tight, pool);
  CHECK(refused.status().code() == absl::StatusCode::kResourceExhausted);
}

TEST_CASE("front door, CUDA: trained predictors split between the GPU and the host", "[cuda]") {
  if (!gpu::DeviceAvailable()) THERMOCLINE_SKIP("no CUDA device: [cuda] case skipped");
  const std::string path = TestModelPath("relu-tiny.f32.gguf");
  if (!std::filesystem::exists(path)) THERMOCLINE_SKIP("relu-tiny.f32.gguf not found");
  TrainedPredictorsSplit(&gpu::CudaDevice(), nullptr, CachedModel(path));
}

TEST_CASE("front door, stand-in device: an F16 KV cache on the device computes as the CPU's",
          "[gpu]") {
  for (const char* name : {"relu-tiny.f32.gguf", "stories260K.gguf"}) {
    const std::string path = TestModelPath(name);
    if (!std::filesystem::exists(path)) THERMOCLINE_SKIP(std::string(name) + " not found");
    INFO(name);
    CpuStandInDevice device;
    WholeLayers(&device, CachedModel(path), KvType::kF16, kF16CacheTolerance);
    CHECK(device.layer_calls() > 0);
  }
}

TEST_CASE("front door, CUDA: an F16 KV cache on the device computes as the CPU's", "[cuda]") {
  if (!gpu::DeviceAvailable()) THERMOCLINE_SKIP("no CUDA device: [cuda] case skipped");
  for (const char* name : {"relu-tiny.f32.gguf", "stories260K.gguf"}) {
    const std::string path = TestModelPath(name);
    if (!std::filesystem::exists(path)) THERMOCLINE_SKIP(std::string(name) + " not found");
    INFO(name);
    WholeLayers(&gpu::CudaDevice(), CachedModel(path), KvType::kF16, kF16CacheTolerance);
  }
}

TEST_CASE("front door, CUDA: Q8_0 and Q4_0 relu-tiny in whole layers", "[cuda]") {
  if (!gpu::DeviceAvailable()) THERMOCLINE_SKIP("no CUDA device: [cuda] case skipped");
  const std::string path = TestModelPath("relu-tiny.f32.gguf");
  if (!std::filesystem::exists(path)) THERMOCLINE_SKIP("relu-tiny.f32.gguf not found");
  ThreadPool pool(2);
  for (const char* type : {"q8_0", "q4_0"}) {
    INFO(type);
    const std::string out = (testing::TempDir() / (std::string("relu-tiny.") + type)).string();
    REQUIRE(QuantizeModel(path, out, *FindQuantMix(type), pool).ok());
    WholeLayers(&gpu::CudaDevice(), CachedModel(out));
  }
}

// The logits of n greedy decode steps after kPrompt, one row per step.
std::vector<float> DecodeLogits(Session& s, int n) {
  const int64_t n_vocab = s.model().hparams().n_vocab;
  s.Reset();
  absl::Status st = s.Eval(kPrompt);
  if (!st.ok()) FAIL(st.ToString());
  std::vector<float> all;
  for (int i = 0; i < n; ++i) {
    const float* l = s.logits();
    all.insert(all.end(), l, l + n_vocab);
    const int32_t next = static_cast<int32_t>(std::max_element(l, l + n_vocab) - l);
    st = s.Eval({&next, 1});
    if (!st.ok()) FAIL(st.ToString());
  }
  return all;
}

// A decode step runs as CUDA graphs (whole layers: one per range of layers; a resident hybrid
// layer: its attention and the executor's half). A replay runs the captured kernels with the
// captured arguments, so it must give the direct launches' logits bit for bit; a position baked
// into a graph instead of read from device memory would break that from the second step on.
TEST_CASE("front door, CUDA: decode steps as CUDA graphs give the direct launches' logits",
          "[cuda]") {
  if (!gpu::DeviceAvailable()) THERMOCLINE_SKIP("no CUDA device: [cuda] case skipped");
  const std::string path = TestModelPath("relu-tiny.f32.gguf");
  if (!std::filesystem::exists(path)) THERMOCLINE_SKIP("relu-tiny.f32.gguf not found");
  const LlamaModel& model = CachedModel(path);
  const int64_t n = model.hparams().n_layer;
  ThreadPool pool(2);
  struct Case {
    const char* what;
    bool hybrid;
    int64_t gpu_layers;
    int64_t max_batch;
  };
  for (const Case& c : {Case{"whole layers, the head too", false, gpu::kAutoLayers, 4},
                        Case{"half the layers, prompt token by token", false, n / 2, 1},
                        Case{"resident hybrid layers", true, 0, 4}}) {
    INFO(c.what);
    auto run = [&](bool graphs) {
      // Graphs off for this run only, also when a REQUIRE inside throws.
      struct GraphsOff {
        explicit GraphsOff(bool off) {
          if (off) setenv("THERMOCLINE_CUDA_GRAPHS", "0", 1);
        }
        ~GraphsOff() { unsetenv("THERMOCLINE_CUDA_GRAPHS"); }
      } scope(!graphs);
      EngineOptions o = Options(&gpu::CudaDevice());
      o.max_batch = c.max_batch;
      std::optional<SparsePlan> plan;
      if (c.hybrid) {
        o.gpu_memory = uint64_t{1} << 30;
        plan = OraclePlan(model, std::vector<uint8_t>(n, 1), true, 0.5, 7);
      } else {
        o.gpu_layers = c.gpu_layers;
      }
      auto s = NewEngineSession(model, std::move(plan), pool, o);
      REQUIRE(s->device_bytes() > 0);
      return DecodeLogits(s->session(), 16);
    };
    const gpu::GraphCounts before = gpu::CudaGraphCounts();
    const std::vector<float> with = run(true);
    const gpu::GraphCounts mid = gpu::CudaGraphCounts();
    INFO("last refused capture: " << (mid.last_refusal ? mid.last_refusal : "none"));
    CHECK(mid.captured > before.captured);
    CHECK(mid.direct == before.direct);
    const std::vector<float> without = run(false);
    CHECK(gpu::CudaGraphCounts().direct > mid.direct);
    CHECK(with == without);
  }
}

TEST_CASE("front door, CUDA: decoding allocates no device memory per token", "[cuda]") {
  if (!gpu::DeviceAvailable()) THERMOCLINE_SKIP("no CUDA device: [cuda] case skipped");
  const std::string path = TestModelPath("relu-tiny.f32.gguf");
  if (!std::filesystem::exists(path)) THERMOCLINE_SKIP("relu-tiny.f32.gguf not found");
  const LlamaModel& model = CachedModel(path);
  const int64_t n = model.hparams().n_layer;
  ThreadPool pool(2);
  for (bool hybrid : {true, false}) {
    INFO((hybrid ? "hybrid" : "whole layers"));
    EngineOptions o = Options(&gpu::CudaDevice());
    o.n_ctx = 96;
    std::optional<SparsePlan> plan;
    if (hybrid) {
      o.gpu_memory = uint64_t{1} << 30;
      plan = OraclePlan(model, std::vector<uint8_t>(n, 1), true, 0.5, 7);
    } else {
      o.gpu_layers = gpu::kAutoLayers;
    }
    auto s = NewEngineSession(model, std::move(plan), pool, o);
    REQUIRE(s->device_bytes() > 0);
    testing::GreedyIds(s->session(), kPrompt, 4);  // warm: first launches, cuBLAS
    const auto before = gpu::Probe(0);
    REQUIRE(before.ok());
    testing::GreedyIds(s->session(), kPrompt, 64);
    const auto after = gpu::Probe(0);
    REQUIRE(after.ok());
    CHECK(after->free_bytes == before->free_bytes);
  }
}

TEST_CASE("front door, CUDA: whole layers, the hybrid placement and its caps", "[cuda]") {
  if (!gpu::DeviceAvailable()) THERMOCLINE_SKIP("no CUDA device: [cuda] case skipped");
  for (const char* name : {"relu-tiny.f32.gguf", "relu-tiny.f16.gguf"}) {
    const std::string path = TestModelPath(name);
    if (!std::filesystem::exists(path)) THERMOCLINE_SKIP(std::string(name) + " not found");
    INFO(name);
    WholeLayers(&gpu::CudaDevice(), CachedModel(path));
    Hybrid(&gpu::CudaDevice(), CachedModel(path), nullptr);
    HybridCaps(&gpu::CudaDevice(), CachedModel(path));
  }
}

}  // namespace
}  // namespace thermocline
