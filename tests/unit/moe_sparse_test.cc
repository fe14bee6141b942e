// Neuron sparsity inside the experts of a ReLU mixture, and its memory: on relu-tiny rewritten as
// a llama mixture of 4 experts (2 used), the placed MoE FFN's host experts compute only the
// neurons whose gate fires (engine/sparse/moe_ffn.h) and must give the dense MoE FFN's greedy
// tokens and logits; the experts' down is held once (the file's pages released once copied as
// down_t, prefill over the copies), checked on the Rss of the file's mapping in
// /proc/self/smaps; a SwiGLU mixture copies only its device experts' down.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>

#include "bench/cpu_device.h"
#include "engine/gguf/gguf.h"
#include "engine/runtime/engine.h"
#include "model_fixtures.h"

namespace thermocline {
namespace {

using testing::CachedModel;
using testing::NewEngineSession;
using testing::TestModelPath;

constexpr int64_t kExperts = 4;

std::vector<uint8_t> Bytes(const std::vector<float>& v) {
  std::vector<uint8_t> b(v.size() * sizeof(float));
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

// relu-tiny (F32, a trained ReGLU llama) as a mixture of kExperts experts, 2 used, written once
// per process. Expert 0 is relu-tiny's FFN; expert e > 0 is it with its neurons permuted (gate
// and up rows, down's columns, one permutation per expert and layer) and its down scaled
// element-wise by (1 + 0.1·N(0,1)), so experts differ (routing matters) and a row of one
// expert read with another's index shows. Each expert's gate is relu-tiny's, so its neurons
// fire as sparsely as relu-tiny's (≈ 84%). The router is N(0, 0.5).
std::string ReluMoePath() {
  static const std::string path = [] {
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
      REQUIRE(w.AddTensorCopy(blk + ".ffn_gate_exps.weight", GgmlType::kF32,
                              {n_embd, n_ff, kExperts}, Bytes(gate_exps))
                  .ok());
      REQUIRE(w.AddTensorCopy(blk + ".ffn_up_exps.weight", GgmlType::kF32, {n_embd, n_ff, kExperts},
                              Bytes(up_exps))
                  .ok());
      REQUIRE(w.AddTensorCopy(blk + ".ffn_down_exps.weight", GgmlType::kF32,
                              {n_ff, n_embd, kExperts}, Bytes(down_exps))
                  .ok());
    }
    const std::string out = (testing::TempDir() / "relu-tiny-moe.gguf").string();
    REQUIRE(w.Write(out).ok());
    return out;
  }();
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

// Rss in bytes of the mapping of /proc/self/smaps that contains `p`; -1 when none does.
int64_t MappingRss(const void* p) {
  const auto addr = reinterpret_cast<uintptr_t>(p);
  std::ifstream smaps("/proc/self/smaps");
  std::string line;
  bool inside = false;
  while (std::getline(smaps, line)) {
    unsigned long long begin = 0, end = 0;
    char dash = 0;
    std::istringstream head(line);
    if (line.find(':') > line.find(' ') && (head >> std::hex >> begin >> dash >> end) &&
        dash == '-') {
      inside = addr >= begin && addr < end;
      continue;
    }
    if (inside && line.rfind("Rss:", 0) == 0) {
      std::istringstream rss(line.substr(4));
      int64_t kb = 0;
      rss >> kb;
      return kb * 1024;
    }
  }
  return -1;
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
    auto dense = NewEngineSession(m, std::nullopt, pool, Options());
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
  CHECK(engine.released_file_bytes() + pages_slack >= down);
  CHECK(engine.released_file_bytes() <= down);
  CHECK(engine.host_bytes() == down);  // the down_t copies (F32: the same bytes)
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
  CHECK(host->engine().host_bytes() == 0);  // no neuron to skip: the file's weights, dense
  CHECK(host->engine().released_file_bytes() == 0);
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
  CHECK(placed->engine().released_file_bytes() <= 2 * d.rows * d.row_bytes);
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
