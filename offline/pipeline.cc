// Stage orchestration and sidecar assembly.
#include "offline/pipeline.h"

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"

namespace thermocline::offline {
namespace {

double Since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

Sidecar AssembleSidecar(const LlamaModel& model, const std::string& model_name,
                        const PipelineResult& r, const PipelineOptions& options) {
  const LlamaHparams& hp = model.hparams();
  const ActivationProfiler& prof = *r.profiler;
  Sidecar s;
  s.model_identity = ModelIdentity(model.gguf());
  s.model_name = model_name;
  s.n_layer = hp.n_layer;
  s.n_embd = hp.n_embd;
  s.n_ff = hp.n_ff;
  s.activation = ActivationName(hp.activation);
  s.corpus_kind = r.source.kind;
  s.corpus_hash = r.source.corpus_hash;
  s.tokens = prof.tokens();
  s.target_recall = options.predictors.train.target_recall;
  s.target_sparsity = prof.magnitude_based() ? options.profiler.target_sparsity : 0.0;
  if (hp.is_moe()) {  // routing counts only: no neuron statistics, no predictors
    s.n_expert = hp.n_expert;
    s.n_expert_used = hp.n_expert_used;
    for (int64_t l = 0; l < hp.n_layer; ++l) {
      SidecarLayer& y = s.layers.emplace_back();
      for (uint64_t c : prof.route_count(static_cast<int>(l))) {
        y.expert_route_count.push_back(static_cast<int32_t>(std::min<uint64_t>(c, INT32_MAX)));
      }
    }
    return s;
  }
  for (int64_t l = 0; l < hp.n_layer; ++l) {
    const LayerStats& st = prof.layer(static_cast<int>(l));
    SidecarLayer y;
    for (uint64_t c : st.fire_count) {
      y.fire_count.push_back(static_cast<int32_t>(std::min<uint64_t>(c, INT32_MAX)));
    }
    for (double a : st.abs_sum) {
      y.act_abs_mean.push_back(static_cast<float>(a / std::max<int64_t>(1, prof.tokens())));
    }
    for (int q = 0; q < kQuantileLevels; ++q) {
      y.act_abs_quantiles.push_back(st.AbsQuantile(q / static_cast<double>(kQuantileLevels - 1)));
    }
    if (!st.gate_scale.empty()) {
      y.gate_scale = st.gate_scale;
      for (int q = 0; q < kQuantileLevels; ++q) {
        y.gate_score_quantiles.push_back(
            st.GateScoreQuantile(q / static_cast<double>(kQuantileLevels - 1)));
      }
    }
    if (!st.attn_in_hist.empty()) {
      for (int q = 0; q < kQuantileLevels; ++q) {
        const double level = q / static_cast<double>(kQuantileLevels - 1);
        y.attn_in_quantiles.push_back(st.AttnInQuantile(level));
        y.ffn_in_quantiles.push_back(st.FfnInQuantile(level));
      }
    }
    y.magnitude_threshold = st.threshold;
    y.sparsity = Sparsity(st.fire_count, prof.tokens());
    y.skew80 = SkewFraction(st.fire_count, 0.8);
    const LayerPredictor& lp = r.predictors.layers[l];
    y.predictor = lp.trained.predictor;
    y.recall = lp.trained.test.recall;
    y.precision = lp.trained.test.precision;
    y.predicted_active = lp.trained.test.predicted_active;
    s.layers.push_back(std::move(y));
  }
  return s;
}

}  // namespace

absl::StatusOr<PipelineResult> RunProfilePipeline(const LlamaModel& model,
                                                  const std::string& model_name, ThreadPool& pool,
                                                  const PipelineOptions& options,
                                                  FILE* progress_out, ProgressCallback callback) {
  PipelineResult r;
  ProfilerOptions profiler_options = options.profiler;  // no slots for tokens never seen
  profiler_options.max_samples = std::min(profiler_options.max_samples, options.run.tokens);
  r.profiler = std::make_unique<ActivationProfiler>(model.hparams(), profiler_options);
  auto t0 = std::chrono::steady_clock::now();
  {
    ProgressReporter progress("profile", progress_out, callback);
    auto source = RunProfile(model, pool, *r.profiler, options.run, &progress);
    if (!source.ok()) return source.status();
    r.source = *source;
    progress.Finish(absl::StrCat(r.source.tokens, " tokens (", r.source.kind, ")"));
  }
  r.profile_seconds = Since(t0);
  t0 = std::chrono::steady_clock::now();
  if (!model.hparams().is_moe()) {  // experts are placed by their routing, not predicted
    ProgressReporter progress("train", progress_out, callback);
    auto set = TrainPredictors(pool, model, *r.profiler, options.predictors, &progress);
    if (!set.ok()) return set.status();
    r.predictors = std::move(*set);
    progress.Finish(absl::StrCat(r.predictors.layers.size(), " predictors, ",
                                 r.predictors.total_bytes / 1024, " KiB"));
  }
  r.train_seconds = Since(t0);
  r.sidecar = AssembleSidecar(model, model_name, r, options);
  return r;
}

nlohmann::json ProfileReportJson(const PipelineResult& r) {
  nlohmann::json layers = nlohmann::json::array();
  double sparsity = 0, recall_min = 1;
  for (size_t l = 0; l < r.sidecar.layers.size(); ++l) {
    const SidecarLayer& y = r.sidecar.layers[l];
    if (r.sidecar.n_expert > 0) {
      layers.push_back({{"layer", l}, {"expert_route_count", y.expert_route_count}});
      continue;
    }
    const LayerPredictor& lp = r.predictors.layers[l];
    nlohmann::json trials = nlohmann::json::array();
    for (const RankTrial& t : lp.trials) {
      trials.push_back({{"rank", t.rank},
                        {"recall", t.test.recall},
                        {"contribution", t.test.contribution},
                        {"precision", t.test.precision},
                        {"predicted_active", t.test.predicted_active},
                        {"recall_at_zero", t.recall_at_zero},
                        {"predictor_bytes", t.predictor_bytes},
                        {"cost_bytes", t.cost_bytes},
                        {"seconds", t.seconds}});
    }
    layers.push_back({{"layer", l},
                      {"sparsity", y.sparsity},
                      {"active_fraction", 1.0 - y.sparsity},
                      {"skew80", y.skew80},
                      {"magnitude_threshold", y.magnitude_threshold},
                      {"rank", y.predictor.rank},
                      {"start_rank", lp.start_rank},
                      {"recall", y.recall},
                      {"contribution", lp.trained.test.contribution},
                      {"precision", y.precision},
                      {"predicted_active", y.predicted_active},
                      {"threshold", y.predictor.threshold},
                      {"predictor_bytes", y.predictor.StorageBytes()},
                      {"ffn_bytes", lp.ffn_bytes},
                      {"rank_trials", trials}});
    sparsity += y.sparsity;
    recall_min = std::min(recall_min, y.recall);
  }
  const size_t n = std::max<size_t>(1, r.sidecar.layers.size());
  nlohmann::json report = {
      {"model", r.sidecar.model_name},
      {"model_identity", r.sidecar.model_identity},
      {"activation", r.sidecar.activation},
      {"source", r.source.kind},
      {"corpus_hash", r.source.corpus_hash},
      {"tokens", r.source.tokens},
      {"samples", r.profiler->num_samples()},
      {"target_recall", r.sidecar.target_recall},
      {"target_contribution", r.predictors.target_contribution},
      {"layers", layers},
      {"totals",
       {{"sparsity", sparsity / n},
        {"min_recall", recall_min},
        {"predictor_bytes", r.predictors.total_bytes},
        {"ffn_bytes", r.predictors.ffn_bytes},
        {"predictor_budget_bytes", r.predictors.budget_bytes},
        {"predictor_fraction_of_ffn", static_cast<double>(r.predictors.total_bytes) /
                                          std::max<uint64_t>(1, r.predictors.ffn_bytes)},
        {"model_bytes", r.predictors.model_bytes},
        {"predictor_fraction_of_model", static_cast<double>(r.predictors.total_bytes) /
                                            std::max<uint64_t>(1, r.predictors.model_bytes)},
        {"profile_seconds", r.profile_seconds},
        {"train_seconds", r.train_seconds}}}};
  if (const SidecarCalibration& c = r.sidecar.calibration; c.present) {
    nlohmann::json methods = {
        {"predicted", {{"sparsity", c.predicted_sparsity}, {"ppl", c.predicted_ppl}}}};
    if (c.gate_first) {
      methods["gate_first"] = {{"sparsity", c.gate_first_sparsity}, {"ppl", c.gate_first_ppl}};
    }
    if (c.input_sparse) {
      methods["input_sparse"] = {{"sparsity", c.input_sparse_sparsity},
                                 {"ppl", c.input_sparse_ppl}};
    }
    report["calibration"] = {
        {"max_ppl_increase", c.max_ppl_increase}, {"held_out", c.held_out},   {"context", c.n_ctx},
        {"tokens_scored", c.tokens_scored},       {"dense_ppl", c.dense_ppl}, {"methods", methods}};
  }
  if (const SidecarSpeed& s = r.sidecar.speed; s.present) {
    nlohmann::json methods = nlohmann::json::object();
    if (s.predicted_tokens_per_s > 0) {
      methods["predicted"] = {{"sparsity", s.predicted_sparsity},
                              {"tokens_per_s", s.predicted_tokens_per_s}};
    }
    if (s.gate_first_tokens_per_s > 0) {
      methods["gate_first"] = {{"sparsity", s.gate_first_sparsity},
                               {"tokens_per_s", s.gate_first_tokens_per_s}};
    }
    if (s.input_sparse_tokens_per_s > 0) {
      methods["input_sparse"] = {{"sparsity", s.input_sparse_sparsity},
                                 {"tokens_per_s", s.input_sparse_tokens_per_s}};
    }
    report["speed_check"] = {{"cpu", s.cpu},
                             {"threads", s.threads},
                             {"dense_tokens_per_s", s.dense_tokens_per_s},
                             {"methods", methods}};
  }
  return report;
}

}  // namespace thermocline::offline
