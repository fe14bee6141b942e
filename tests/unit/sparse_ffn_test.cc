// SparseFfn on relu-tiny without predictors (every neuron a candidate, exact ReLU zeros
// dropped): equals the dense FFN, in oracle mode too; and the hybrid split — any placement,
// two executors running concurrently — equals the single executor.
#include "engine/sparse/sparse_ffn.h"

#include <algorithm>
#include <cmath>
#include <random>

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

}  // namespace
}  // namespace thermocline
