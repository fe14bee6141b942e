// thermocline profile: dense inference over a corpus (or self-generated text) counting FFN
// neuron firings, adaptive-rank predictor training, and the sidecar GGUF with REPORT.json and
// SVG figures.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "offline/pipeline.h"
#include "offline/sparsity_calibration.h"
#include "offline/speed_check.h"
#include "tools/commands.h"

namespace thermocline::cli {
namespace {

constexpr char kUsage[] =
    R"(usage: thermocline profile -m MODEL [--corpus FILE | --self-generate] -o SIDECAR [options]
  -m, --model FILE          GGUF model
  --corpus FILE             profiling text (stories separated by blank lines)
  --self-generate           profile text the model samples itself (the default without --corpus)
  --tokens N                tokens to profile (default 4096)
  -o, --output FILE         sidecar to write (e.g. MODEL.thermo.gguf)
  --report FILE             REPORT.json: per-layer sparsity, skew80, rank, recall, precision
  --plots DIR               SVG figures: firing frequency (log-log), recall vs rank
  --recall R                held-out recall target of every predictor (default 0.99)
  --contribution C          and of the firings' contribution |act|·|down column| (default:
                            0.998 for FFN weights under 3 bits (Q2_K), else 1, count recall
                            alone; docs/offline.md)
  --budget F                predictors <= F x the model's weight bytes (default 0.10)
  --samples N               (x, mask) samples kept per layer (default 4096)
  --epochs N                training epochs per rank tried (default 12)
  --chunk N                 tokens per profiled sequence (default 256, capped at the context)
  --target-sparsity S       SwiGLU: fraction of |activation| counted as not firing (default 0.5)
  --target-ppl-increase F   SwiGLU: also find, per method (predicted, gate-first,
                            input-sparse), the largest sparsity whose perplexity is at most F
                            above dense (0.02 = +2%); the sidecar keeps it and loading without
                            --target-sparsity uses it
  --calibration-text FILE   text for that (default: the corpus after the part profiled, or the
                            whole corpus when too little is left; without a corpus, text the
                            model samples)
  --calibration-ctx N       its perplexity windows (default 256, capped at the model's context)
  --calibration-windows N   windows scored per level tried (default 4; 0: the whole text)
  --no-speed-check          skip the speed check: decode tokens/s of dense and of each sparse
                            method, measured here and kept in the sidecar; loading on this
                            CPU, --sparse auto serves dense when sparse measured slower and
                            --sparse-method auto the fastest method
  --seed S                  sampling and training seed (default 1)
  -t, --threads N           CPU threads (default: all)
  --activation A            override the FFN activation: silu | relu | drelu
  --quiet                   no progress output
)";

void PrintCalibration(const offline::SparsityCalibration& c, bool held_out) {
  std::printf(
      "perplexity target: at most %.2f%% above dense %.4f (%lld tokens at context %lld, "
      "%s text)\n",
      100 * c.max_ppl_increase, c.dense_ppl, static_cast<long long>(c.tokens_scored),
      static_cast<long long>(c.n_ctx), held_out ? "held-out" : "profiled");
  for (const offline::MethodCalibration& m : c.methods) {
    const char* name = offline::MethodChoiceName(m.method);
    if (m.met) {
      std::printf("  %-12s sparsity %.3f: ppl %.4f (%+.2f%%)\n", name, m.sparsity, m.ppl,
                  100 * (m.ppl / c.dense_ppl - 1));
    } else {
      std::printf(
          "  %-12s no level tried met the target (lowest: %.3f, ppl %.4f); with every "
          "threshold at 0, ppl %.4f (%+.2f%%)%s: its thresholds are at sparsity 0\n",
          name, m.trials.back().sparsity, m.trials.back().ppl, m.floor_ppl,
          100 * (m.floor_ppl / c.dense_ppl - 1),
          m.method == offline::MethodChoice::kPredicted
              ? ", the predictors' misses (a higher --recall or more --tokens lowers it)"
          : m.method == offline::MethodChoice::kInputSparse
              ? ", what its transposed copies' requantization costs"
              : "");
    }
  }
}

}  // namespace

