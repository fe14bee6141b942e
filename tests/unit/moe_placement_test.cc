// Experts as units of the hot/cold placement, on stories260K as a llama mixture of 4 experts
// (2 used; $THERMOCLINE_TEST_MODELS/arch/): the profiler counts routing per layer and expert,
// the sidecar carries the counts and the expert placement (and version 1 sidecars still load),
// the solver places whole experts under a cap with the runtime's own byte formulas, and the
// split MoE FFN (engine/sparse/moe_ffn.h) — some experts on the CPU stand-in device
// (bench/cpu_device.h), the others on the host — gives dense CPU's greedy tokens and logits.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "bench/cpu_device.h"
#include "engine/gpu/device_memory.h"
#include "engine/gpu/gpu_backend.h"
#include "engine/runtime/engine.h"
#include "model_fixtures.h"
#include "offline/pipeline.h"
#include "offline/sparse_source.h"
#include "test_util.h"

namespace thermocline {
namespace {

using testing::CachedModel;
using testing::NewEngineSession;
using testing::TestModelPath;

const LlamaModel& Moe() { return CachedModel(TestModelPath("arch/stories260K-llama-moe.gguf")); }

// Counts, independently of the profiler, the tokens each layer's router saw.
class RoutingTally final : public FfnObserver {
 public:
  void OnFfn(int, const float*, int64_t, const float*, int64_t, int64_t) override { ++ffn_calls; }
  void OnRouting(int layer, const int32_t* selected, int64_t k, int64_t n) override {
    if (static_cast<int>(tokens.size()) <= layer) tokens.resize(layer + 1, 0);
    tokens[layer] += n;
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t j = 1; j < k; ++j) distinct &= selected[i * k + j] != selected[i * k];
    }
  }
  std::vector<int64_t> tokens;
  int64_t ffn_calls = 0;
  bool distinct = true;
};

offline::PipelineOptions ProfileOptions(RoutingTally* tally) {
  offline::PipelineOptions o;
  o.run.corpus_path = TestModelPath("tinystories-profile.txt");
  o.run.tokens = 512;
  o.run.chunk = 128;
  o.run.also_observe = tally;
  return o;
}

// The profile, once per process (it is read by every case).
const offline::PipelineResult& Profiled() {
  static RoutingTally tally;
  static const offline::PipelineResult result = [] {
    ThreadPool pool(2);
    auto r = offline::RunProfilePipeline(Moe(), "moe", pool, ProfileOptions(&tally), nullptr);
    INFO(r.status().ToString());
    REQUIRE(r.ok());
    return *std::move(r);
  }();
  return result;
}

TEST_CASE("profiling a mixture of experts counts its routing", "[moe][profile]") {
  const LlamaHparams& h = Moe().hparams();
  RoutingTally tally;
  ThreadPool pool(2);
  auto r = offline::RunProfilePipeline(Moe(), "moe", pool, ProfileOptions(&tally), nullptr);
  REQUIRE(r.ok());
  const offline::ActivationProfiler& p = *r->profiler;
  CHECK(p.tokens() == 512);
  CHECK(p.n_expert() == 4);
  CHECK(tally.ffn_calls == 0);  // an MoE layer has no neuron activations to report
  CHECK(tally.distinct);        // top-k picks k different experts
  REQUIRE(static_cast<int64_t>(tally.tokens.size()) == h.n_layer);
  for (int l = 0; l < h.n_layer; ++l) {
    INFO("layer " << l);
    const std::vector<uint64_t>& c = p.route_count(l);
    REQUIRE(static_cast<int64_t>(c.size()) == h.n_expert);
    // Every token sends itself to exactly expert_used_count experts.
    CHECK(std::accumulate(c.begin(), c.end(), uint64_t{0}) ==
          static_cast<uint64_t>(p.tokens() * h.n_expert_used));
    CHECK(tally.tokens[l] == p.tokens());  // what the router saw is what was counted
    // The router (N(0, 0.5) weights) does not send every token to the same pair.
    CHECK(*std::max_element(c.begin(), c.end()) < static_cast<uint64_t>(p.tokens()));
  }
  // The sidecar holds the counts, no predictors, and reads back equal.
  const offline::Sidecar& s = r->sidecar;
  CHECK(s.n_expert == 4);
  CHECK(s.n_expert_used == 2);
  const std::string file = (testing::TempDir() / "moe.thermo.gguf").string();
  REQUIRE(offline::WriteSidecar(s, file).ok());
  auto back = offline::LoadSidecarFor(file, Moe());
  INFO(back.status().ToString());
  REQUIRE(back.ok());
  CHECK(back->format_version == offline::kSidecarFormatVersion);
  for (int l = 0; l < h.n_layer; ++l) {
    CHECK(back->layers[l].expert_route_count == s.layers[l].expert_route_count);
    CHECK(back->layers[l].predictor.rank == 0);
  }
  // Such a sidecar belongs to this model only.
  const LlamaModel& dense = CachedModel(TestModelPath("stories260K.gguf"));
  CHECK_FALSE(offline::CheckSidecarMatches(*back, dense).ok());
}

