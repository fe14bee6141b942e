// The activation profiler against an independent count: the test recomputes every FFN
// activation from the observed input x with the model's weights (scalar reference products)
// and counts firings itself.
#include <cmath>
#include <vector>

#include "engine/model/llama_model.h"
#include "engine/ops/matmul.h"
#include "offline/profile/activation_profiler.h"
#include "offline/profile/profile_run.h"
#include "test_util.h"

namespace thermocline::offline {
namespace {

using thermocline::testing::TestModelPath;

// Recomputes act = relu(gate · xb) * (up · xb), xb = ffn_norm(x), and counts act != 0.
class DirectCounter final : public FfnObserver {
 public:
  explicit DirectCounter(const LlamaModel& m)
      : model_(m), counts_(m.hparams().n_layer, std::vector<uint64_t>(m.hparams().n_ff, 0)) {}
  void OnFfn(int layer, const float* x, int64_t n_embd, const float* /*act*/, int64_t n_ff,
             int64_t n_tokens) override {
    const LayerWeights& w = model_.layers()[layer];
    std::vector<float> xb(n_embd), g(n_ff), u(n_ff);
    for (int64_t t = 0; t < n_tokens; ++t) {
      const float* xt = x + t * n_embd;
      double ss = 0;
      for (int64_t i = 0; i < n_embd; ++i) ss += double{xt[i]} * xt[i];
      const double scale = 1.0 / std::sqrt(ss / n_embd + model_.hparams().rms_eps);
      for (int64_t i = 0; i < n_embd; ++i)
        xb[i] = static_cast<float>(xt[i] * scale) * w.ffn_norm[i];
      MatMulReference(w.ffn_gate, xb.data(), 1, g.data());
      MatMulReference(w.ffn_up, xb.data(), 1, u.data());
      for (int64_t i = 0; i < n_ff; ++i) {
        const double a = g[i] > 0 ? double{g[i]} * u[i] : 0.0;
        if (a != 0.0) counts_[layer][i]++;
        if (layer == 0) ++cells_;
      }
    }
    if (layer == 0) tokens_ += n_tokens;
  }
  const std::vector<uint64_t>& counts(int l) const { return counts_[l]; }
  int64_t tokens() const { return tokens_; }

