// thermocline synth with --sparsity / --hot-fraction: the power-law firing table, and a model
// whose ReLU neurons really fire that often, measured over tokens with the dense FFN.
#include "bench/synth.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "engine/model/llama_model.h"
#include "engine/model/session.h"
#include "engine/sparse/moe_ffn.h"
#include "model_fixtures.h"
#include "test_util.h"

namespace thermocline {
namespace {

TEST_CASE("PowerLawFiring: mean, order, hot neurons, unreachable targets", "[synth]") {
  for (double sparsity : {0.8, 0.9, 0.95}) {
    for (double hot : {0.01, 0.03}) {
      auto p = PowerLawFiring(5632, sparsity, hot);
      REQUIRE(p.ok());
      const double mean = std::accumulate(p->begin(), p->end(), 0.0) / p->size();
      CHECK(mean == Approx(1 - sparsity).margin(0.002));
      CHECK(std::is_sorted(p->rbegin(), p->rend()));
      const auto above_half = std::count_if(p->begin(), p->end(), [](double v) { return v > 0.5; });
      CHECK(above_half == Approx(hot * 5632).margin(1.5));
      CHECK(p->front() <= 0.99);
    }
  }
  // 30% hot neurons alone fire for more than 10% of the neurons.
  CHECK(PowerLawFiring(1000, 0.9, 0.3).status().code() == absl::StatusCode::kInvalidArgument);
  CHECK_FALSE(PowerLawFiring(1000, 0.2, 0.05).ok());
  CHECK_FALSE(PowerLawFiring(1000, 0.9, 0).ok());
}

// Counts, per neuron, the tokens whose activation is nonzero.
struct FiringCounter : FfnObserver {
  std::vector<std::vector<int64_t>> counts;
  int64_t tokens = 0;
  void OnFfn(int layer, const float*, int64_t, const float* act, int64_t n_ff,
             int64_t n_tokens) override {
    if (counts.size() <= static_cast<size_t>(layer)) counts.resize(layer + 1);
    counts[layer].resize(n_ff);
    for (int64_t t = 0; t < n_tokens; ++t) {
      for (int64_t i = 0; i < n_ff; ++i) counts[layer][i] += act[t * n_ff + i] != 0.0f;
    }
    if (layer == 0) tokens += n_tokens;
  }
};

// A small ReLU model at 90% sparsity, 3% hot neurons.
SynthOptions SparseOptions(GgmlType type) {
  SynthOptions o;
  o.n_layer = 3;
  o.n_embd = 256;
  o.n_ff = 1024;
  o.n_head = 4;
  o.n_head_kv = 2;
  o.n_vocab = 2000;
  o.type = type;
  o.activation = FfnActivation::kRelu;
  o.sparsity = 0.9;
  o.hot_fraction = 0.03;
  return o;
}

TEST_CASE("synth --sparsity makes ReLU neurons fire at the asked rate", "[synth]") {
  SynthOptions o = SparseOptions(GgmlType::kF32);
  ThreadPool pool(2);
  const std::string path = (testing::TempDir() / "synth-sparse.gguf").string();
  REQUIRE(SynthesizeModel(o, path, pool).ok());
  auto model = LlamaModel::Load(path);
  REQUIRE(model.ok());
  auto session = Session::Create(**model, &pool);
  REQUIRE(session.ok());
  FiringCounter counter;
  (*session)->set_ffn_observer(&counter);
  std::vector<int32_t> tokens(256);
  for (size_t i = 0; i < tokens.size(); ++i)
    tokens[i] = static_cast<int32_t>((i * 7919 + 3) % 2000);
  REQUIRE((*session)->Eval(tokens).ok());
  REQUIRE(counter.tokens == 256);
  for (size_t l = 0; l < counter.counts.size(); ++l) {
    INFO("layer " << l);
    const std::vector<int64_t>& c = counter.counts[l];
    const double fired = std::accumulate(c.begin(), c.end(), 0.0) / (256.0 * o.n_ff);
    CHECK(fired == Approx(0.1).margin(0.02));
    // Hot neurons: those firing for more than half the tokens, about 3% of them.
    const auto hot = std::count_if(c.begin(), c.end(), [](int64_t v) { return v > 128; });
    CHECK(hot == Approx(0.03 * o.n_ff).margin(0.015 * o.n_ff));
    // Power law: the hottest 20% of neurons carry at least half of the firing (uniform
    // firing would give them 20%; this table gives ~60%).
    std::vector<int64_t> sorted = c;
    std::sort(sorted.rbegin(), sorted.rend());
    const double top = std::accumulate(sorted.begin(), sorted.begin() + o.n_ff / 5, 0.0);
    CHECK(top / std::accumulate(c.begin(), c.end(), 0.0) > 0.5);
  }
  o.activation = FfnActivation::kSilu;
  CHECK_FALSE(SynthesizeModel(o, path, pool).ok());
}

TEST_CASE("synth --experts with --sparsity: every expert's neurons fire at the asked rate",
          "[synth][moe]") {
  SynthOptions o = SparseOptions(GgmlType::kF32);
  o.n_expert = 4;
  o.n_expert_used = 2;
  ThreadPool pool(2);
  const std::string path = (testing::TempDir() / "synth-sparse-moe.gguf").string();
  REQUIRE(SynthesizeModel(o, path, pool).ok());
  auto model = LlamaModel::Load(path);
  REQUIRE(model.ok());
  REQUIRE((*model)->hparams().n_expert == 4);
  SparsePlan every_expert_on_the_host;
  every_expert_on_the_host.layers.resize(o.n_layer);
  EngineOptions eo;
  eo.n_ctx = 256;
  auto s = testing::NewEngineSession(**model, std::move(every_expert_on_the_host), pool, eo);
  REQUIRE(s->moe() != nullptr);
  for (int i = 0; i < 96; ++i) {  // decode steps: the host experts compute firing neurons only
    const int32_t token = static_cast<int32_t>((i * 7919 + 3) % 2000);
    REQUIRE(s->session().Eval({&token, 1}).ok());
  }
  const MoeFfn& moe = *s->moe();
  REQUIRE(moe.host_expert_calls() > 0);
  const double fired = static_cast<double>(moe.host_expert_neurons()) /
                       (static_cast<double>(moe.host_expert_calls()) * o.n_ff);
  CHECK(fired == Approx(0.1).margin(0.03));  // --sparsity 0.9, as the dense FFN's test
  // Experts are placed whole: no implied predictors.
  CHECK(!SynthPredictors(o).ok());
}

// Runs the implied predictors of `predictors` on each token's FFN input (the norms of a
// synthetic model are ones, so xn = x / rms(x)) and counts, over all layers, the neurons that
// fired, those also predicted, and all predicted.
struct PredictorScorer : FfnObserver {
  const std::vector<SynthPredictor>* predictors = nullptr;
  int64_t fired = 0, fired_and_predicted = 0, predicted = 0, pairs = 0;
  void OnFfn(int layer, const float* x, int64_t n_embd, const float* act, int64_t n_ff,
             int64_t n_tokens) override {
    const SynthPredictor& p = (*predictors)[layer];
    std::vector<double> xn(n_embd), hidden(p.rank);
    for (int64_t t = 0; t < n_tokens; ++t) {
      const float* xt = x + t * n_embd;
      double ss = 0;
      for (int64_t j = 0; j < n_embd; ++j) ss += double{xt[j]} * xt[j];
      const double inv_rms = 1.0 / std::sqrt(ss / n_embd + 1e-5);
      for (int64_t j = 0; j < n_embd; ++j) xn[j] = xt[j] * inv_rms;
      for (int64_t k = 0; k < p.rank; ++k) {
        double h = p.b1[k];
        for (int64_t j = 0; j < n_embd; ++j) h += double{p.fc1[k * n_embd + j]} * xn[j];
        hidden[k] = std::max(0.0, h);
      }
      for (int64_t i = 0; i < n_ff; ++i) {
        double logit = p.b2[i];
        for (int64_t k = 0; k < p.rank; ++k) logit += double{p.fc2[i * p.rank + k]} * hidden[k];
        const bool on = logit > p.threshold, fire = act[t * n_ff + i] != 0.0f;
        predicted += on;
        fired += fire;
        fired_and_predicted += on && fire;
        ++pairs;
      }
    }
  }
};

TEST_CASE("synth's calibrated predictors reach their recall on other tokens", "[synth]") {
  const SynthOptions o = SparseOptions(GgmlType::kQ4_0);
  ThreadPool pool(2);
  const std::string path = (testing::TempDir() / "synth-predictors.gguf").string();
  REQUIRE(SynthesizeModel(o, path, pool).ok());
  auto model = LlamaModel::Load(path);
  REQUIRE(model.ok());
  auto construction = SynthPredictors(o);
  REQUIRE(construction.ok());
  REQUIRE(construction->size() == 3);
  std::vector<SynthPredictor> calibrated = *construction;
  REQUIRE(CalibrateSynthThresholds(**model, pool, 0.99, 128, calibrated).ok());
  // Scored on tokens the calibration did not see.
  auto score = [&](const std::vector<SynthPredictor>& predictors) {
    auto session = Session::Create(**model, &pool);
    REQUIRE(session.ok());
    PredictorScorer scorer;
    scorer.predictors = &predictors;
    (*session)->set_ffn_observer(&scorer);
    std::vector<int32_t> tokens(256);
    for (size_t i = 0; i < tokens.size(); ++i)
      tokens[i] = static_cast<int32_t>((i * 104729 + 11) % 2000);
    REQUIRE((*session)->Eval(tokens).ok());
    return scorer;
  };
  const PredictorScorer bound = score(*construction), cal = score(calibrated);
  const double recall = static_cast<double>(cal.fired_and_predicted) / cal.fired;
  const double bound_recall = static_cast<double>(bound.fired_and_predicted) / bound.fired;
  const double fired = static_cast<double>(cal.fired) / cal.pairs;
  INFO("calibrated: recall " << recall << ", predicted "
                             << static_cast<double>(cal.predicted) / cal.pairs
                             << "; construction: " << bound_recall << ", "
                             << static_cast<double>(bound.predicted) / bound.pairs << "; fired "
                             << fired);
  // 0.99 on the calibration tokens; 256 others measure it to within about 0.005.
  CHECK(recall >= 0.98);
  CHECK(recall < 0.997);
  // The construction's threshold is a bound: nearly every firing, many more predictions.
  CHECK(bound_recall > 0.997);
  CHECK(cal.predicted < bound.predicted);
  CHECK(static_cast<double>(cal.predicted) / cal.pairs < 1.5 * fired);
  for (size_t l = 0; l < calibrated.size(); ++l) {
    CHECK(calibrated[l].threshold > (*construction)[l].threshold);
  }
  std::vector<SynthPredictor> two(calibrated.begin(), calibrated.begin() + 2);
  CHECK_FALSE(CalibrateSynthThresholds(**model, pool, 0.99, 128, two).ok());
  CHECK_FALSE(CalibrateSynthThresholds(**model, pool, 1.0, 128, calibrated).ok());
}

}  // namespace
}  // namespace thermocline
