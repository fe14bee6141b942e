// Neuron sparsity inside the experts of a ReLU mixture, and its memory: on relu-tiny rewritten as
// a llama mixture of 4 experts (2 used), the placed MoE FFN's host experts compute only the
// neurons whose gate fires (engine/sparse/moe_ffn.h) and must give the dense MoE FFN's greedy
// tokens and logits (F32 experts: up to summation order; Q8_0 and Q4_0: within down_t's
// requantization); the experts' down is held once (the file's pages released once copied as
// down_t, prefill over the copies), checked on the Rss of the file's mapping in
// /proc/self/smaps; a SwiGLU mixture copies only its device experts' down.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "allocation_count.h"
#include "bench/cpu_device.h"
#include "engine/gguf/gguf.h"
#include "engine/ops/kernels.h"
#include "engine/runtime/engine.h"
#include "engine/runtime/perplexity.h"
#include "model_fixtures.h"

namespace thermocline {
namespace {

using testing::MappingRss;

using testing::CachedModel;
using testing::NewEngineSession;
using testing::TestModelPath;

constexpr int64_t kExperts = 4;

std::vector<uint8_t> Bytes(const std::vector<float>& v) {
  std::vector<uint8_t> b(v.size() * sizeof(float));
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

// v: (rows, cols) as rows of `type`.
std::vector<uint8_t> Quantized(const std::vector<float>& v, int64_t cols, GgmlType type) {
  if (type == GgmlType::kF32) return Bytes(v);
  const TypeKernels* k = KernelsFor(type, Isa::kScalar);
  REQUIRE(k != nullptr);
  const int64_t rows = static_cast<int64_t>(v.size()) / cols;
  const size_t row_bytes = RowBytes(type, cols);
  std::vector<uint8_t> b(rows * row_bytes);
  for (int64_t r = 0; r < rows; ++r)
    k->from_float(v.data() + r * cols, b.data() + r * row_bytes, cols);
  return b;
}

// relu-tiny (F32, a trained ReGLU llama) as a mixture of kExperts experts, 2 used. Expert 0 is
// relu-tiny's FFN; expert e > 0 is it with its neurons permuted (gate and up rows, down's
// columns, one permutation per expert and layer) and its down scaled element-wise by
// (1 + 0.1·N(0,1)), so experts differ (routing matters) and a row of one expert read with
// another's index shows. Each expert's gate is relu-tiny's, so its neurons fire as sparsely as
// relu-tiny's (≈ 84%). The router is N(0, 0.5). The experts' tensors are of `type` (relu-tiny's
// F32 quantized), the rest stays F32.
std::string WriteReluMoe(GgmlType type) {
  auto in = GgufFile::Open(TestModelPath("relu-tiny.f32.gguf"));
  INFO(in.status().ToString());
  REQUIRE(in.ok());
  const GgufFile& f = **in;
  GgufWriter w;
  for (const GgufKeyValue& kv : f.metadata()) w.Set(kv.key, kv.value);
  w.SetUint32("llama.expert_count", kExperts);
  w.SetUint32("llama.expert_used_count", 2);
  std::mt19937 rng(24);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (const GgufTensorInfo& t : f.tensors()) {
    const std::string& name = t.name;
    if (name.find(".ffn_up.weight") != std::string::npos ||
        name.find(".ffn_down.weight") != std::string::npos) {
      continue;  // written with the gate below
    }
    const size_t pos = name.find(".ffn_gate.weight");
    if (pos == std::string::npos) {
      REQUIRE(w.AddTensor(name, t.type, t.dims, t.data, t.size_bytes).ok());
      continue;
    }
    const std::string blk = name.substr(0, pos);
    const GgufTensorInfo* up = f.FindTensor(blk + ".ffn_up.weight");
    const GgufTensorInfo* down = f.FindTensor(blk + ".ffn_down.weight");
    REQUIRE(up != nullptr);
    REQUIRE(down != nullptr);
    REQUIRE(t.type == GgmlType::kF32);
    const int64_t n_embd = t.dims[0], n_ff = t.dims[1];
    const float* g = reinterpret_cast<const float*>(t.data);       // (n_ff, n_embd)
    const float* u = reinterpret_cast<const float*>(up->data);     // (n_ff, n_embd)
    const float* dn = reinterpret_cast<const float*>(down->data);  // (n_embd, n_ff)
    std::vector<float> gate_exps(kExperts * n_ff * n_embd), up_exps(gate_exps.size());
    std::vector<float> down_exps(kExperts * n_embd * n_ff);
    std::vector<int32_t> perm(n_ff);
    for (int64_t e = 0; e < kExperts; ++e) {
      for (int64_t i = 0; i < n_ff; ++i) perm[i] = static_cast<int32_t>(i);
      if (e > 0) std::shuffle(perm.begin(), perm.end(), rng);
      for (int64_t i = 0; i < n_ff; ++i) {
        std::copy_n(g + perm[i] * n_embd, n_embd, gate_exps.data() + (e * n_ff + i) * n_embd);
        std::copy_n(u + perm[i] * n_embd, n_embd, up_exps.data() + (e * n_ff + i) * n_embd);
      }
      for (int64_t r = 0; r < n_embd; ++r) {
        for (int64_t i = 0; i < n_ff; ++i) {
          const float scale = e > 0 ? 1.0f + 0.1f * normal(rng) : 1.0f;
          down_exps[(e * n_embd + r) * n_ff + i] = dn[r * n_ff + perm[i]] * scale;
        }
      }
    }
    std::vector<float> router(kExperts * n_embd);
    for (float& v : router) v = 0.5f * normal(rng);
    REQUIRE(w.AddTensorCopy(blk + ".ffn_gate_inp.weight", GgmlType::kF32, {n_embd, kExperts},
                            Bytes(router))
                .ok());
    REQUIRE(w.AddTensorCopy(blk + ".ffn_gate_exps.weight", type, {n_embd, n_ff, kExperts},
                            Quantized(gate_exps, n_embd, type))
                .ok());
    REQUIRE(w.AddTensorCopy(blk + ".ffn_up_exps.weight", type, {n_embd, n_ff, kExperts},
                            Quantized(up_exps, n_embd, type))
                .ok());
    REQUIRE(w.AddTensorCopy(blk + ".ffn_down_exps.weight", type, {n_ff, n_embd, kExperts},
                            Quantized(down_exps, n_ff, type))
                .ok());
  }
  const std::string out =
      (testing::TempDir() / absl::StrCat("relu-tiny-moe.", TypeName(type), ".gguf")).string();
  REQUIRE(w.Write(out).ok());
  return out;
}

// WriteReluMoe's file, written once per process and type.
std::string ReluMoePath(GgmlType type = GgmlType::kF32) {
  static std::map<GgmlType, std::string> paths;
  std::string& path = paths[type];
  if (path.empty()) path = WriteReluMoe(type);
  return path;
}

// An expert plan that places nothing: every expert on the host.
SparsePlan HostPlan(const LlamaModel& m) {
  SparsePlan plan;
  plan.layers.resize(m.hparams().n_layer);
  return plan;
}

EngineOptions Options() {
  EngineOptions o;
  o.n_ctx = 128;
  o.max_batch = 8;  // prompts prefilled in chunks of up to 8
  return o;
}

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

uint64_t ExpertDownBytes(const LlamaModel& m) {
  uint64_t total = 0;
  for (const LayerWeights& L : m.layers()) {
    for (const WeightView& v : L.expert_down) total += v.rows * v.row_bytes;
  }
  return total;
}

TEST_CASE("a ReLU mixture's host experts compute only their firing neurons, with dense's tokens",
          "[moe][sparse]") {
  const LlamaModel& m = CachedModel(ReluMoePath());
  const LlamaHparams& h = m.hparams();
  REQUIRE(h.n_expert == kExperts);
  REQUIRE(h.activation == FfnActivation::kRelu);
  ThreadPool pool(2);
  auto dense = NewEngineSession(m, std::nullopt, pool, Options());
  // Prefill batched expert by expert over the copies, and every prompt token one by one.
  auto sparse = NewEngineSession(m, HostPlan(m), pool, Options());
  EngineOptions per_token = Options();
  per_token.dense_prefill = false;
  auto sparse_tokens = NewEngineSession(m, HostPlan(m), pool, per_token);
  REQUIRE(sparse->moe() != nullptr);
  const ExpertWeights& experts = *sparse->engine().expert_weights();
  CHECK(experts.sparse_host());
  for (int64_t l = 0; l < h.n_layer; ++l) {
    for (int64_t e = 0; e < h.n_expert; ++e) CHECK(experts.down_t(l, e) != nullptr);
  }

  const nlohmann::json ref = testing::LoadReference("relu-tiny.reference.json");
  for (const nlohmann::json& pr : ref["prompts"]) {
    const std::vector<int32_t> ids = pr["prompt_ids"].get<std::vector<int32_t>>();
    INFO("prompt '" << pr["prompt"].get<std::string>() << "'");
    const std::vector<int32_t> want = testing::GreedyIds(dense->session(), ids, 48);
    CHECK(testing::GreedyIds(sparse->session(), ids, 48) == want);
    CHECK(testing::GreedyIds(sparse_tokens->session(), ids, 48) == want);
    // The same neurons with a nonzero activation (the gate is the dense path's own mat-vec, so
    // the same ones fire), summed in another order: up as row dots, down as an axpy over down_t
    // rows. F32 reassociation, ~1e-6 relative per layer; 1e-4 leaves room through 6 layers. A
    // neuron skipped that fires, or a row of the wrong expert, moves logits by O(0.1-1).
    const std::vector<float> want_logits = AllLogits(dense->session(), ids);
    CHECK(MaxRelDiff(AllLogits(sparse->session(), ids), want_logits) <= 1e-4);
    CHECK(MaxRelDiff(AllLogits(sparse_tokens->session(), ids), want_logits) <= 1e-4);
  }
  // The experts skipped most of their neurons: relu-tiny's gate fires for ≈ 16% of them (the
  // shallow layers fewer); half is far above that and far below all.
  const MoeFfn& moe = *sparse_tokens->moe();
  REQUIRE(moe.host_expert_calls() > 0);
  const double computed = static_cast<double>(moe.host_expert_neurons()) /
                          (static_cast<double>(moe.host_expert_calls()) * h.n_ff_exp);
  INFO("neurons computed past the gate: " << computed);
  CHECK(computed > 0.0);
  CHECK(computed < 0.5);
}

TEST_CASE("a decode step through sparse ReLU experts allocates nothing", "[moe][sparse]") {
#if THERMOCLINE_COUNT_ALLOCATIONS
  const LlamaModel& m = CachedModel(ReluMoePath());
  ThreadPool pool(2);
  auto sparse = NewEngineSession(m, HostPlan(m), pool, Options());
  Session& s = sparse->session();
  const std::vector<int32_t> prompt = {1, 403, 261, 290, 7, 45, 300, 41, 17, 260, 33};
  REQUIRE(s.Eval(prompt).ok());
  CHECK(testing::AllocationsOfGreedySteps(s, 8) == 0);
  CHECK(sparse->moe()->host_expert_calls() > 0);
#else
  THERMOCLINE_SKIP("allocation counting is off under sanitizers");
#endif
}

// Quantized experts: the firing-neuron path's down is an axpy over down_t, which TransposeWeight
// requantizes along the other axis (docs/types.md: Q8_0 and Q4_0 into their own type), while the
// dense path's mat-vec rounds the activations to 8 bits. So the two differ by those roundings, not
// only by summation order, and perplexity is what must stay (as for the sparse FFN's oracle run,
// docs/types.md). Bounds: Q8_0's second rounding is at most half a step of 1/127 of a block's
// largest weight (~0.4%, the same size as the dense path's 8-bit activations): logits within
// 1e-2 relative, perplexity within 0.1%, and the greedy tokens equal on this trained model.
// Q4_0's second rounding is half a step of 1/8: logits within 5e-2, perplexity within 1% (its
// greedy tokens may leave dense's at a near tie, so they are not compared).
TEST_CASE("quantized ReLU experts: firing neurons only, within the roundings of dense",
          "[moe][sparse]") {
  const std::string text = testing::ReadTextFile(TestModelPath("stories260K.ppl-sample.txt"));
  const nlohmann::json ref = testing::LoadReference("relu-tiny.reference.json");
  struct Case {
    GgmlType type;
    double logits, ppl;
    bool same_tokens;
  };
  for (const Case& c :
       {Case{GgmlType::kQ8_0, 1e-2, 1e-3, true}, Case{GgmlType::kQ4_0, 5e-2, 1e-2, false}}) {
    INFO(TypeName(c.type));
    const LlamaModel& m = CachedModel(ReluMoePath(c.type));
    REQUIRE(m.layers()[0].expert_down[0].type == c.type);
    ThreadPool pool(2);
    EngineOptions per_token = Options();
    per_token.dense_prefill = false;  // every token through the firing-neuron path
    auto dense = NewEngineSession(m, std::nullopt, pool, per_token);
    auto sparse = NewEngineSession(m, HostPlan(m), pool, per_token);
    REQUIRE(sparse->engine().expert_weights()->sparse_host());
    auto ppl_dense = ComputePerplexity(dense->session(), text, 128);
    auto ppl_sparse = ComputePerplexity(sparse->session(), text, 128);
    REQUIRE(ppl_dense.ok());
    REQUIRE(ppl_sparse.ok());
    INFO("perplexity dense " << ppl_dense->ppl << ", sparse " << ppl_sparse->ppl);
    CHECK(std::fabs(ppl_sparse->ppl / ppl_dense->ppl - 1.0) <= c.ppl);
    for (const nlohmann::json& pr : ref["prompts"]) {
      const std::vector<int32_t> ids = pr["prompt_ids"].get<std::vector<int32_t>>();
      INFO("prompt '" << pr["prompt"].get<std::string>() << "'");
      CHECK(MaxRelDiff(AllLogits(sparse->session(), ids), AllLogits(dense->session(), ids)) <=
            c.logits);
      if (c.same_tokens) {
        CHECK(testing::GreedyIds(sparse->session(), ids, 16) ==
              testing::GreedyIds(dense->session(), ids, 16));
      }
    }
  }
}

TEST_CASE("ReLU experts split between the stand-in device and sparse host experts",
          "[moe][sparse][gpu]") {
  const LlamaModel& m = CachedModel(ReluMoePath());
  const LlamaHparams& h = m.hparams();
  SparsePlan plan = HostPlan(m);
  for (int64_t l = 0; l < h.n_layer; ++l) plan.layers[l].device_experts = {int32_t(l % kExperts)};
  CpuStandInDevice device;
  ThreadPool pool(2);
  EngineOptions o = Options();
  o.device = &device;
  o.gpu_memory = uint64_t{1} << 30;
  auto dense = NewEngineSession(m, std::nullopt, pool, Options());
  auto split = NewEngineSession(m, std::move(plan), pool, o);
  INFO(DescribePlacement(split->placement()));
  REQUIRE(split->moe() != nullptr);
  REQUIRE(split->moe()->on_device());
  CHECK(split->placement().gpu_experts == h.n_layer);
  const nlohmann::json ref = testing::LoadReference("relu-tiny.reference.json");
  for (const nlohmann::json& pr : ref["prompts"]) {
    const std::vector<int32_t> ids = pr["prompt_ids"].get<std::vector<int32_t>>();
    INFO("prompt '" << pr["prompt"].get<std::string>() << "'");
    CHECK(testing::GreedyIds(split->session(), ids, 16) ==
          testing::GreedyIds(dense->session(), ids, 16));
    // The stand-in computes its experts with the scalar references: as the SwiGLU split's
    // bound (moe_placement_test.cc), float reassociation well under 1e-3 through the layers.
    CHECK(MaxRelDiff(AllLogits(split->session(), ids), AllLogits(dense->session(), ids)) <= 1e-3);
  }
  CHECK(split->moe()->device_expert_calls() > 0);
  CHECK(split->moe()->host_expert_calls() > 0);
  CHECK(device.ffn_launches() == split->moe()->device_expert_calls());
}

TEST_CASE("a sparse ReLU mixture holds its experts' down once: the file's pages leave",
          "[moe][sparse]") {
  auto model = LlamaModel::Load(ReluMoePath());  // its own mapping: no other test touches it
  REQUIRE(model.ok());
  const LlamaModel& m = **model;
  const void* file_data = m.layers()[0].expert_down[0].data;
  ThreadPool pool(2);
  const std::vector<int32_t> prompt = {1, 403, 261, 290, 7, 45, 300, 41, 17, 260, 33};
  std::vector<int32_t> dense_ids;
  {
    // Dense from the file's mapping (no copies), so that the experts' pages are in the process.
    EngineOptions rows = Options();
    rows.repack = false;
    auto dense = NewEngineSession(m, std::nullopt, pool, rows);
    dense_ids = testing::GreedyIds(dense->session(), prompt, 16);
  }
  const int64_t rss_dense = MappingRss(file_data);
  REQUIRE(rss_dense > 0);
  const uint64_t down = ExpertDownBytes(m);
  INFO("file mapping Rss after dense decode " << rss_dense << ", experts' down " << down);
  REQUIRE(static_cast<double>(down) > 0.25 * rss_dense);  // the check below has room to fail

  auto sparse = NewEngineSession(m, HostPlan(m), pool, Options());
  const Engine& engine = sparse->engine();
  // Each layer's experts are one range: all of it but its two partial end pages.
  const double pages_slack = 2.0 * 4096 * m.hparams().n_layer;
  // (The engine's other copies, of attention and the head, are PackedWeights'.)
  const ExpertWeights& experts = *engine.expert_weights();
  CHECK(experts.released_file_bytes() + pages_slack >= down);
  CHECK(experts.released_file_bytes() <= down);
  CHECK(experts.bytes() == down);  // the down_t copies (F32: the same bytes)
  CHECK(engine.host_bytes() == down + engine.packed_weights()->bytes());
  // Prefill (chunks of 8 and 3) and decode over the copies: the same tokens, and the pages of
  // the experts' down stay out.
  CHECK(testing::GreedyIds(sparse->session(), prompt, 16) == dense_ids);
  const int64_t rss_sparse = MappingRss(file_data);
  INFO("file mapping Rss after sparse prefill and decode " << rss_sparse);
  CHECK(rss_sparse + static_cast<double>(down) <= rss_dense + pages_slack);
}

TEST_CASE("a SwiGLU mixture copies only its device experts' down", "[moe][sparse]") {
  const LlamaModel& m = CachedModel(TestModelPath("arch/stories260K-llama-moe.gguf"));
  const LlamaHparams& h = m.hparams();
  REQUIRE(h.activation == FfnActivation::kSilu);
  ThreadPool pool(2);
  auto dense = NewEngineSession(m, std::nullopt, pool, Options());
  auto host = NewEngineSession(m, HostPlan(m), pool, Options());
  CHECK_FALSE(host->engine().expert_weights()->sparse_host());
  // No neuron to skip: the file's experts, dense (the engine's other copies, of attention and
  // the head, are PackedWeights').
  CHECK(host->engine().expert_weights()->bytes() == 0);
  CHECK(host->engine().expert_weights()->released_file_bytes() == 0);
  // Experts placed on a device that is not there: their down_t is copied (the device's form)
  // and their down released; the session runs them on the host over the copies.
  SparsePlan plan = HostPlan(m);
  plan.layers[0].device_experts = {1, 2};
  auto placed = NewEngineSession(m, std::move(plan), pool, Options());
  const ExpertWeights& experts = *placed->engine().expert_weights();
  CHECK(experts.down_t(0, 0) == nullptr);
  CHECK(experts.down_t(0, 1) != nullptr);
  CHECK(experts.down_t(0, 2) != nullptr);
  CHECK(experts.down_t(1, 1) == nullptr);
  const WeightView& d = m.layers()[0].expert_down[1];
  CHECK(experts.bytes() == 2 * d.rows * d.row_bytes);
  CHECK(experts.released_file_bytes() <= 2 * d.rows * d.row_bytes);
  const nlohmann::json ref = testing::LoadReference("arch/stories260K-llama-moe.llama-cpp.json");
  for (const nlohmann::json& pr : ref["prompts"]) {
    const std::vector<int32_t> ids = pr["prompt_ids"].get<std::vector<int32_t>>();
    INFO("prompt '" << pr["prompt"].get<std::string>() << "'");
    const std::vector<int32_t> want = testing::GreedyIds(dense->session(), ids, 16);
    CHECK(testing::GreedyIds(host->session(), ids, 16) == want);
    CHECK(testing::GreedyIds(placed->session(), ids, 16) == want);
    // The placed experts' down as an axpy over down_t, summed in another order: as above.
    CHECK(MaxRelDiff(AllLogits(placed->session(), ids), AllLogits(dense->session(), ids)) <= 1e-4);
  }
}

}  // namespace
}  // namespace thermocline
