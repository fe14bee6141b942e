// SparseFfn on relu-tiny without predictors (every neuron a candidate, exact ReLU zeros
// dropped): equals the dense FFN, in oracle mode too; and the hybrid split — any placement, the
// device part on a CPU stand-in device — equals the single executor. With predictors: the fused
// path equals the reference, and an ActiveSetObserver sees the rows it read (the read floor),
// which are the rows the ideal ratio's byte counts assume.
#include "engine/sparse/sparse_ffn.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "bench/cpu_device.h"
#include "bench/sparse_read_floor.h"
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

// relu-tiny (cached), or nullptr when the test models are not there.
const LlamaModel* ReluTiny() {
  const std::string path = TestModelPath("relu-tiny.f32.gguf");
  return std::filesystem::exists(path) ? &CachedModel(path) : nullptr;
}

// The predictor's logits without b2, in model order: fc2 · relu(fc1 · xn + b1).
void ReferenceLogits(const SparseLayerPlan& p, const float* xn, float* hidden, float* logit) {
  MatMulReference(p.fc1.view, xn, 1, hidden);
  for (int64_t j = 0; j < p.rank; ++j) hidden[j] = std::max(0.0f, hidden[j] + p.b1[j]);
  MatMulReference(p.fc2.view, hidden, 1, logit);
}

TEST_CASE("sparse FFN equals dense; two executors equal one for any placement", "[sparse]") {
  const LlamaModel* relu_tiny = ReluTiny();
  if (relu_tiny == nullptr) THERMOCLINE_SKIP("relu-tiny.f32.gguf not found");
  const LlamaModel& model = *relu_tiny;
  const LlamaHparams& h = model.hparams();
  ThreadPool pool(2);
  auto session = Session::Create(model, &pool);
  REQUIRE(session.ok());
  std::mt19937 rng(7);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> x(h.n_embd), xn(h.n_embd), dense(h.n_embd), single(h.n_embd), split(h.n_embd),
      oracle(h.n_embd);
  // The device part on the CPU stand-in device: the split and the merge SparseFfn does with a GPU.
  CpuStandInDevice device;
  for (int mode : {0, 1, 2, 2, 2}) {
    SparseFfnOptions one, two, orc;
    two.gpu = true;
    two.device = &device;
    orc.oracle = true;
    orc.gpu = true;
    orc.device = &device;
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
    REQUIRE((*b)->gpu_status().ok());
  }
  CHECK(device.ffn_launches() > 0);
}

// A random rank-8 predictor, firing counts and thresholds: the fused path (one slice of slots
// per thread, rows in firing order) against a reference computed from the model's own rows in
// model order, for 1 to 3 threads; and the layout: slots sorted by count, a permutation.
// Random predictors of `rank` (the same plan for the same seed) and power-law-like firing
// counts with ties, so that the stable firing order matters too.
std::vector<SparseLayerPlan> PlanWithPredictor(const LlamaModel& model, int64_t rank,
                                               uint32_t seed) {
  const LlamaHparams& h = model.hparams();
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
    for (int32_t& c : p.fire_count) c = static_cast<int32_t>(std::exp(2.0f * d(r))) / 4;
  }
  return plan;
}

TEST_CASE("fused sparse path with a predictor and rows in firing order equals the reference",
          "[sparse]") {
  const LlamaModel* relu_tiny = ReluTiny();
  if (relu_tiny == nullptr) THERMOCLINE_SKIP("relu-tiny.f32.gguf not found");
  const LlamaModel& model = *relu_tiny;
  const LlamaHparams& h = model.hparams();
  const int64_t rank = 8;
  std::mt19937 rng(11);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  auto make_plan = [&](uint32_t seed) { return PlanWithPredictor(model, rank, seed); };
  std::vector<float> x(h.n_embd), xn(h.n_embd), got(h.n_embd), want(h.n_embd);
  std::vector<float> gate(h.n_ff), up(h.n_ff), act(h.n_ff), hidden(rank), logit(h.n_ff);
  for (int threads : {1, 2, 3}) {
    ThreadPool pool(threads);
    auto ffn = SparseFfn::Create(model, make_plan(5), &pool, SparseFfnOptions{});
    REQUIRE(ffn.ok());
    // With a device part (a random half of the neurons, on the CPU stand-in device) the device
    // predicts its neurons and the host's fused path the rest: the same sets, summed.
    CpuStandInDevice device;
    SparseFfnOptions split_options;
    split_options.gpu = true;
    split_options.device = &device;
    std::vector<SparseLayerPlan> split_plan = make_plan(5);
    std::mt19937 pick(3);
    for (SparseLayerPlan& p : split_plan) {
      for (int32_t i = 0; i < h.n_ff; ++i) {
        if (pick() % 2) p.device_neurons.push_back(i);
      }
    }
    auto split = SparseFfn::Create(model, std::move(split_plan), &pool, split_options);
    REQUIRE(split.ok());
    std::vector<float> got_split(h.n_embd);
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
      (*split)->Forward(layer, x.data(), xn.data(), 1, got_split.data());
      // Reference: predictor in model order, dense gate/up, down over the predicted neurons.
      ReferenceLogits(p, xn.data(), hidden.data(), logit.data());
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
      CHECK(MaxRelDiff(got_split, want) < 1e-4);
    }
    CHECK((*split)->stats().predicted == (*ffn)->stats().predicted);
    CHECK(device.ffn_launches() == h.n_layer);
    const SparseFfnStats& st = (*ffn)->stats();
    CHECK(st.layer_tokens == h.n_layer);
    CHECK(st.predicted > st.fired);
    CHECK(st.predictor_s > 0);
  }
}

