// Gate-first (CATS-style) sparsity on SwiGLU models, with sidecars the offline pipeline makes
// here: at threshold 0 it is dense; at target sparsities 0.3, 0.4 and 0.5 it skips that share of
// up and down rows, with perplexity on stories260K.ppl-sample.txt within stated bounds of dense
// and, at 0.3, the first 8 greedy tokens of the reference prompts compared with dense; auto picks
// it for SwiGLU and keeps the predictors for the ReLU family; what it cannot do is refused.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>

#include "allocation_count.h"
#include "engine/model/session.h"
#include "engine/runtime/perplexity.h"
#include "model_fixtures.h"
#include "offline/pipeline.h"
#include "offline/sparse_source.h"
#include "sparse_fixtures.h"

namespace thermocline {
namespace {

using testing::CachedModel;
using testing::EveryToken;
using testing::LoadReference;
using testing::ProfiledSidecar;
using testing::ReadTextFile;
using testing::TempDir;
using testing::TestModelPath;

TEST_CASE("gate-first with no threshold computes every neuron: dense logits", "[sparse]") {
  const std::string path = TestModelPath("stories260K.gguf");
  if (!std::filesystem::exists(path)) THERMOCLINE_SKIP("stories260K.gguf not found");
  const LlamaModel& model = CachedModel(path);
  ThreadPool pool(2);
  auto plan = offline::SparsePlanFromSidecar(ProfiledSidecar("stories260K.gguf"), model, 0,
                                             offline::MethodChoice::kGateFirst);
  REQUIRE(plan.ok());
  for (SparseLayerPlan& p : plan->layers) {
    REQUIRE(p.method == SparseMethod::kGateFirst);
    REQUIRE(p.rank == 0);
    p.gate_threshold = 0;  // |silu(g)| > 0 for every g != 0
  }
  EngineOptions f32 = EveryToken();
  f32.kv_type = KvType::kF32;
  auto dense = testing::NewEngineSession(model, std::nullopt, pool, f32);
  auto sparse = testing::NewEngineSession(model, *std::move(plan), pool, f32);
  const nlohmann::json ref = LoadReference("stories260K.reference.json");
  for (const nlohmann::json& p : ref["prompts"]) {
    const std::vector<int32_t> prompt = p["prompt_ids"];
    REQUIRE(testing::GreedyIds(sparse->session(), prompt, 16) ==
            testing::GreedyIds(dense->session(), prompt, 16));
    double diff = 0, scale = 0;
    for (int64_t i = 0; i < model.hparams().n_vocab; ++i) {
      diff = std::max<double>(
          diff, std::fabs(sparse->session().logits()[i] - dense->session().logits()[i]));
      scale = std::max<double>(scale, std::fabs(dense->session().logits()[i]));
    }
    // The same products; only the order of the float sums differs (row dots and axpy against
    // dense mat-vecs): relative 1e-4 is ~1000 ε over 16 positions of 5 layers.
    CHECK(diff <= 1e-4 * scale);
  }
  const SparseFfnStats& st = sparse->sparse()->stats();
  const double n_ff = static_cast<double>(model.hparams().n_ff);
  CHECK(st.up_rows / st.layer_tokens >= 0.999 * n_ff);  // every up row was read
}

// Perplexity of gate-first at each target against dense, the rows it skipped, and at 0.3 how
// many of the 4 reference prompts keep dense's first 8 greedy tokens (at least min_greedy).
void CheckQuality(const std::string& file, const std::map<double, double>& bound, int min_greedy) {
  const std::string path = TestModelPath(file);
  if (!std::filesystem::exists(path)) THERMOCLINE_SKIP(file + " not found");
  const LlamaModel& model = CachedModel(path);
  ThreadPool pool(2);
  const offline::Sidecar& sidecar = ProfiledSidecar(file);
  auto dense = testing::NewEngineSession(model, std::nullopt, pool, EveryToken());
  const double ppl_dense = testing::SamplePerplexity(dense->session());
  const double n_ff = static_cast<double>(model.hparams().n_ff);
  for (const auto& [target, max_increase] : bound) {
    auto plan =
        offline::SparsePlanFromSidecar(sidecar, model, target, offline::MethodChoice::kGateFirst);
    INFO(plan.status().ToString());
    REQUIRE(plan.ok());
    auto sparse = testing::NewEngineSession(model, *std::move(plan), pool, EveryToken());
    const double ppl = testing::SamplePerplexity(sparse->session());
    const SparseFfnStats& st = sparse->sparse()->stats();
    const double up_share = st.up_rows / st.layer_tokens / n_ff;
    const double fired_share = st.fired / st.layer_tokens / n_ff;
    WARN(file << " gate-first at " << target << ": ppl " << ppl << " (dense " << ppl_dense << ", "
              << 100 * (ppl / ppl_dense - 1) << "%), up rows read " << 100 * up_share
              << "%, down rows " << 100 * fired_share << "%");
    CHECK(ppl <= ppl_dense * (1 + max_increase));
    // Calibrated on the profile corpus, measured on the perplexity text: the share of rows it
    // skips is the target within 0.08 (the two texts' activations differ a little).
    CHECK(std::fabs((1 - up_share) - target) <= 0.08);
    CHECK(fired_share <= up_share);
    CHECK(st.predicted / st.layer_tokens == n_ff);  // every gate row: no predictor
    if (target == 0.3) {
      const int equal = testing::PromptsKeepingGreedy(sparse->session(), dense->session(), 8);
      WARN(file << " gate-first at 0.3: " << equal << " of 4 prompts keep 8 greedy tokens");
      CHECK(equal >= min_greedy);
    }
  }
}

// Bounds: the increases measured with these profiles (docs/sparse.md's table: +5.3%, +13.7%,
// +24.3%) with about a quarter of headroom for other ISAs' roundings. stories260K is tiny (64
// wide, 172 neurons): the gate alone ranks its neurons poorly, and 2 of the 4 prompts part from
// dense within 8 tokens at 0.3.
TEST_CASE("gate-first quality on stories260K at 0.3, 0.4, 0.5", "[sparse][quality]") {
  CheckQuality("stories260K.gguf", {{0.3, 0.07}, {0.4, 0.17}, {0.5, 0.30}}, 2);
}

// stories-wide is stories260K with 84 of its 256 neurons zero: up to 0.33 gate-first drops only
// those (exact), at 0.5 about a quarter of the real ones. Measured: within 0.1% at 0.3 and 0.4
// and +2.0–2.6% at 0.5 for F32, Q8_0 and Q4_K_M (bounds 0.5%, 1%, 3.5%). Q4_0 adds down_t's
// requantization to Q4_0 (docs/sparse.md), the same in the predicted path: +1.6%, +1.2%, +4.5%
// (bounds 2.5%, 2.5%, 6%), and one or two prompts part from dense within 8 tokens at 0.3 for
// that reason (which ones depends on the activations' roundings).
TEST_CASE("gate-first quality on stories-wide files at 0.3, 0.4, 0.5", "[sparse][quality]") {
  for (const char* type : {"f32", "q8_0", "q4_k_m"}) {
    CheckQuality(std::string("kquants/stories-wide.") + type + ".gguf",
                 {{0.3, 0.005}, {0.4, 0.01}, {0.5, 0.035}}, 4);
  }
  CheckQuality("kquants/stories-wide.q4_0.gguf", {{0.3, 0.025}, {0.4, 0.025}, {0.5, 0.06}}, 2);
}

TEST_CASE("auto: gate-first for SwiGLU, the predictors for ReLU", "[sparse]") {
  const std::string swiglu = TestModelPath("stories260K.gguf");
  const std::string relu = TestModelPath("relu-tiny.f32.gguf");
  if (!std::filesystem::exists(swiglu) || !std::filesystem::exists(relu)) {
    THERMOCLINE_SKIP("stories260K.gguf or relu-tiny.f32.gguf not found");
  }
  auto s = offline::SparsePlanFromSidecar(ProfiledSidecar("stories260K.gguf"), CachedModel(swiglu),
                                          0.5, offline::MethodChoice::kAuto);
  REQUIRE(s.ok());
  for (const SparseLayerPlan& p : s->layers) {
    CHECK(p.method == SparseMethod::kGateFirst);
    CHECK(p.gate_threshold > 0);
  }
  // The default: the predictors, as before gate-first existed.
  auto predicted =
      offline::SparsePlanFromSidecar(ProfiledSidecar("stories260K.gguf"), CachedModel(swiglu), 0.5);
  REQUIRE(predicted.ok());
  for (const SparseLayerPlan& p : predicted->layers) {
    CHECK(p.method == SparseMethod::kPredicted);
    CHECK(p.rank > 0);
  }
  const offline::Sidecar& relu_sidecar = ProfiledSidecar("relu-tiny.f32.gguf");
  auto r = offline::SparsePlanFromSidecar(relu_sidecar, CachedModel(relu), 0,
                                          offline::MethodChoice::kAuto);
  REQUIRE(r.ok());
  for (const SparseLayerPlan& p : r->layers) CHECK(p.method == SparseMethod::kPredicted);
  for (const offline::SidecarLayer& y : relu_sidecar.layers) {
    CHECK(y.gate_score_quantiles.empty());
    CHECK(y.gate_scale.empty());
  }
  // Refusals: gate-first on a ReLU model, and from a sidecar without the gate's quantiles.
  auto on_relu = offline::SparsePlanFromSidecar(relu_sidecar, CachedModel(relu), 0.5,
                                                offline::MethodChoice::kGateFirst);
  REQUIRE(absl::IsInvalidArgument(on_relu.status()));
  CHECK(on_relu.status().message().find("SwiGLU") != std::string::npos);
  // A target outside [0, 1), NaN included (it passes `t < 0 || t >= 1`), for every method.
  for (const double bad : {-0.1, 1.0, std::nan("")}) {
    for (const auto method : {offline::MethodChoice::kGateFirst,
                              offline::MethodChoice::kInputSparse, offline::MethodChoice::kAuto}) {
      auto plan = offline::SparsePlanFromSidecar(ProfiledSidecar("stories260K.gguf"),
                                                 CachedModel(swiglu), bad, method);
      INFO(bad);
      REQUIRE(absl::IsInvalidArgument(plan.status()));
      CHECK(plan.status().message().find("must be in [0, 1)") != std::string::npos);
    }
  }
  offline::Sidecar old = ProfiledSidecar("stories260K.gguf");
  for (offline::SidecarLayer& y : old.layers) {
    y.gate_score_quantiles.clear();
    y.gate_scale.clear();
  }
  auto no_gate = offline::SparsePlanFromSidecar(old, CachedModel(swiglu), 0.5,
                                                offline::MethodChoice::kGateFirst);
  REQUIRE(absl::IsFailedPrecondition(no_gate.status()));
  CHECK(no_gate.status().message().find("profile the model again") != std::string::npos);
  auto old_auto =
      offline::SparsePlanFromSidecar(old, CachedModel(swiglu), 0.5, offline::MethodChoice::kAuto);
  REQUIRE(old_auto.ok());
  for (const SparseLayerPlan& p : old_auto->layers) CHECK(p.method == SparseMethod::kPredicted);
}

TEST_CASE("a gate-first decode step allocates nothing", "[sparse]") {
#if THERMOCLINE_COUNT_ALLOCATIONS
  const std::string path = TestModelPath("stories260K.gguf");
  if (!std::filesystem::exists(path)) THERMOCLINE_SKIP("stories260K.gguf not found");
  const LlamaModel& model = CachedModel(path);
  ThreadPool pool(2);
  auto plan = offline::SparsePlanFromSidecar(ProfiledSidecar("stories260K.gguf"), model, 0.5,
                                             offline::MethodChoice::kGateFirst);
  REQUIRE(plan.ok());
  auto sparse = testing::NewEngineSession(model, *std::move(plan), pool, EveryToken());
  Session& s = sparse->session();
  const std::vector<int32_t> prompt = {1, 403, 261, 290, 7, 45, 300, 41};
  REQUIRE(s.Eval(prompt).ok());
  CHECK(testing::AllocationsOfGreedySteps(s, 8) == 0);
  CHECK(sparse->sparse()->stats().up_rows > 0);
#else
  THERMOCLINE_SKIP("allocation counting is off under sanitizers");
#endif
}

TEST_CASE("the gate's quantiles survive the sidecar file", "[sparse]") {
  const std::string swiglu = TestModelPath("stories260K.gguf");
  if (!std::filesystem::exists(swiglu)) THERMOCLINE_SKIP("stories260K.gguf not found");
  const offline::Sidecar& s = ProfiledSidecar("stories260K.gguf");
  const std::string file = (TempDir() / "gate-first.thermo.gguf").string();
  REQUIRE(offline::WriteSidecar(s, file).ok());
  auto back = offline::ReadSidecar(file);
  REQUIRE(back.ok());
  for (size_t l = 0; l < s.layers.size(); ++l) {
    REQUIRE(s.layers[l].gate_score_quantiles.size() == offline::kQuantileLevels);
    CHECK(back->layers[l].gate_score_quantiles == s.layers[l].gate_score_quantiles);
    REQUIRE(s.layers[l].gate_scale.size() == static_cast<size_t>(s.n_ff));
    CHECK(back->layers[l].gate_scale == s.layers[l].gate_scale);
    // Quantiles ascend, and scores are >= 0.
    CHECK(std::is_sorted(s.layers[l].gate_score_quantiles.begin(),
                         s.layers[l].gate_score_quantiles.end()));
    CHECK(s.layers[l].gate_score_quantiles.front() >= 0);
  }
  // Through the CLI's front door: the file refuses a bad method by name.
  const testing::CliResult bad = testing::RunThermocline(
      "generate -m " + swiglu + " --sidecar " + file + " --sparse-method sideways -n 2 -p hi");
  CHECK(bad.exit_code != 0);
  CHECK(bad.out.find("--sparse-method sideways") != std::string::npos);
  const testing::CliResult ok = testing::RunThermocline(
      "generate -m " + swiglu + " --sidecar " + file +
      " --sparse-method gate-first --target-sparsity 0.4 -n 4 -p 'Once upon a time'");
  INFO(ok.out);
  CHECK(ok.exit_code == 0);
}

}  // namespace
}  // namespace thermocline
