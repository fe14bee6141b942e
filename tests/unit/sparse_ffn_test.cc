// SparseFfn on relu-tiny without predictors (every neuron a candidate, exact ReLU zeros
// dropped): equals the dense FFN, in oracle mode too; and the hybrid split — any placement,
// two executors running concurrently — equals the single executor.
#include "engine/sparse/sparse_ffn.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "engine/model/cpu_ops.h"
#include "engine/model/session.h"
#include "model_fixtures.h"

namespace thermocline {
namespace {

using testing::CachedModel;
using testing::TestModelPath;

std::vector<SparseLayerPlan> PlanWithPlacement(const LlamaModel& model, std::mt19937& rng,
                                               int mode) {
  const int64_t n_ff = model.hparams().n_ff;
  std::vector<SparseLayerPlan> plan(model.hparams().n_layer);
  for (SparseLayerPlan& p : plan) {
    // mode 0: nothing on the device, 1: everything, 2: a random subset of random size.
    const double frac = mode == 0   ? 0.0
                        : mode == 1 ? 1.0
                                    : std::uniform_real_distribution<>(0.05, 0.95)(rng);
    for (int32_t i = 0; i < n_ff; ++i) {
      if (std::uniform_real_distribution<>(0, 1)(rng) < frac) p.device_neurons.push_back(i);
    }
  }
  return plan;
}

// Relative distance with a floor: float sums of n_ff terms in another order.
double MaxRelDiff(const std::vector<float>& a, const std::vector<float>& b) {
  double scale = 0, diff = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    scale = std::max(scale, std::fabs(static_cast<double>(b[i])));
    diff = std::max(diff, std::fabs(static_cast<double>(a[i]) - b[i]));
  }
  return diff / std::max(scale, 1e-6);
}

TEST_CASE("sparse FFN equals dense; two executors equal one for any placement", "[sparse]") {
  const std::string path = TestModelPath("relu-tiny.f32.gguf");
  if (!std::filesystem::exists(path)) THERMOCLINE_SKIP("relu-tiny.f32.gguf not found");
  const LlamaModel& model = CachedModel(path);
  const LlamaHparams& h = model.hparams();
  ThreadPool pool(2);
  auto session = Session::Create(model, &pool);
  REQUIRE(session.ok());
  std::mt19937 rng(7);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> x(h.n_embd), xn(h.n_embd), dense(h.n_embd), single(h.n_embd), split(h.n_embd),
      oracle(h.n_embd);
  for (int mode : {0, 1, 2, 2, 2}) {
    SparseFfnOptions one, two, orc;
    two.split = true;
    two.device_threads = mode == 2 ? 2 : 1;
    orc.oracle = true;
    orc.split = true;
    auto a = SparseFfn::Create(model, PlanWithPlacement(model, rng, mode), &pool, one);
    std::mt19937 same(rng);
    auto b = SparseFfn::Create(model, PlanWithPlacement(model, rng, mode), &pool, two);
    auto c = SparseFfn::Create(model, PlanWithPlacement(model, same, mode), &pool, orc);
    REQUIRE(a.ok());
    REQUIRE(b.ok());
    REQUIRE(c.ok());
    for (int layer = 0; layer < h.n_layer; ++layer) {
      for (float& f : x) f = dist(rng);
      for (int64_t i = 0; i < h.n_embd; ++i) xn[i] = x[i] * model.layers()[layer].ffn_norm[i];
      (*session)->DenseFfn(layer, x.data(), xn.data(), 1, dense.data());
      (*a)->Forward(layer, x.data(), xn.data(), 1, single.data());
      (*b)->Forward(layer, x.data(), xn.data(), 1, split.data());
      (*c)->Forward(layer, x.data(), xn.data(), 1, oracle.data());
      INFO("mode " << mode << " layer " << layer);
      CHECK(MaxRelDiff(single, dense) < 1e-5);
      CHECK(MaxRelDiff(split, single) < 1e-5);
      CHECK(MaxRelDiff(oracle, dense) < 1e-5);
    }
    // ReLU: about half the neurons fire on random inputs; none are predicted away.
    CHECK((*a)->stats().predicted == (*a)->stats().layer_tokens * static_cast<double>(h.n_ff));
    CHECK((*a)->stats().fired < (*a)->stats().predicted);
    CHECK((*b)->stats().fired == (*a)->stats().fired);
  }
}

// A random rank-8 predictor, firing counts and thresholds: the fused path (one slice of slots
// per thread, rows in firing order) against a reference computed from the model's own rows in
// model order, for 1 to 3 threads; and the layout: slots sorted by count, a permutation.
TEST_CASE("fused sparse path with a predictor and rows in firing order equals the reference",
          "[sparse]") {
  const std::string path = TestModelPath("relu-tiny.f32.gguf");
  if (!std::filesystem::exists(path)) THERMOCLINE_SKIP("relu-tiny.f32.gguf not found");
  const LlamaModel& model = CachedModel(path);
  const LlamaHparams& h = model.hparams();
  const int64_t rank = 8;
  std::mt19937 rng(11);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  auto make_plan = [&](uint32_t seed) {
    std::mt19937 r(seed);
    std::normal_distribution<float> d(0.0f, 1.0f);
    std::vector<SparseLayerPlan> plan(h.n_layer);
    for (SparseLayerPlan& p : plan) {
      std::vector<float> fc1(rank * h.n_embd), fc2(h.n_ff * rank);
      for (float& f : fc1) f = d(r) / std::sqrt(static_cast<float>(h.n_embd));
      for (float& f : fc2) f = d(r);
      p.rank = rank;
      p.fc1 = MakeWeight(GgmlType::kF32, fc1.data(), rank, h.n_embd);
      p.fc2 = MakeWeight(GgmlType::kF32, fc2.data(), h.n_ff, rank);
      p.b1.resize(rank);
      p.b2.resize(h.n_ff);
      for (float& f : p.b1) f = 0.1f * d(r);
      for (float& f : p.b2) f = d(r);
      p.threshold = 0.5f;
      p.fire_count.resize(h.n_ff);
      // Power-law-like counts with ties, so that the stable order matters too.
      for (int32_t& c : p.fire_count) c = static_cast<int32_t>(std::exp(2.0f * d(r))) / 4;
    }
    return plan;
  };
  std::vector<float> x(h.n_embd), xn(h.n_embd), got(h.n_embd), want(h.n_embd);
  std::vector<float> gate(h.n_ff), up(h.n_ff), act(h.n_ff), hidden(rank), logit(h.n_ff);
  for (int threads : {1, 2, 3}) {
    ThreadPool pool(threads);
    auto ffn = SparseFfn::Create(model, make_plan(5), &pool, SparseFfnOptions{});
    REQUIRE(ffn.ok());
    const std::vector<SparseLayerPlan> plan = make_plan(5);  // the same draws, for the reference
    for (int layer = 0; layer < h.n_layer; ++layer) {
      const SparseLayerPlan& p = plan[layer];
      const LayerWeights& L = model.layers()[layer];
      const std::vector<int32_t>& order = (*ffn)->weights()->layer(layer).neuron_of;
      std::vector<int32_t> sorted(order);
      std::sort(sorted.begin(), sorted.end());
      for (int32_t i = 0; i < h.n_ff; ++i) REQUIRE(sorted[i] == i);
      for (int64_t s = 1; s < h.n_ff; ++s) {
        REQUIRE(p.fire_count[order[s - 1]] >= p.fire_count[order[s]]);
        if (p.fire_count[order[s - 1]] == p.fire_count[order[s]]) REQUIRE(order[s - 1] < order[s]);
      }
      for (float& f : x) f = dist(rng);
      for (int64_t i = 0; i < h.n_embd; ++i) xn[i] = x[i] * L.ffn_norm[i];
      (*ffn)->Forward(layer, x.data(), xn.data(), 1, got.data());
      // Reference: predictor in model order, dense gate/up, down over the predicted neurons.
      MatMulReference(p.fc1.view, xn.data(), 1, hidden.data());
      for (int64_t j = 0; j < rank; ++j) hidden[j] = std::max(0.0f, hidden[j] + p.b1[j]);
      MatMulReference(p.fc2.view, hidden.data(), 1, logit.data());
      MatMulReference(L.ffn_gate, xn.data(), 1, gate.data());
      MatMulReference(L.ffn_up, xn.data(), 1, up.data());
      GatedActivation(h.activation, gate.data(), up.data(), h.n_ff);
      int64_t predicted = 0;
      for (int64_t i = 0; i < h.n_ff; ++i) {
        const bool on = logit[i] + p.b2[i] > p.threshold;
        predicted += on;
        act[i] = on ? gate[i] : 0.0f;
      }
      MatMulReference(L.ffn_down, act.data(), 1, want.data());
      INFO("threads " << threads << " layer " << layer << " predicted " << predicted);
      REQUIRE(predicted > 0);
      REQUIRE(predicted < h.n_ff);
      CHECK(MaxRelDiff(got, want) < 1e-4);
    }
    const SparseFfnStats& st = (*ffn)->stats();
    CHECK(st.layer_tokens == h.n_layer);
    CHECK(st.predicted > st.fired);
    CHECK(st.predictor_s > 0);
  }
}

}  // namespace
}  // namespace thermocline
