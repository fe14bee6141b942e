// The offline side of input-sparse (TEAL-style) plans: the profiler's histograms of the normed
// inputs of q/k/v and gate/up give the quantiles of the values fed to them; the sidecar keeps
// those quantiles (and an older sidecar without them still loads); a plan asked for input-sparse
// takes each layer's three thresholds at the asked level of the three quantile tables, has no
// predictor, and is refused saying why where it cannot be made; the method's name parses.
// What an input-sparse plan computes is tests/unit/input_sparse_test.cc's.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <vector>

#include "absl/strings/str_format.h"
#include "model_fixtures.h"
#include "offline/pipeline.h"
#include "offline/profile/activation_profiler.h"
#include "offline/profile/profile_run.h"
#include "offline/sparse_source.h"
#include "offline/speed_check.h"
#include "sparse_fixtures.h"
#include "test_util.h"

namespace thermocline {
namespace {

using testing::CachedModel;
using testing::TempDir;
using testing::TestModelPath;

// A sidecar of `file` from a short profile on the profile corpus.
const offline::Sidecar& ProfiledSidecar(const std::string& file) {
  return testing::ProfiledSidecar(file, {.tokens = 1024, .samples = 512, .epochs = 1});
}

bool HaveModels() {
  return std::filesystem::exists(TestModelPath("stories260K.gguf")) &&
         std::filesystem::exists(TestModelPath("relu-tiny.f32.gguf")) &&
         std::filesystem::exists(TestModelPath("tinystories-profile.txt"));
}

// The value at level q of 101 evenly spaced quantiles, linear between neighbours: written out
// again here on purpose.
float Interpolate(const std::vector<float>& quantiles, double q) {
  const double pos = q * 100;
  const int lo = static_cast<int>(pos);
  const int hi = std::min(lo + 1, 100);
  const double f = pos - lo;
  return static_cast<float>(quantiles[lo] * (1 - f) + quantiles[hi] * f);
}

LlamaHparams TinyHparams(FfnActivation activation) {
  LlamaHparams h;
  h.n_layer = 2;
  h.n_embd = 100;
  h.n_ff = 8;
  h.n_head = 1;
  h.n_head_kv = 1;
  h.head_dim = 100;
  h.activation = activation;
  return h;
}

TEST_CASE("the profiler's input histograms give the quantiles of the values fed", "[offline]") {
  offline::ProfilerOptions po;
  po.max_samples = 16;
  offline::ActivationProfiler profiler(TinyHparams(FfnActivation::kSilu), po);
  // Two tokens of 100 entries: ±1 .. ±100 (signs alternate; the histogram is of |x|), layer 0's
  // attention input; layer 1's FFN input the same values times 1000.
  std::vector<float> x(200), big(200);
  for (int i = 0; i < 200; ++i) {
    const float v = static_cast<float>(i % 100 + 1) * (i % 2 == 0 ? 1.0f : -1.0f);
    x[i] = v;
    big[i] = v * 1000;
  }
  profiler.OnAttentionInput(0, x.data(), 100, 2);
  profiler.OnFfnInput(1, big.data(), 100, 2);
  const offline::LayerStats& l0 = profiler.layer(0);
  const offline::LayerStats& l1 = profiler.layer(1);
  // A quantile is the upper end of its value's bin: at most one bin (~4%, AbsHistBin) above it.
  for (double q : {0.1, 0.25, 0.5, 0.9, 1.0}) {
    INFO(q);
    const double value = q * 100;  // the q-quantile of 1 .. 100, each twice
    CHECK(l0.AttnInQuantile(q) >= value);
    CHECK(l0.AttnInQuantile(q) <= value * 1.07);
    CHECK(l1.FfnInQuantile(q) >= 1000 * value);
    CHECK(l1.FfnInQuantile(q) <= 1000 * value * 1.07);
  }
  // Nothing fed: 0.
  CHECK(l0.FfnInQuantile(0.5) == 0);
  CHECK(l1.AttnInQuantile(0.5) == 0);
  // The ReLU family has no input-sparse layers: no histograms.
  offline::ActivationProfiler relu(TinyHparams(FfnActivation::kRelu), po);
  relu.OnAttentionInput(0, x.data(), 100, 2);
  CHECK(relu.layer(0).attn_in_hist.empty());
  CHECK(relu.layer(0).AttnInQuantile(0.5) == 0);
}

TEST_CASE("a profile counts every element of the inputs of the tokens |act| counts", "[offline]") {
  if (!HaveModels()) THERMOCLINE_SKIP("stories260K.gguf or tinystories-profile.txt not found");
  const LlamaModel& model = CachedModel(TestModelPath("stories260K.gguf"));
  ThreadPool pool(2);
  offline::ProfilerOptions po;
  po.max_samples = 64;
  offline::ActivationProfiler profiler(model.hparams(), po);
  offline::ProfileRunOptions ro;
  ro.tokens = 256;
  ro.corpus_path = TestModelPath("tinystories-profile.txt");
  REQUIRE(offline::RunProfile(model, pool, profiler, ro, nullptr).ok());
  const LlamaHparams& h = model.hparams();
  auto total = [](const std::vector<uint64_t>& hist) {
    uint64_t n = 0;
    for (uint64_t c : hist) n += c;
    return n;
  };
  for (int l = 0; l < profiler.n_layer(); ++l) {
    const offline::LayerStats& s = profiler.layer(l);
    const uint64_t tokens = total(s.abs_hist) / h.n_ff;  // the calibration tokens too
    CHECK(tokens == static_cast<uint64_t>(profiler.observed_tokens()));
    CHECK(total(s.attn_in_hist) == tokens * h.n_embd);
    CHECK(total(s.ffn_in_hist) == tokens * h.n_embd);
    CHECK(s.AttnInQuantile(0.2) > 0);
    CHECK(s.AttnInQuantile(0.2) <= s.AttnInQuantile(0.8));
    CHECK(s.FfnInQuantile(0.2) <= s.FfnInQuantile(0.8));
  }
}

TEST_CASE("the inputs' quantiles survive the sidecar file; a sidecar without them loads",
          "[offline]") {
  if (!HaveModels()) THERMOCLINE_SKIP("stories260K.gguf or tinystories-profile.txt not found");
  const LlamaModel& model = CachedModel(TestModelPath("stories260K.gguf"));
  offline::Sidecar s = ProfiledSidecar("stories260K.gguf");
  // The calibration's and the speed check's input-sparse figures too.
  s.calibration.present = true;
  s.calibration.max_ppl_increase = 0.02;
  s.calibration.dense_ppl = 2.5;
  s.calibration.input_sparse = true;
  s.calibration.input_sparse_sparsity = 0.375;
  s.calibration.input_sparse_ppl = 2.54;
  s.speed.present = true;
  s.speed.cpu = "Some CPU (avx2)";
  s.speed.threads = 2;
  s.speed.dense_tokens_per_s = 100;
  s.speed.input_sparse_tokens_per_s = 125;
  s.speed.input_sparse_sparsity = 0.375;
  const std::string file = (TempDir() / "input-sparse.thermo.gguf").string();
  REQUIRE(offline::WriteSidecar(s, file).ok());
  auto back = offline::LoadSidecarFor(file, model);
  INFO(back.status().ToString());
  REQUIRE(back.ok());
  for (size_t l = 0; l < s.layers.size(); ++l) {
    const offline::SidecarLayer& y = s.layers[l];
    REQUIRE(y.attn_in_quantiles.size() == offline::kQuantileLevels);
    REQUIRE(y.ffn_in_quantiles.size() == offline::kQuantileLevels);
    CHECK(back->layers[l].attn_in_quantiles == y.attn_in_quantiles);
    CHECK(back->layers[l].ffn_in_quantiles == y.ffn_in_quantiles);
    CHECK(std::is_sorted(y.attn_in_quantiles.begin(), y.attn_in_quantiles.end()));
    CHECK(std::is_sorted(y.ffn_in_quantiles.begin(), y.ffn_in_quantiles.end()));
    CHECK(y.attn_in_quantiles.front() >= 0);
    CHECK(y.ffn_in_quantiles.back() > 0);
    CHECK(offline::HasInputSparseStatistics(back->layers[l]));
  }
  CHECK(back->calibration.input_sparse);
  CHECK(back->calibration.input_sparse_sparsity == 0.375);
  CHECK(back->calibration.input_sparse_ppl == static_cast<float>(2.54));
  CHECK(back->speed.input_sparse_tokens_per_s == 125);
  CHECK(back->speed.input_sparse_sparsity == 0.375);
  CHECK(offline::DescribeSpeed(back->speed).find("input-sparse 125.0 (1.25x)") !=
        std::string::npos);

  // A sidecar written before them: no tensors, no calibration; it loads, and only the methods
  // it has statistics for are offered.
  offline::Sidecar old = ProfiledSidecar("stories260K.gguf");
  for (offline::SidecarLayer& y : old.layers) {
    y.attn_in_quantiles.clear();
    y.ffn_in_quantiles.clear();
  }
  REQUIRE(offline::WriteSidecar(old, file).ok());
  auto old_back = offline::LoadSidecarFor(file, model);
  INFO(old_back.status().ToString());
  REQUIRE(old_back.ok());
  for (const offline::SidecarLayer& y : old_back->layers) {
    CHECK(y.attn_in_quantiles.empty());
    CHECK(y.ffn_in_quantiles.empty());
    CHECK(!offline::HasInputSparseStatistics(y));
  }
  CHECK(!old_back->calibration.input_sparse);
  const std::vector<offline::MethodChoice> methods = offline::SidecarMethods(*old_back, model);
  CHECK(std::find(methods.begin(), methods.end(), offline::MethodChoice::kInputSparse) ==
        methods.end());
  CHECK(std::find(methods.begin(), methods.end(), offline::MethodChoice::kGateFirst) !=
        methods.end());
}

TEST_CASE("an input-sparse plan: every layer's thresholds at the level of its quantiles",
          "[offline][sparse]") {
  if (!HaveModels()) THERMOCLINE_SKIP("stories260K.gguf or relu-tiny.f32.gguf not found");
  const LlamaModel& model = CachedModel(TestModelPath("stories260K.gguf"));
  const offline::Sidecar& sidecar = ProfiledSidecar("stories260K.gguf");
  const std::vector<offline::MethodChoice> methods = offline::SidecarMethods(sidecar, model);
  CHECK(methods == std::vector<offline::MethodChoice>{offline::MethodChoice::kPredicted,
                                                      offline::MethodChoice::kGateFirst,
                                                      offline::MethodChoice::kInputSparse});
  for (double level : {0.25, 0.5, 0.7}) {
    INFO(level);
    auto plan =
        offline::SparsePlanFromSidecar(sidecar, model, level, offline::MethodChoice::kInputSparse);
    INFO(plan.status().ToString());
    REQUIRE(plan.ok());
    REQUIRE(plan->layers.size() == sidecar.layers.size());
    CHECK(SparseMethodsOf(plan->layers) == "input-sparse");
    CHECK(plan->thresholds.find(absl::StrFormat("input-sparse at sparsity %.3f (asked)", level)) ==
          0);
    for (size_t l = 0; l < plan->layers.size(); ++l) {
      INFO("layer " << l);
      const SparseLayerPlan& p = plan->layers[l];
      const offline::SidecarLayer& y = sidecar.layers[l];
      CHECK(p.method == SparseMethod::kInputSparse);
      CHECK(p.rank == 0);  // no predictor
      CHECK(p.fc1.view.data == nullptr);
      CHECK(p.fc2.view.data == nullptr);
      CHECK(p.b1.empty());
      CHECK(p.b2.empty());
      CHECK(p.gate_scale.empty());
      CHECK(p.device_neurons.empty());
      CHECK(p.attn_in_threshold == Approx(Interpolate(y.attn_in_quantiles, level)));
      CHECK(p.ffn_in_threshold == Approx(Interpolate(y.ffn_in_quantiles, level)));
      CHECK(p.magnitude_threshold == Approx(Interpolate(y.act_abs_quantiles, level)));
      CHECK(p.attn_in_threshold > 0);
      CHECK(p.ffn_in_threshold > 0);
    }
  }
  // Higher levels, higher thresholds.
  auto low =
      offline::SparsePlanFromSidecar(sidecar, model, 0.3, offline::MethodChoice::kInputSparse);
  auto high =
      offline::SparsePlanFromSidecar(sidecar, model, 0.6, offline::MethodChoice::kInputSparse);
  REQUIRE(low.ok());
  REQUIRE(high.ok());
  for (size_t l = 0; l < low->layers.size(); ++l) {
    CHECK(low->layers[l].attn_in_threshold < high->layers[l].attn_in_threshold);
    CHECK(low->layers[l].ffn_in_threshold < high->layers[l].ffn_in_threshold);
  }

  // No level asked: the calibration's, else the profile's target, else 0.5.
  auto profiled =
      offline::SparsePlanFromSidecar(sidecar, model, 0, offline::MethodChoice::kInputSparse);
  REQUIRE(profiled.ok());
  CHECK(profiled->thresholds ==
        absl::StrFormat("input-sparse at sparsity %.3f (the profile's target)",
                        sidecar.target_sparsity));
  CHECK(profiled->layers[0].ffn_in_threshold ==
        Approx(Interpolate(sidecar.layers[0].ffn_in_quantiles, sidecar.target_sparsity)));
  offline::Sidecar calibrated = sidecar;
  calibrated.calibration.present = true;
  calibrated.calibration.max_ppl_increase = 0.02;
  calibrated.calibration.input_sparse = true;
  calibrated.calibration.input_sparse_sparsity = 0.4;
  calibrated.calibration.input_sparse_ppl = 2.3;
  CHECK(offline::SidecarLevel(calibrated, 0, offline::MethodChoice::kInputSparse) == 0.4);
  CHECK(offline::SidecarLevel(calibrated, 0.2, offline::MethodChoice::kInputSparse) == 0.2);
  auto at_calibrated =
      offline::SparsePlanFromSidecar(calibrated, model, 0, offline::MethodChoice::kInputSparse);
  REQUIRE(at_calibrated.ok());
  CHECK(at_calibrated->thresholds ==
        "input-sparse at sparsity 0.400, calibrated for at most +2.00% perplexity");
  CHECK(at_calibrated->layers[0].attn_in_threshold ==
        Approx(Interpolate(sidecar.layers[0].attn_in_quantiles, 0.4)));
  offline::Sidecar no_target = sidecar;
  no_target.target_sparsity = 0;
  CHECK(offline::SidecarLevel(no_target, 0, offline::MethodChoice::kInputSparse) == 0.5);

  // auto without a speed check: per layer the fewest bytes of predicted and gate-first. Input-
  // sparse would read fewer here (this F32 model's copies are F32: half of q/k/v and the FFN at
  // 0.5), but its columns cost more per byte than rows, so only a speed check picks it.
  auto automatic =
      offline::SparsePlanFromSidecar(sidecar, model, 0.5, offline::MethodChoice::kAuto);
  REQUIRE(automatic.ok());
  CHECK(SparseMethodsOf(automatic->layers) == "gate-first");
  offline::Sidecar measured = sidecar;
  measured.speed.present = true;
  measured.speed.cpu = offline::HostCpu();
  measured.speed.threads = 2;
  measured.speed.dense_tokens_per_s = 100;
  measured.speed.predicted_tokens_per_s = 90;
  measured.speed.gate_first_tokens_per_s = 110;
  measured.speed.input_sparse_tokens_per_s = 120;
  // Measured at the levels a load without a target uses (a target makes the check not apply).
  measured.speed.gate_first_sparsity =
      offline::SidecarLevel(measured, 0, offline::MethodChoice::kGateFirst);
  measured.speed.input_sparse_sparsity =
      offline::SidecarLevel(measured, 0, offline::MethodChoice::kInputSparse);
  auto fastest = offline::SparsePlanFromSidecar(measured, model, 0, offline::MethodChoice::kAuto);
  REQUIRE(fastest.ok());
  CHECK(SparseMethodsOf(fastest->layers) == "input-sparse");
}

TEST_CASE("input-sparse is refused where it cannot be made, saying why", "[offline][sparse]") {
  if (!HaveModels()) THERMOCLINE_SKIP("stories260K.gguf or relu-tiny.f32.gguf not found");
  const LlamaModel& swiglu = CachedModel(TestModelPath("stories260K.gguf"));
  const LlamaModel& relu = CachedModel(TestModelPath("relu-tiny.f32.gguf"));
  // A sidecar that predates the statistics: asked for, FailedPrecondition; auto leaves it out.
  offline::Sidecar old = ProfiledSidecar("stories260K.gguf");
  for (offline::SidecarLayer& y : old.layers) {
    y.attn_in_quantiles.clear();
    y.ffn_in_quantiles.clear();
  }
  auto no_stats =
      offline::SparsePlanFromSidecar(old, swiglu, 0.5, offline::MethodChoice::kInputSparse);
  REQUIRE(absl::IsFailedPrecondition(no_stats.status()));
  CHECK(no_stats.status().message().find("predates") != std::string::npos);
  CHECK(no_stats.status().message().find("profile the model again") != std::string::npos);
  auto old_auto = offline::SparsePlanFromSidecar(old, swiglu, 0.5, offline::MethodChoice::kAuto);
  REQUIRE(old_auto.ok());
  for (const SparseLayerPlan& p : old_auto->layers) CHECK(p.method != SparseMethod::kInputSparse);
  // The ReLU family: its gate already decides; the profile keeps no input statistics.
  const offline::Sidecar& relu_sidecar = ProfiledSidecar("relu-tiny.f32.gguf");
  for (const offline::SidecarLayer& y : relu_sidecar.layers) {
    CHECK(y.attn_in_quantiles.empty());
    CHECK(y.ffn_in_quantiles.empty());
  }
  CHECK(offline::SidecarMethods(relu_sidecar, relu) ==
        std::vector<offline::MethodChoice>{offline::MethodChoice::kPredicted});
  auto on_relu =
      offline::SparsePlanFromSidecar(relu_sidecar, relu, 0.5, offline::MethodChoice::kInputSparse);
  REQUIRE(absl::IsInvalidArgument(on_relu.status()));
  CHECK(on_relu.status().message().find("input-sparse is for SwiGLU models") != std::string::npos);
  auto relu_auto =
      offline::SparsePlanFromSidecar(relu_sidecar, relu, 0, offline::MethodChoice::kAuto);
  REQUIRE(relu_auto.ok());
  CHECK(SparseMethodsOf(relu_auto->layers) == "predicted");
}

TEST_CASE("sparse method names parse, and a wrong one lists them all", "[offline]") {
  for (offline::MethodChoice m :
       {offline::MethodChoice::kAuto, offline::MethodChoice::kPredicted,
        offline::MethodChoice::kGateFirst, offline::MethodChoice::kInputSparse}) {
    auto parsed = offline::ParseSparseMethod(offline::MethodChoiceName(m), "--sparse-method");
    REQUIRE(parsed.ok());
    CHECK(*parsed == m);
  }
  CHECK(std::string(offline::MethodChoiceName(offline::MethodChoice::kInputSparse)) ==
        "input-sparse");
  CHECK(std::string(offline::MethodChoiceName(offline::MethodChoice::kInputSparse)) ==
        SparseMethodName(SparseMethod::kInputSparse));
  auto bad = offline::ParseSparseMethod("input_sparse", "--sparse-method");
  REQUIRE(absl::IsInvalidArgument(bad.status()));
  CHECK(bad.status().message() ==
        "--sparse-method input_sparse: use auto, predicted, gate-first or input-sparse");
}

}  // namespace
}  // namespace thermocline