TEST_CASE("the active-set recorder sees the rows the fused path read, and they replay",
          "[sparse]") {
  const LlamaModel* relu_tiny = ReluTiny();
  if (relu_tiny == nullptr) THERMOCLINE_SKIP("relu-tiny.f32.gguf not found");
  const LlamaModel& model = *relu_tiny;
  const LlamaHparams& h = model.hparams();
  const int64_t rank = 8;
  ThreadPool pool(2);
  const std::vector<SparseLayerPlan> plan = PlanWithPredictor(model, rank, 7);
  // The same plan again (the same seed): the FFN takes its own, the reference reads this one.
  auto ffn = SparseFfn::Create(model, PlanWithPredictor(model, rank, 7), &pool, SparseFfnOptions{});
  REQUIRE(ffn.ok());
  ActiveSetRecorder recorder;
  CHECK(ReplaySparseReads(*(*ffn)->weights(), pool, recorder, 1, 1 << 16) == 0);  // nothing yet
  (*ffn)->set_active_set_observer(&recorder);
  std::mt19937 rng(3);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> x(h.n_embd), out(h.n_embd), hidden(rank), logit(h.n_ff);
  std::vector<std::vector<int32_t>> want_predicted;  // per (token, layer): slots, ascending
  const int tokens = 3;
  for (int t = 0; t < tokens; ++t) {
    for (int layer = 0; layer < h.n_layer; ++layer) {
      for (float& f : x) f = dist(rng);
      (*ffn)->Forward(layer, x.data(), x.data(), 1, out.data());
      // The predictor's choice in slot order; logits within 1e-4 of the threshold are left out
      // (-1), where the kernels' and the reference's roundings may disagree.
      const SparseLayerPlan& p = plan[layer];
      ReferenceLogits(p, x.data(), hidden.data(), logit.data());
      const std::vector<int32_t>& neuron_of = (*ffn)->weights()->layer(layer).neuron_of;
      std::vector<int32_t> want(h.n_ff);
      for (int64_t s = 0; s < h.n_ff; ++s) {
        const float margin = logit[neuron_of[s]] + p.b2[neuron_of[s]] - p.threshold;
        want[s] = std::fabs(margin) < 1e-4f ? -1 : margin > 0;
      }
      want_predicted.push_back(want);
    }
  }
  (*ffn)->set_active_set_observer(nullptr);
  const SparseFfnStats st = (*ffn)->stats();
  const double dense_bytes = (*ffn)->DenseBytesPerToken(),
               sparse_bytes = (*ffn)->SparseBytesPerToken(),
               non_ffn_bytes = (*ffn)->NonFfnBytesPerToken(),
               predictor_bytes = (*ffn)->PredictorBytesPerToken();
  (*ffn)->Forward(0, x.data(), x.data(), 1, out.data());  // unobserved: not recorded

  REQUIRE(recorder.tokens() == tokens);
  REQUIRE(recorder.layers().size() == static_cast<size_t>(tokens * h.n_layer));
  double predicted = 0, fired = 0;
  double ffn_row_bytes = 0;  // of the rows the recorder saw read
  for (size_t i = 0; i < recorder.layers().size(); ++i) {
    const ActiveSetRecorder::Layer& rec = recorder.layers()[i];
    const LayerWeights& L = model.layers()[rec.layer];
    const WeightView& down_t = (*ffn)->weights()->layer(rec.layer).down_t;
    // F32: a neuron's gate, up and down_t rows side by side, so down_t's stride is three rows;
    // the bytes read are a row's.
    const size_t down_row = RowBytes(down_t.type, down_t.cols);
    CHECK(down_t.row_bytes == 3 * down_row);
    INFO("token " << i / h.n_layer << " layer " << rec.layer);
    CHECK(rec.layer == static_cast<int>(i % h.n_layer));
    std::vector<int> seen(h.n_ff, 0);
    for (const ActiveSetRecorder::Chunk& c : rec.chunks) {
      predicted += static_cast<double>(c.predicted.size());
      fired += static_cast<double>(c.fired.size());
      CHECK(std::is_sorted(c.predicted.begin(), c.predicted.end()));
      // ReLU: up rows for the gates that fired, down rows for the nonzero activations.
      CHECK(std::includes(c.predicted.begin(), c.predicted.end(), c.up.begin(), c.up.end()));
      CHECK(std::includes(c.up.begin(), c.up.end(), c.fired.begin(), c.fired.end()));
      for (int32_t s : c.predicted) ++seen[s];
      ffn_row_bytes +=
          static_cast<double>(L.ffn_gate.row_bytes * c.predicted.size() +
                              L.ffn_up.row_bytes * c.up.size() + down_row * c.fired.size());
    }
    for (int64_t s = 0; s < h.n_ff; ++s) {
      CHECK(seen[s] <= 1);  // each slot in at most one chunk
      if (want_predicted[i][s] >= 0) CHECK(seen[s] == want_predicted[i][s]);
    }
  }
  CHECK(predicted == st.predicted);
  CHECK(fired == st.fired);
  CHECK(fired > 0);
  // The bytes behind the ideal ratio: every matrix once for a dense token; for a sparse one
  // attention and the output head whole, the predictors, and the FFN rows the recorder saw
  // (the estimate takes up rows as many as fired: they differ only by exact-zero products).
  double head_and_attention = static_cast<double>(model.output().row_bytes * model.output().rows),
         ffn_all = 0;
  for (const LayerWeights& L : model.layers()) {
    for (const WeightView* w : {&L.wq, &L.wk, &L.wv, &L.wo})
      head_and_attention += w->row_bytes * w->rows;
    for (const WeightView* w : {&L.ffn_gate, &L.ffn_up, &L.ffn_down})
      ffn_all += w->row_bytes * w->rows;
  }
  CHECK(dense_bytes == Approx(head_and_attention + ffn_all));
  CHECK(non_ffn_bytes == Approx(head_and_attention));
  double predictors = 0;
  for (const SparseLayerPlan& p : plan) {
    predictors += static_cast<double>(p.fc1.view.row_bytes * rank + p.fc2.view.row_bytes * h.n_ff +
                                      4 * (rank + h.n_ff));
  }
  CHECK(predictor_bytes == Approx(predictors));
  CHECK(sparse_bytes ==
        Approx(head_and_attention + predictors + ffn_row_bytes / tokens).epsilon(1e-3));
  CHECK(sparse_bytes < dense_bytes);
  CHECK(ReplaySparseReads(*(*ffn)->weights(), pool, recorder, 2, 1 << 16) > 0);
}

