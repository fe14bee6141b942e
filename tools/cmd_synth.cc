// thermocline synth: a random-weight llama GGUF of any shape, for benchmarks.
#include <cmath>
#include <cstdio>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "bench/synth.h"
#include "engine/ops/type_table.h"
#include "offline/predictor/trainer.h"
#include "offline/profile/activation_profiler.h"
#include "offline/sidecar/sidecar.h"
#include "tools/commands.h"

namespace thermocline::cli {
namespace {

// The sidecar of a --sparsity model: its construction's predictors, their thresholds calibrated
// on kCalibrationTokens tokens as the profiler calibrates its own (the same aim above the target
// recall), and a profile made of the firing probabilities the model was built with (counts over
// a nominal kTokens tokens).
absl::Status WriteSynthSidecar(const SynthOptions& o, const std::string& model_path,
                               const std::string& path, ThreadPool& pool) {
  constexpr int64_t kTokens = 100000, kCalibrationTokens = 128;
  auto predictors = SynthPredictors(o);
  if (!predictors.ok()) return predictors.status();
  auto model = LlamaModel::Load(model_path);
  if (!model.ok()) return model.status();
  for (SynthPredictor& p : *predictors) {  // as the sidecar will hold them
    for (float& v : p.fc1) v = HalfToFloat(FloatToHalf(v));
    for (float& v : p.fc2) v = HalfToFloat(FloatToHalf(v));
  }
  const offline::TrainOptions train;
  const double aim = 1.0 - (1.0 - kSynthPredictorRecall) * (1.0 - train.recall_margin);
  if (absl::Status s =
          CalibrateSynthThresholds(**model, pool, aim, kCalibrationTokens, *predictors);
      !s.ok()) {
    return s;
  }
  offline::Sidecar s;
  s.model_identity = offline::ModelIdentity((*model)->gguf());
  s.model_name = std::filesystem::path(model_path).filename().string();
  s.n_layer = o.n_layer;
  s.n_embd = o.n_embd;
  s.n_ff = o.n_ff;
  s.activation = ActivationName(o.activation);
  s.corpus_kind = "synthetic";
  s.corpus_hash = "none";
  s.tokens = kTokens;
  s.target_recall = kSynthPredictorRecall;
  for (SynthPredictor& p : *predictors) {
    offline::SidecarLayer y;
    std::vector<uint64_t> counts;
    for (double f : p.firing) {
      counts.push_back(static_cast<uint64_t>(std::llround(f * kTokens)));
      y.fire_count.push_back(static_cast<int32_t>(counts.back()));
      y.act_abs_mean.push_back(static_cast<float>(f));
    }
    y.act_abs_quantiles.assign(offline::kQuantileLevels, 0.0f);
    y.sparsity = offline::Sparsity(counts, kTokens);
    y.skew80 = offline::SkewFraction(counts, 0.8);
    y.predictor.n_embd = o.n_embd;
    y.predictor.n_ff = o.n_ff;
    y.predictor.rank = p.rank;
    y.predictor.fc1 = std::move(p.fc1);
    y.predictor.b1 = std::move(p.b1);
    y.predictor.fc2 = std::move(p.fc2);
    y.predictor.b2 = std::move(p.b2);
    y.predictor.threshold = p.threshold;
    y.predictor.RoundToF16();
    s.layers.push_back(std::move(y));
  }
  return offline::WriteSidecar(s, path);
}

}  // namespace

int RunSynth(int argc, char** argv) {
  auto args =
      Args::Parse(argc, argv,
                  {"--layers", "--embd", "--ff", "--heads", "--kv-heads", "--vocab", "--ctx",
                   "--type", "--activation", "--seed", "--output", "--threads", "--sparsity",
                   "--hot-fraction", "--sidecar", "--experts", "--experts-used"},
                  {"--help"}, {{"-o", "--output"}, {"-t", "--threads"}, {"-h", "--help"}});
  if (!args.ok()) return Fail("synth", args.status(), true);
  if (args->Has("--help") || !args->Get("--output")) {
    std::fputs(
        "usage: thermocline synth --layers L --embd D --ff F --heads H --kv-heads K "
        "--vocab V [--ctx N] [--type f16|q8_0|q4_0] [--activation silu|relu|drelu] "
        "[--seed S] [--sparsity S --hot-fraction H] -o FILE\n"
        "  --sparsity S      ReLU family: mean fraction of FFN neurons that stay zero per token,\n"
        "                    with a power-law firing frequency (0.5 .. 0.999; default: random)\n"
        "  --hot-fraction H  fraction of neurons that fire for most tokens (default 0.05)\n"
        "  --experts E --experts-used K  a Mixtral-style mixture of E experts of --ff neurons\n"
        "                    each, K routed per token (a random router); with --sparsity each\n"
        "                    expert's neurons fire so (no --sidecar: experts are placed whole)\n"
        "  --sidecar FILE    with --sparsity: also write a sidecar holding the predictors the\n"
        "                    model's construction implies (no profiling needed for benchmarks),\n"
        "                    thresholded for recall 0.99 on 128 tokens as profile would\n",
        args->Has("--help") ? stdout : stderr);
    return args->Has("--help") ? 0 : 2;
  }
  SynthOptions o;
  struct IntFlag {
    const char* flag;
    int64_t* dst;
  };
  for (IntFlag f : {IntFlag{"--layers", &o.n_layer},
                    {"--embd", &o.n_embd},
                    {"--ff", &o.n_ff},
                    {"--heads", &o.n_head},
                    {"--kv-heads", &o.n_head_kv},
                    {"--vocab", &o.n_vocab},
                    {"--ctx", &o.n_ctx},
                    {"--experts", &o.n_expert},
                    {"--experts-used", &o.n_expert_used}}) {
    auto v = args->GetInt(f.flag, *f.dst);
    if (!v.ok()) return Fail("synth", v.status(), true);
    *f.dst = *v;
  }
  if (!args->Get("--kv-heads")) o.n_head_kv = o.n_head;
  auto seed = args->GetInt("--seed", 42);
  if (!seed.ok()) return Fail("synth", seed.status(), true);
  o.seed = static_cast<uint64_t>(*seed);
  const std::string type_name = args->GetOr("--type", "f16");
  const GgmlTypeInfo* type = FindGgmlTypeByName(type_name);
  if (type == nullptr || FindWeightType(type->type) == nullptr) {
    return Fail("synth",
                absl::InvalidArgumentError(
                    absl::StrCat("--type ", type_name, ": expected one of ", WeightTypeNames())),
                true);
  }
  o.type = type->type;
  if (auto act = args->Get("--activation")) {
    auto parsed = ParseActivation(*act);
    if (!parsed.ok()) return Fail("synth", parsed.status(), true);
    o.activation = *parsed;
  }
  for (auto [flag, dst] :
       {std::pair{"--sparsity", &o.sparsity}, std::pair{"--hot-fraction", &o.hot_fraction}}) {
    auto v = args->GetDouble(flag, *dst);
    if (!v.ok()) return Fail("synth", v.status(), true);
    *dst = *v;
  }
  if (absl::Status s = CheckNotOverwriting(*args, "--sidecar", "--output"); !s.ok()) {
    return Fail("synth", s, true);
  }
  auto threads = ThreadsFromArgs(*args);
  if (!threads.ok()) return Fail("synth", threads.status(), true);
  ThreadPool pool(*threads);
  if (absl::Status s = SynthesizeModel(o, *args->Get("--output"), pool); !s.ok()) {
    return Fail("synth", s);
  }
  std::printf("wrote %s\n", args->Get("--output")->c_str());
  if (auto sidecar = args->Get("--sidecar")) {
    if (absl::Status s = WriteSynthSidecar(o, *args->Get("--output"), *sidecar, pool); !s.ok()) {
      return Fail("synth", s);
    }
    std::printf("wrote %s\n", sidecar->c_str());
  }
  return 0;
}

}  // namespace thermocline::cli