TEST_CASE("a version 1 sidecar still loads", "[moe][sidecar]") {
  // A sidecar of the model without experts, written in the format before the experts section.
  const LlamaModel& model = CachedModel(TestModelPath("relu-tiny.f32.gguf"));
  ThreadPool pool(2);
  offline::PipelineOptions o;
  o.run.corpus_path = TestModelPath("tinystories-profile.txt");
  o.run.tokens = 128;
  o.predictors.train.epochs = 1;
  auto r = offline::RunProfilePipeline(model, "relu-tiny", pool, o, nullptr);
  REQUIRE(r.ok());
  offline::Sidecar v1 = r->sidecar;
  v1.format_version = 1;
  const std::string file = (testing::TempDir() / "v1.thermo.gguf").string();
  REQUIRE(offline::WriteSidecar(v1, file).ok());
  auto back = offline::LoadSidecarFor(file, model);
  INFO(back.status().ToString());
  REQUIRE(back.ok());
  CHECK(back->format_version == 1);
  CHECK(back->n_expert == 0);
  CHECK(back->layers[0].fire_count == v1.layers[0].fire_count);
}

// The cap that holds the scratch and exactly `experts` experts of the model.
uint64_t CapFor(int64_t experts) {
  const LlamaModel& m = Moe();
  const LlamaHparams& h = m.hparams();
  return gpu::FfnScratchBytes(h.n_embd, h.n_ff_exp, h.n_ff_exp, 0) +
         experts * gpu::ExpertDeviceBytes(m.layers()[0], 0, h.n_embd, h.n_ff_exp);
}

offline::PlacementRun Solve(uint64_t cap, offline::Objective objective) {
  offline::HardwareProfile hw;
  hw.cpu_bandwidth_gbps = 10;
  offline::ProblemOptions po;
  po.budget_bytes = static_cast<double>(cap);
  offline::SolveOptions so;
  so.objective = objective;
  auto run = offline::SolvePlacementFor(Moe(), Profiled().sidecar, hw, po, so);
  INFO(run.status().ToString());
  REQUIRE(run.ok());
  return *std::move(run);
}