int RunProfile(int argc, char** argv) {
  auto args =
      Args::Parse(argc, argv,
                  {"--model",
                   "--corpus",
                   "--tokens",
                   "--output",
                   "--report",
                   "--plots",
                   "--recall",
                   "--contribution",
                   "--budget",
                   "--samples",
                   "--epochs",
                   "--chunk",
                   "--target-sparsity",
                   "--seed",
                   "--threads",
                   "--activation",
                   "--target-ppl-increase",
                   "--calibration-text",
                   "--calibration-ctx",
                   "--calibration-windows"},
                  {"--self-generate", "--quiet", "--no-speed-check", "--help"},
                  {{"-m", "--model"}, {"-o", "--output"}, {"-t", "--threads"}, {"-h", "--help"}});
  if (!args.ok()) return Fail("profile", args.status(), true);
  if (args->Has("--help")) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  if (!args->Get("--output")) {
    return Fail("profile", absl::InvalidArgumentError("-o SIDECAR is required"), true);
  }
  for (const auto& [out, in] : {std::pair<const char*, const char*>{"--output", "--model"},
                                {"--report", "--model"},
                                {"--report", "--output"}}) {
    if (absl::Status s = CheckNotOverwriting(*args, out, in); !s.ok()) {
      return Fail("profile", s, true);
    }
  }
  if (args->Has("--corpus") && args->Has("--self-generate")) {
    return Fail("profile", absl::InvalidArgumentError("give --corpus or --self-generate, not both"),
                true);
  }
  offline::PipelineOptions o;
  o.run.corpus_path = args->GetOr("--corpus", "");
  auto tokens = args->GetInt("--tokens", o.run.tokens);
  auto samples = args->GetInt("--samples", o.profiler.max_samples);
  auto epochs = args->GetInt("--epochs", o.predictors.train.epochs);
  auto chunk = args->GetInt("--chunk", o.run.chunk);
  auto seed = args->GetInt("--seed", 1);
  auto recall = args->GetDouble("--recall", o.predictors.train.target_recall);
  auto contribution = args->GetDouble("--contribution", o.predictors.train.target_contribution);
  auto budget = args->GetDouble("--budget", o.predictors.budget_fraction);
  auto target = args->GetDouble("--target-sparsity", o.profiler.target_sparsity);
  for (auto* v : {&tokens, &samples, &epochs, &chunk, &seed}) {
    if (!v->ok()) return Fail("profile", v->status(), true);
  }
  for (auto* v : {&recall, &contribution, &budget, &target}) {
    if (!v->ok()) return Fail("profile", v->status(), true);
  }
  if (*recall <= 0 || *recall >= 1 || *contribution <= 0 || *contribution > 1 || *budget <= 0 ||
      *target < 0 || *target >= 1 || *tokens <= 0 || *samples < 16 || *epochs < 1) {
    return Fail("profile",
                absl::InvalidArgumentError(
                    "--recall must be in (0, 1), --target-sparsity in [0, 1), "
                    "--contribution in (0, 1], --budget > 0, --tokens > 0, --samples >= 16, "
                    "--epochs >= 1"),
                true);
  }
  o.run.tokens = *tokens;
  o.run.chunk = *chunk;
  o.run.seed = static_cast<uint64_t>(*seed);
  o.profiler.max_samples = *samples;
  o.profiler.target_sparsity = *target;
  o.profiler.seed = static_cast<uint64_t>(*seed) * 7919;
  o.predictors.train.epochs = static_cast<int>(*epochs);
  o.predictors.train.target_recall = *recall;
  if (args->Get("--contribution")) {
    o.predictors.train.target_contribution = *contribution;
    o.predictors.auto_contribution = false;
  }
  o.predictors.train.seed = static_cast<uint64_t>(*seed);
  o.predictors.budget_fraction = *budget;

  offline::CalibrationOptions calibration;
  const bool calibrate = args->Has("--target-ppl-increase");
  auto ppl_increase = args->GetDouble("--target-ppl-increase", calibration.max_ppl_increase);
  auto calibration_ctx = args->GetInt("--calibration-ctx", calibration.n_ctx);
  auto calibration_windows = args->GetInt("--calibration-windows", calibration.max_windows);
  if (!ppl_increase.ok()) return Fail("profile", ppl_increase.status(), true);
  if (!calibration_ctx.ok()) return Fail("profile", calibration_ctx.status(), true);
  if (!calibration_windows.ok()) return Fail("profile", calibration_windows.status(), true);
  if (!calibrate && (args->Has("--calibration-text") || args->Has("--calibration-ctx") ||
                     args->Has("--calibration-windows"))) {
    return Fail("profile",
                absl::InvalidArgumentError("--calibration-* needs --target-ppl-increase"), true);
  }
  if (calibrate) {
    if (!(*ppl_increase > 0 && *ppl_increase < 10) || *calibration_ctx < 4 ||
        *calibration_windows < 0) {
      return Fail("profile",
                  absl::InvalidArgumentError("--target-ppl-increase must be in (0, 10), "
                                             "--calibration-ctx >= 4, --calibration-windows >= 0"),
                  true);
    }
    calibration.max_ppl_increase = *ppl_increase;
    calibration.n_ctx = *calibration_ctx;
    calibration.max_windows = *calibration_windows;
  }

  auto threads = ThreadsFromArgs(*args);
  if (!threads.ok()) return Fail("profile", threads.status(), true);
  auto model = LoadModelFromArgs(*args);
  if (!model.ok()) return Fail("profile", model.status());
  ThreadPool pool(*threads);
  const std::string model_path = *args->Get("--model");
  auto result =
      offline::RunProfilePipeline(**model, std::filesystem::path(model_path).filename().string(),
                                  pool, o, args->Has("--quiet") ? nullptr : stderr);
  if (!result.ok()) return Fail("profile", result.status());
  std::optional<offline::SparsityCalibration> calibrated;
  if (calibrate) {
    auto text = offline::ChooseCalibrationText(**model, pool, args->GetOr("--calibration-text", ""),
                                               o.run.corpus_path, result->source.corpus_bytes_read,
                                               calibration, o.run.seed + 1000003);
    if (!text.ok()) return Fail("profile", text.status());
    if (!text->held_out) {
      std::fprintf(stderr,
                   "thermocline profile: calibrating on the profiled corpus itself (too little "
                   "of it is left unread): the perplexity target is met on seen text\n");
    }
    offline::ProgressReporter progress("calibrate", args->Has("--quiet") ? nullptr : stderr);
    auto c = offline::CalibrateSparsity(**model, result->sidecar, text->text, pool, calibration,
                                        &progress);
    if (!c.ok()) return Fail("profile", c.status());
    offline::ApplyCalibration(*c, text->held_out, result->sidecar);
    calibrated = *std::move(c);
  }
  if (result->sidecar.n_expert == 0 && !args->Has("--no-speed-check")) {
    auto prompt = offline::SpeedCheckPrompt(**model, pool, o.run.corpus_path, o.run.seed + 2000003);
    if (!prompt.ok()) return Fail("profile", prompt.status());
    offline::ProgressReporter progress("speed check", args->Has("--quiet") ? nullptr : stderr);
    auto check = offline::CheckSparseSpeed(**model, result->sidecar, *prompt, pool,
                                           offline::SpeedCheckOptions(), &progress);
    if (!check.ok()) return Fail("profile", check.status());
    offline::ApplySpeedCheck(*check, result->sidecar);
  }
  const std::string out = *args->Get("--output");
  if (absl::Status s = offline::WriteSidecar(result->sidecar, out); !s.ok()) {
    return Fail("profile", s);
  }
  const nlohmann::json report = offline::ProfileReportJson(*result);
  if (auto path = args->Get("--report")) {
    std::ofstream f(*path);
    f << report.dump(2) << "\n";
    if (!f) return Fail("profile", absl::InternalError(absl::StrCat("cannot write ", *path)));
  }
  if (auto dir = args->Get("--plots")) {
    if (absl::Status s = offline::WriteProfilePlots(*result, *dir); !s.ok()) {
      return Fail("profile", s);
    }
  }
  if (result->sidecar.n_expert > 0) {
    std::printf("%5s  tokens routed to each expert\n", "layer");
    for (const auto& l : report["layers"]) {
      std::printf("%5d ", l["layer"].get<int>());
      for (const auto& c : l["expert_route_count"]) std::printf(" %6lld", c.get<long long>());
      std::printf("\n");
    }
    std::printf("%lld tokens profiled in %.1f s (routing of %lld experts, %lld used); sidecar %s\n",
                static_cast<long long>(result->source.tokens), result->profile_seconds,
                static_cast<long long>(result->sidecar.n_expert),
                static_cast<long long>(result->sidecar.n_expert_used), out.c_str());
    return 0;
  }
  const bool show_contribution = report["target_contribution"].get<double>() < 1;
  std::printf("%5s %9s %7s %5s %7s%s %9s %10s\n", "layer", "sparsity", "skew80", "rank", "recall",
              show_contribution ? " contrib" : "", "precision", "pred KiB");
  for (const auto& l : report["layers"]) {
    std::printf("%5d %9.3f %7.3f %5d %7.4f", l["layer"].get<int>(), l["sparsity"].get<double>(),
                l["skew80"].get<double>(), l["rank"].get<int>(), l["recall"].get<double>());
    if (show_contribution) std::printf(" %7.4f", l["contribution"].get<double>());
    std::printf(" %9.3f %10.1f\n", l["precision"].get<double>(),
                l["predictor_bytes"].get<double>() / 1024);
  }
  const auto& t = report["totals"];
  std::printf(
      "%lld tokens profiled in %.1f s, predictors trained in %.1f s: %.1f KiB "
      "(%.1f%% of the model's weights); sidecar %s\n",
      static_cast<long long>(result->source.tokens), result->profile_seconds, result->train_seconds,
      t["predictor_bytes"].get<double>() / 1024,
      100 * t["predictor_fraction_of_model"].get<double>(), out.c_str());
  if (calibrated) PrintCalibration(*calibrated, result->sidecar.calibration.held_out);
  if (const offline::SidecarSpeed& sp = result->sidecar.speed; sp.present) {
    const double best = std::max(
        {sp.predicted_tokens_per_s, sp.gate_first_tokens_per_s, sp.input_sparse_tokens_per_s});
    std::printf("speed check: %s\n%s\n", offline::DescribeSpeed(sp).c_str(),
                best >= sp.dense_tokens_per_s
                    ? "  sparse pays here: served sparse"
                    : "  sparse is slower here: on this CPU, --sparse auto (the default) serves "
                      "dense; --sparse on serves it sparse");
  }
  return 0;
}

}  // namespace thermocline::cli