// Whichever thread claims which chunk, a token's output is the same bits: the chunks' partial
// sums are added in chunk order, so that sparse decode is reproducible run to run (greedy and
// seeded sampling included), as dense decode is.
TEST_CASE("sparse FFN output does not depend on which thread took which chunk", "[sparse]") {
  const LlamaModel* relu_tiny = ReluTiny();
  if (relu_tiny == nullptr) THERMOCLINE_SKIP("relu-tiny.f32.gguf not found");
  const LlamaModel& model = *relu_tiny;
  const LlamaHparams& h = model.hparams();
  std::mt19937 rng(5);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> x(h.n_embd), xn(h.n_embd), first(h.n_embd), again(h.n_embd);
  for (int threads : {2, 3, 4}) {  // more threads than this machine's cores: assignments vary
    ThreadPool pool(threads);
    auto ffn = SparseFfn::Create(model, PlanWithPredictor(model, 8, 5), &pool, SparseFfnOptions{});
    REQUIRE(ffn.ok());
    int differing = 0;
    for (int layer = 0; layer < h.n_layer; ++layer) {
      for (float& f : x) f = dist(rng);
      for (int64_t i = 0; i < h.n_embd; ++i) xn[i] = x[i] * model.layers()[layer].ffn_norm[i];
      (*ffn)->Forward(layer, x.data(), xn.data(), 1, first.data());
      for (int run = 0; run < 200; ++run) {
        (*ffn)->Forward(layer, x.data(), xn.data(), 1, again.data());
        differing += again != first;
      }
    }
    INFO("threads " << threads);
    CHECK(differing == 0);
  }
}

}  // namespace
}  // namespace thermocline