TEST_CASE("the solver places whole experts under the cap", "[moe][solver]") {
  const LlamaModel& m = Moe();
  const LlamaHparams& h = m.hparams();
  const offline::Sidecar& profile = Profiled().sidecar;
  // Every expert of this model has the same types, so a cap of 3 experts holds any 3.
  const uint64_t cap = CapFor(3) + 100;  // less than one more expert
  const offline::PlacementRun run = Solve(cap, offline::Objective::kFrequency);
  const offline::PlacementProblem& p = run.problem;
  CHECK(p.experts);
  uint64_t placed_bytes = 0;
  int64_t placed = 0;
  int32_t coldest_placed = INT32_MAX, hottest_left = -1;
  for (int64_t l = 0; l < h.n_layer; ++l) {
    CHECK_FALSE(run.chosen.placement.attention_gpu[l]);  // attention stays on the CPU
    const std::vector<int32_t> gpu = offline::GpuExperts(p, run.chosen.placement, l);
    for (int64_t e = 0; e < h.n_expert; ++e) {
      const int32_t count = profile.layers[l].expert_route_count[e];
      if (std::find(gpu.begin(), gpu.end(), e) != gpu.end()) {
        placed_bytes += gpu::ExpertDeviceBytes(m.layers()[l], e, h.n_embd, h.n_ff_exp);
        ++placed;
        coldest_placed = std::min(coldest_placed, count);
      } else {
        hottest_left = std::max(hottest_left, count);
      }
    }
  }
  CHECK_FALSE(run.chosen.placement.output_gpu);
  CHECK(placed == 3);
  CHECK(placed_bytes + static_cast<uint64_t>(p.scratch_bytes) <= cap);
  // The frequency objective takes the most routed experts of all layers.
  CHECK(coldest_placed >= hottest_left);
  // The time objective's placement fits too.
  const offline::PlacementRun timed = Solve(cap, offline::Objective::kTime);
  CHECK(offline::PlacementGpuBytes(timed.problem, timed.chosen.placement) +
            timed.problem.scratch_bytes <=
        static_cast<double>(cap));
  // Under one expert's bytes nothing can be placed, and the solver says so.
  offline::HardwareProfile hw;
  hw.cpu_bandwidth_gbps = 10;
  offline::ProblemOptions po;
  po.budget_bytes = static_cast<double>(CapFor(1) - 1024);
  auto none = offline::SolvePlacementFor(m, profile, hw, po, offline::SolveOptions{});
  CHECK(none.status().code() == absl::StatusCode::kInvalidArgument);
}

EngineOptions Options(const gpu::Device* device, uint64_t cap) {
  EngineOptions o;
  o.n_ctx = 128;
  o.max_batch = 8;
  o.dense_prefill = false;  // every token of the prompt through the split too
  o.device = device;
  o.gpu_memory = cap;
  return o;
}

