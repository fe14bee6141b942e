// Calibration for a perplexity target (offline/sparsity_calibration.h) on stories260K: profiled on
// the first part of the profile corpus, calibrated on the part the profile did not read. The
// sparsity found meets the target on that text, holds on another text within a stated bound,
// grows with the target, travels through the sidecar file, and is what loading without
// --target-sparsity uses; the command line and the refusals are checked as a user sees them.
#include "offline/sparsity_calibration.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/runtime/perplexity.h"
#include "model_fixtures.h"
#include "offline/pipeline.h"
#include "offline/sparse_source.h"
#include "test_util.h"

namespace thermocline {
namespace {

using testing::CachedModel;
using testing::ReadTextFile;
using testing::TempDir;
using testing::TestModelPath;

EngineOptions EveryToken(int64_t n_ctx) {
  EngineOptions o;  // as `perplexity` and the calibration measure: every token sparse
  o.n_ctx = n_ctx;
  o.max_batch = n_ctx;
  o.dense_prefill = false;
  return o;
}

double Perplexity(const LlamaModel& model, std::optional<SparsePlan> plan, ThreadPool& pool,
                  const std::string& text, int64_t n_ctx, int64_t windows) {
  auto s = testing::NewEngineSession(model, std::move(plan), pool, EveryToken(n_ctx));
  auto r = ComputePerplexity(s->session(), text, n_ctx, nullptr, windows);
  INFO(r.status().ToString());
  REQUIRE(r.ok());
  return r->ppl;
}

const char* Name(offline::MethodChoice m) { return offline::MethodChoiceName(m); }

// The threshold a method's level moves in a layer's plan.
float LevelThreshold(const SparseLayerPlan& p, offline::MethodChoice m) {
  switch (m) {
    case offline::MethodChoice::kGateFirst:
      return p.gate_threshold;
    case offline::MethodChoice::kInputSparse:
      return p.ffn_in_threshold;
    default:
      return p.magnitude_threshold;
  }
}

TEST_CASE("a perplexity target: per method the largest sparsity within it, kept by the sidecar",
          "[sparse][offline]") {
  const std::string path = TestModelPath("stories260K.gguf");
  const std::string corpus_path = TestModelPath("tinystories-profile.txt");
  if (!std::filesystem::exists(path) || !std::filesystem::exists(corpus_path)) {
    THERMOCLINE_SKIP("stories260K.gguf or tinystories-profile.txt not found");
  }
  const LlamaModel& model = CachedModel(path);
  ThreadPool pool(2);
  offline::PipelineOptions po;
  po.run.corpus_path = corpus_path;
  po.run.tokens = 2048;
  po.profiler.max_samples = 1024;
  po.predictors.train.epochs = 2;
  auto profiled = offline::RunProfilePipeline(model, "stories260K.gguf", pool, po, nullptr);
  INFO(profiled.status().ToString());
  REQUIRE(profiled.ok());
  const std::string corpus = ReadTextFile(corpus_path);
  const size_t read = profiled->source.corpus_bytes_read;
  REQUIRE(read > 0);
  REQUIRE(read < corpus.size() / 2);  // 2048 tokens are a small part of the corpus
  const std::string held_out = corpus.substr(read);

  offline::CalibrationOptions o;
  o.max_ppl_increase = 0.02;
  o.n_ctx = 128;
  o.max_windows = 8;
  auto c = offline::CalibrateSparsity(model, profiled->sidecar, held_out, pool, o);
  INFO(c.status().ToString());
  REQUIRE(c.ok());
  // The profile has the gate's and the inputs' statistics: all three methods.
  REQUIRE(c->methods.size() == 3);
  CHECK(c->methods[2].method == offline::MethodChoice::kInputSparse);
  CHECK(c->n_ctx == 128);
  CHECK(c->tokens_scored == 8 * 63);  // the second half of each window, as llama.cpp scores
  const double dense = Perplexity(model, std::nullopt, pool, held_out, 128, 8);
  CHECK(c->dense_ppl == dense);

  const std::string other = ReadTextFile(TestModelPath("stories260K.ppl-sample.txt"));
  const double dense_other = Perplexity(model, std::nullopt, pool, other, 128, 0);
  for (const offline::MethodCalibration& m : c->methods) {
    INFO(Name(m.method));
    WARN(Name(m.method) << ": sparsity " << m.sparsity << ", ppl " << m.ppl << " (dense "
                        << c->dense_ppl << ", " << 100 * (m.ppl / c->dense_ppl - 1) << "%), "
                        << m.trials.size() << " levels tried");
    if (!m.met) {
      // Only the predictors' misses can keep a method from every level: gate-first with its
      // thresholds at 0 is dense, and so is input-sparse over this F32 model's F32 copies. This
      // tiny model's predictors miss firings that cost it from +0.5% to +5% depending on the
      // profile (the roundings of the host's ISA move it).
      WARN(Name(m.method) << ": no level met the target; thresholds at 0: " << m.floor_ppl);
      CHECK(m.method == offline::MethodChoice::kPredicted);
      CHECK(m.floor_ppl > c->dense_ppl * 1.01);
      continue;
    }
    CHECK(m.ppl <= c->dense_ppl * 1.02);
    CHECK(m.trials.size() == 7);  // the top level, then 6 bisection steps
    // The engine at that sparsity measures exactly the perplexity reported: the same plan on
    // the same threads gives the same bits, whichever thread takes which chunk.
    auto plan = offline::SparsePlanFromSidecar(profiled->sidecar, model, m.sparsity, m.method);
    REQUIRE(plan.ok());
    CHECK(Perplexity(model, *std::move(plan), pool, held_out, 128, 8) == m.ppl);
    // The next level up (the bisection's last failure) breaks the target: the answer is the
    // largest within 0.9 / 64 of resolution, not just any level that passes.
    double above = 1;
    for (const offline::CalibrationTrial& t : m.trials) {
      if (t.sparsity > m.sparsity) above = std::min(above, t.sparsity);
    }
    REQUIRE(above < 1);
    CHECK(above - m.sparsity <= 0.9 / 64 + 1e-6);
    // docs/sparse.md's table (stories260K, dense 2.2990): predicted is +0.5% at 0.3 and +2.0% at
    // 0.4, gate-first +5.3% at 0.3: +2% lands near 0.4 for predicted and well under 0.3 for
    // gate-first, whose gate ranks this tiny model's neurons poorly.
    if (m.method == offline::MethodChoice::kPredicted) {
      CHECK(m.sparsity >= 0.3);
      CHECK(m.sparsity <= 0.5);
    } else if (m.method == offline::MethodChoice::kGateFirst) {
      CHECK(m.sparsity >= 0.05);
      CHECK(m.sparsity <= 0.3);
    } else {
      // Input-sparse drops entries of q/k/v's and gate/up's inputs as well as down's, so each
      // level costs more: +2% lands near 0.17 here (0.169 on an AVX-512 host).
      CHECK(m.sparsity >= 0.05);
      CHECK(m.sparsity <= 0.3);
    }
    // On another text (stories260K.ppl-sample.txt, ~300 tokens, never profiled nor calibrated
    // on) the target holds within a factor of 2: the two samples' activations differ a little,
    // and the increase grows steeply near the calibrated level (docs/sparse.md).
    auto plan_other =
        offline::SparsePlanFromSidecar(profiled->sidecar, model, m.sparsity, m.method);
    REQUIRE(plan_other.ok());
    const double ppl_other = Perplexity(model, *std::move(plan_other), pool, other, 128, 0);
    WARN(Name(m.method) << " on stories260K.ppl-sample.txt: " << ppl_other << " (dense "
                        << dense_other << ", " << 100 * (ppl_other / dense_other - 1) << "%)");
    CHECK(ppl_other <= dense_other * 1.04);
  }

  SECTION("a tighter target gives a lower sparsity") {
    offline::CalibrationOptions tight = o;
    tight.max_ppl_increase = 0.005;
    auto t = offline::CalibrateSparsity(model, profiled->sidecar, held_out, pool, tight);
    REQUIRE(t.ok());
    for (size_t i = 0; i < c->methods.size(); ++i) {
      INFO(Name(t->methods[i].method));
      if (!c->methods[i].met) continue;  // see above
      CHECK(t->methods[i].sparsity < c->methods[i].sparsity);
      CHECK(t->methods[i].ppl <= t->dense_ppl * 1.005);
    }
  }

  SECTION("the sidecar keeps it, and a load without --target-sparsity uses it") {
    offline::ApplyCalibration(*c, true, profiled->sidecar);
    const std::string file = (TempDir() / "calibrated.thermo.gguf").string();
    REQUIRE(offline::WriteSidecar(profiled->sidecar, file).ok());
    auto back = offline::LoadSidecarFor(file, model);
    INFO(back.status().ToString());
    REQUIRE(back.ok());
    const offline::SidecarCalibration& k = back->calibration;
    REQUIRE(k.present);
    CHECK(k.held_out);
    CHECK(k.n_ctx == 128);
    CHECK(k.tokens_scored == c->tokens_scored);
    CHECK(k.max_ppl_increase == static_cast<float>(0.02));
    CHECK(k.dense_ppl == static_cast<float>(c->dense_ppl));
    REQUIRE(k.gate_first);
    REQUIRE(k.input_sparse);
    for (const offline::MethodCalibration& m : c->methods) {
      INFO(Name(m.method));
      if (!m.met) continue;  // see above
      const bool gate_first = m.method == offline::MethodChoice::kGateFirst;
      const bool input_sparse = m.method == offline::MethodChoice::kInputSparse;
      CHECK((gate_first     ? k.gate_first_sparsity
             : input_sparse ? k.input_sparse_sparsity
                            : k.predicted_sparsity) == m.sparsity);
      CHECK((gate_first     ? k.gate_first_ppl
             : input_sparse ? k.input_sparse_ppl
                            : k.predicted_ppl) == static_cast<float>(m.ppl));
      auto loaded = offline::LoadSparsePlan(file, model, 0, m.method);
      auto asked = offline::SparsePlanFromSidecar(*back, model, m.sparsity, m.method);
      REQUIRE(loaded.ok());
      REQUIRE(asked.ok());
      // What the user is told: the level and where it comes from.
      INFO(loaded->thresholds);
      CHECK(loaded->thresholds.find("calibrated for at most +2.00% perplexity") !=
            std::string::npos);
      CHECK(loaded->thresholds.find(absl::StrCat(Name(m.method), " at sparsity")) == 0);
      CHECK(asked->thresholds.find("(asked)") != std::string::npos);
      for (size_t l = 0; l < loaded->layers.size(); ++l) {
        CHECK(loaded->layers[l].magnitude_threshold == asked->layers[l].magnitude_threshold);
        CHECK(loaded->layers[l].gate_threshold == asked->layers[l].gate_threshold);
        CHECK(loaded->layers[l].attn_in_threshold == asked->layers[l].attn_in_threshold);
        CHECK(loaded->layers[l].ffn_in_threshold == asked->layers[l].ffn_in_threshold);
      }
      // An asked-for sparsity still wins over the calibrated one.
      auto other_level = offline::LoadSparsePlan(file, model, 0.6, m.method);
      REQUIRE(other_level.ok());
      CHECK(LevelThreshold(other_level->layers[0], m.method) >
            LevelThreshold(loaded->layers[0], m.method));
    }
  }

  SECTION("what it cannot do is refused, saying why") {
    auto short_text =
        offline::CalibrateSparsity(model, profiled->sidecar, held_out.substr(0, 200), pool, o);
    REQUIRE(absl::IsInvalidArgument(short_text.status()));
    CHECK(short_text.status().message().find("needs at least 256") != std::string::npos);
    offline::CalibrationOptions bad = o;
    bad.max_ppl_increase = 0;
    CHECK(absl::IsInvalidArgument(
        offline::CalibrateSparsity(model, profiled->sidecar, held_out, pool, bad).status()));
  }
}

TEST_CASE("a perplexity target is refused for the ReLU family: nothing to calibrate",
          "[sparse][offline]") {
  const std::string path = TestModelPath("relu-tiny.f32.gguf");
  if (!std::filesystem::exists(path)) THERMOCLINE_SKIP("relu-tiny.f32.gguf not found");
  const LlamaModel& model = CachedModel(path);
  ThreadPool pool(2);
  offline::Sidecar sidecar;  // never read: the model is refused first
  auto r = offline::CalibrateSparsity(model, sidecar, "text", pool, {});
  REQUIRE(absl::IsInvalidArgument(r.status()));
  CHECK(r.status().message().find("SwiGLU") != std::string::npos);
}

TEST_CASE("profile --target-ppl-increase from the command line", "[offline][cli]") {
  const std::string model = TestModelPath("stories260K.gguf");
  const std::string corpus = TestModelPath("tinystories-profile.txt");
  if (!std::filesystem::exists(model) || !std::filesystem::exists(corpus)) {
    THERMOCLINE_SKIP("stories260K.gguf or tinystories-profile.txt not found");
  }
  const std::string dir = (TempDir() / "cli-calibration").string();
  std::filesystem::create_directories(dir);
  const std::string sidecar = dir + "/stories260K.thermo.gguf";
  testing::CliResult r = testing::RunThermocline(
      "profile -m " + model + " --corpus " + corpus +
      " --tokens 1024 --samples 512 --epochs 1 -t 2 --quiet --target-ppl-increase 0.03 "
      "--calibration-ctx 64 --calibration-windows 4 --report " +
      dir + "/REPORT.json -o " + sidecar);
  INFO(r.out);
  REQUIRE(r.exit_code == 0);
  CHECK(r.out.find("perplexity target: at most 3.00% above dense") != std::string::npos);
  CHECK(r.out.find("held-out text") != std::string::npos);
  std::ifstream report_file(dir + "/REPORT.json");
  const nlohmann::json report = nlohmann::json::parse(report_file);
  const nlohmann::json& cal = report["calibration"];
  CHECK(cal["context"] == 64);
  CHECK(cal["held_out"] == true);
  const double dense = cal["dense_ppl"].get<double>();
  for (const char* m : {"predicted", "gate_first", "input_sparse"}) {
    INFO(m);
    const double ppl = cal["methods"][m]["ppl"].get<double>();
    if (ppl == 0) {  // predicted: the predictors' misses alone may exceed the target (above)
      CHECK(std::string(m) == "predicted");
      continue;
    }
    CHECK(cal["methods"][m]["sparsity"].get<double>() > 0);
    CHECK(ppl <= dense * 1.03 * (1 + 1e-6));
  }
  // `perplexity` with that sidecar and no --target-sparsity measures at the calibrated level:
  // gate-first at sparsity s skips about s of the up rows (the threshold is the s-quantile of
  // the profile's scores; another text moves it a little).
  r = testing::RunThermocline("perplexity -m " + model + " -f " +
                              TestModelPath("stories260K.ppl-sample.txt") + " --ctx 64 --sidecar " +
                              sidecar + " --sparse-method gate-first --json -t 2");
  INFO(r.out);
  REQUIRE(r.exit_code == 0);
  const nlohmann::json ppl = nlohmann::json::parse(r.out.substr(r.out.find('{')));
  CHECK(ppl["sparse"] == true);
  CHECK(ppl["thresholds"].get<std::string>().find(
            "gate-first at sparsity " +
            absl::StrFormat("%.3f", cal["methods"]["gate_first"]["sparsity"].get<double>())) == 0);
  CHECK(std::fabs((1 - ppl["fired"].get<double>()) -
                  cal["methods"]["gate_first"]["sparsity"].get<double>()) <= 0.1);

  // Without a corpus it calibrates on text the model samples.
  r = testing::RunThermocline("profile -m " + model + " --self-generate --tokens 512 --epochs 1 " +
                              "-t 2 --quiet -o " + sidecar +
                              " --target-ppl-increase 0.05 --calibration-ctx 64");
  INFO(r.out);
  REQUIRE(r.exit_code == 0);
  CHECK(r.out.find("perplexity target: at most 5.00% above dense") != std::string::npos);
  CHECK(r.out.find("held-out text") != std::string::npos);
  auto sampled = offline::ReadSidecar(sidecar);
  REQUIRE(sampled.ok());
  CHECK(sampled->calibration.present);
  CHECK(sampled->calibration.tokens_scored == 4 * 31);  // 4 windows of 64, second halves
  CHECK(sampled->calibration.gate_first_sparsity > 0);
  r = testing::RunThermocline("profile -m " + model + " --corpus " + corpus + " --tokens 64 -o " +
                              sidecar + " --calibration-ctx 64");
  CHECK(r.exit_code != 0);
  CHECK(r.out.find("needs --target-ppl-increase") != std::string::npos);
}

}  // namespace
}  // namespace thermocline