 private:
  const LlamaModel& model_;
  std::vector<std::vector<uint64_t>> counts_;
  int64_t tokens_ = 0;
  int64_t cells_ = 0;
};

// Independent definitions of the two statistics, written out again on purpose.
double DirectSparsity(const std::vector<uint64_t>& c, int64_t tokens) {
  double fired = 0;
  for (uint64_t v : c) fired += v;
  return 1.0 - fired / (double(tokens) * c.size());
}
double DirectSkew80(std::vector<uint64_t> c) {
  std::sort(c.rbegin(), c.rend());
  double total = 0;
  for (uint64_t v : c) total += v;
  double run = 0;
  for (size_t i = 0; i < c.size(); ++i) {
    run += c[i];
    if (run >= 0.8 * total) return double(i + 1) / c.size();
  }
  return 1.0;
}

TEST_CASE("profiler sparsity and skew80 equal a direct count on relu-tiny", "[offline]") {
  const std::string path = TestModelPath("relu-tiny.f32.gguf");
  if (!std::filesystem::exists(path)) THERMOCLINE_SKIP("relu-tiny.f32.gguf not found");
  auto model = LlamaModel::Load(path);
  REQUIRE(model.ok());
  ThreadPool pool(2);
  ProfilerOptions po;
  po.max_samples = 256;
  ActivationProfiler profiler((*model)->hparams(), po);
  DirectCounter direct(**model);
  ProfileRunOptions ro;
  ro.tokens = 1024;
  ro.corpus_path = TestModelPath("tinystories-profile.txt");
  ro.also_observe = &direct;
  auto source = RunProfile(**model, pool, profiler, ro, nullptr);
  REQUIRE(source.ok());
  CHECK(source->kind == "corpus");
  CHECK(source->tokens == 1024);
  REQUIRE(direct.tokens() == profiler.tokens());
  CHECK(profiler.num_samples() == 256);

  std::vector<double> sparsity;
  for (int l = 0; l < profiler.n_layer(); ++l) {
    const LayerStats& s = profiler.layer(l);
    // Recomputed activations may differ in the last bits, so a neuron at gate ~ 0 can flip:
    // allow one flip per 10^4 decisions.
    const double sp = Sparsity(s.fire_count, profiler.tokens());
    CHECK(std::abs(sp - DirectSparsity(direct.counts(l), direct.tokens())) < 1e-4);
    CHECK(std::abs(SkewFraction(s.fire_count, 0.8) - DirectSkew80(direct.counts(l))) <= 0.004);
    uint64_t fired = 0;
    for (uint64_t c : s.fire_count) fired += c;
    CHECK(fired == s.fired_total);
    sparsity.push_back(sp);
  }
  // The model card: layer 0 about 95% sparse, layer 5 about 70%, mean about 84%.
  CHECK(sparsity.front() == Approx(0.95).margin(0.03));
  CHECK(sparsity.back() == Approx(0.70).margin(0.05));
  // Each sample's mask holds as many firings as its share of counts suggests (sanity).
  const uint64_t* m = profiler.SampleMask(0, 0);
  int ones = 0;
  for (int64_t w = 0; w < profiler.mask_words(); ++w) ones += __builtin_popcountll(m[w]);
  CHECK(ones < profiler.n_ff() / 2);
}

TEST_CASE("SwiGLU magnitude threshold gives the target sparsity (stories260K)", "[offline]") {
  const std::string path = TestModelPath("stories260K.gguf");
  if (!std::filesystem::exists(path)) THERMOCLINE_SKIP("stories260K.gguf not found");
  auto model = LlamaModel::Load(path);
  REQUIRE(model.ok());
  REQUIRE((*model)->hparams().activation == FfnActivation::kSilu);
  ThreadPool pool(2);
  ProfilerOptions po;
  po.max_samples = 64;
  po.target_sparsity = 0.6;
  po.calibration_tokens = 256;
  ActivationProfiler profiler((*model)->hparams(), po);
  ProfileRunOptions ro;
  ro.tokens = 768;
  ro.corpus_path = TestModelPath("tinystories-profile.txt");
  auto source = RunProfile(**model, pool, profiler, ro, nullptr);
  REQUIRE(source.ok());
  CHECK(profiler.tokens() == 768);
  CHECK(profiler.observed_tokens() == 768 + 256);
  for (int l = 0; l < profiler.n_layer(); ++l) {
    const LayerStats& s = profiler.layer(l);
    CHECK(s.threshold > 0);
    // Calibrated on the first 256 tokens, measured on the next 768.
    CHECK(Sparsity(s.fire_count, profiler.tokens()) == Approx(0.6).margin(0.05));
    CHECK(s.AbsQuantile(0.6) == Approx(s.threshold).epsilon(0.15));
    CHECK(s.AbsQuantile(0.2) <= s.AbsQuantile(0.9));
  }
}

TEST_CASE("|act| histogram bins are ordered and bounded", "[offline]") {
  float prev = 0;
  for (int b = 0; b < kAbsHistBins - 1; b += 37) {
    const float hi = AbsHistBinUpper(b);
    CHECK(AbsHistBin(hi) == b);
    CHECK(hi >= prev);
    prev = hi;
  }
  CHECK(AbsHistBin(0.0f) == 0);
  CHECK(AbsHistBin(-2.5f) == AbsHistBin(2.5f));
  CHECK(SkewFraction({10, 0, 0, 0}, 0.8) == Approx(0.25));
  CHECK(SkewFraction({1, 1, 1, 1, 1}, 0.8) == Approx(0.8));
  CHECK(Sparsity({1, 0}, 2) == Approx(0.75));
}

}  // namespace
}  // namespace thermocline::offline