// Logits of every prompt position from an empty cache.
std::vector<float> AllLogits(Session& s, const std::vector<int32_t>& prompt) {
  std::vector<float> all(prompt.size() * s.model().hparams().n_vocab);
  s.Reset();
  REQUIRE(s.Eval(prompt, all.data()).ok());
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

// The split on `device` (the stand-in, or CUDA) against dense CPU.
void Split(const gpu::Device* device, const CpuStandInDevice* stand_in) {
  const LlamaModel& m = Moe();
  const LlamaHparams& h = m.hparams();
  const uint64_t cap = CapFor(5) + 100;
  offline::PlacementRun run = Solve(cap, offline::Objective::kFrequency);
  offline::Sidecar placed = Profiled().sidecar;
  offline::ApplyPlacement(run, placed);
  int64_t n_gpu = 0;
  for (const offline::SidecarLayer& y : placed.layers) {
    n_gpu += std::accumulate(y.expert_gpu.begin(), y.expert_gpu.end(), int64_t{0});
  }
  REQUIRE(n_gpu == 5);  // of 20: some layers split, some all on one side
  // Through the sidecar file, as serve would read it.
  const std::string file = (testing::TempDir() / "moe-placed.thermo.gguf").string();
  REQUIRE(offline::WriteSidecar(placed, file).ok());
  auto plan = offline::LoadSparsePlan(file, m, 0);
  INFO(plan.status().ToString());
  REQUIRE(plan.ok());
  CHECK(plan->placement.gpu_experts == 5);

  ThreadPool pool(2);
  auto dense = NewEngineSession(m, std::nullopt, pool, Options(nullptr, 0));
  auto split =
      NewEngineSession(m, *offline::LoadSparsePlan(file, m, 0), pool, Options(device, cap));
  const EnginePlacement& p = split->placement();
  INFO(DescribePlacement(p));
  CHECK(p.note.empty());
  CHECK(p.gpu_experts == 5);
  CHECK(p.experts == h.n_layer * h.n_expert);
  REQUIRE(split->moe() != nullptr);
  REQUIRE(split->moe()->on_device());
  // What the device holds is the solver's account of it, and within the cap.
  const uint64_t expected =
      gpu::ComputeGpuFfnMemory(split->engine().expert_weights()->DeviceSpec());
  CHECK(split->device_bytes() == expected);
  CHECK(expected == CapFor(5));
  CHECK(split->device_bytes() <= cap);
  CHECK(p.gpu_bytes == expected);

  // All experts on the host, the unrouted ones weighted 0: bench's dense reference.
  EngineOptions all_options = Options(nullptr, 0);
  all_options.moe_all_experts = true;
  auto all = NewEngineSession(m, *offline::LoadSparsePlan(file, m, 0), pool, all_options);

  const nlohmann::json ref = testing::LoadReference("arch/stories260K-llama-moe.llama-cpp.json");
  for (const nlohmann::json& pr : ref["prompts"]) {
    const std::vector<int32_t> ids = pr["prompt_ids"].get<std::vector<int32_t>>();
    INFO("prompt '" << pr["prompt"].get<std::string>() << "'");
    const std::vector<int32_t> want = testing::GreedyIds(dense->session(), ids, 16);
    CHECK(testing::GreedyIds(split->session(), ids, 16) == want);
    CHECK(testing::GreedyIds(all->session(), ids, 16) == want);
    // The split sums a token's experts in another order than the dense FFN (device ones last)
    // and the stand-in computes its experts with the scalar references instead of the SIMD
    // kernels: float reassociation, ~1e-6 relative per layer. 1e-3 leaves room for that through
    // every layer; a wrong expert or weight moves logits by O(1).
    const std::vector<float> want_logits = AllLogits(dense->session(), ids);
    CHECK(MaxRelDiff(AllLogits(split->session(), ids), want_logits) <= 1e-3);
    CHECK(MaxRelDiff(AllLogits(all->session(), ids), want_logits) <= 1e-3);
  }
  // Both places computed routed experts.
  CHECK(split->moe()->device_expert_calls() > 0);
  CHECK(split->moe()->host_expert_calls() > 0);
  if (stand_in != nullptr) CHECK(stand_in->ffn_launches() == split->moe()->device_expert_calls());

  // A cap below the placement: the session runs on the CPU, says why, same tokens.
  auto cpu =
      NewEngineSession(m, *offline::LoadSparsePlan(file, m, 0), pool, Options(device, CapFor(2)));
  CHECK(cpu->placement().gpu_experts == 0);
  CHECK_FALSE(cpu->placement().note.empty());
  CHECK(cpu->device_bytes() == 0);
  const std::vector<int32_t> ids = ref["prompts"][0]["prompt_ids"].get<std::vector<int32_t>>();
  CHECK(testing::GreedyIds(cpu->session(), ids, 16) ==
        testing::GreedyIds(dense->session(), ids, 16));
}

TEST_CASE("the split MoE FFN gives dense CPU's tokens", "[moe][gpu]") {
  CpuStandInDevice device;  // reserves exactly what CUDA would allocate
  Split(&device, &device);
}

TEST_CASE("the split MoE FFN on CUDA gives dense CPU's tokens", "[moe][cuda]") {
  if (!gpu::DeviceAvailable()) THERMOCLINE_SKIP("no CUDA device: [cuda] case skipped");
  Split(&gpu::CudaDevice(), nullptr);
}

}  // namespace
}  // namespace thermocline
