// The offline pipeline as the daemon's background job and `thermocline profile` run it:
// profile (dense inference with the activation profiler) -> train predictors (adaptive rank)
// -> assemble the sidecar; and `solve`'s step: placement ILP -> neuron tables in the sidecar.
// Progress goes to a ProgressReporter per stage; the callback may cancel.
#pragma once

#include <cstdio>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "engine/model/llama_model.h"
#include "engine/util/thread_pool.h"
#include "nlohmann/json.hpp"
#include "offline/predictor/rank_search.h"
#include "offline/profile/activation_profiler.h"
#include "offline/profile/profile_run.h"
#include "offline/sidecar/sidecar.h"
#include "offline/solver/ilp_solver.h"
#include "offline/solver/placement.h"

namespace thermocline::offline {

struct PipelineOptions {
  ProfileRunOptions run;
  ProfilerOptions profiler;
  PredictorTrainingOptions predictors;
};

struct PipelineResult {
  std::unique_ptr<ActivationProfiler> profiler;
  ProfileSource source;
  PredictorSet predictors;
  Sidecar sidecar;
  double profile_seconds = 0;
  double train_seconds = 0;
};

// progress_out: bars or lines (nullptr: silent); callback: see ProgressCallback.
absl::StatusOr<PipelineResult> RunProfilePipeline(const LlamaModel& model,
                                                  const std::string& model_name, ThreadPool& pool,
                                                  const PipelineOptions& options,
                                                  FILE* progress_out,
                                                  ProgressCallback callback = nullptr);

// REPORT.json: per layer sparsity, skew80, rank, recall, precision, predictor_bytes, ...;
// totals.
nlohmann::json ProfileReportJson(const PipelineResult& result);
// firing_frequency.svg (log-log power law per layer), recall_vs_rank.svg, active_vs_rank.svg.
absl::Status WriteProfilePlots(const PipelineResult& result, const std::string& dir);

struct PlacementRun {
  PlacementProblem problem;
  HardwareProfile hardware;
  Objective objective = Objective::kTime;
  SolveResult chosen;  // of `objective`
  SolveResult other;   // of the other objective, for comparison
};

// Solves both objectives (the chosen one with the full time limit) on the sidecar's profile.
absl::StatusOr<PlacementRun> SolvePlacementFor(const LlamaModel& model, const Sidecar& sidecar,
                                               const HardwareProfile& hw,
                                               const ProblemOptions& problem_options,
                                               const SolveOptions& solve_options);
// Writes the chosen placement (neuron tables, attention flags, figures) into the sidecar.
void ApplyPlacement(const PlacementRun& run, Sidecar& sidecar);
nlohmann::json PlacementJson(const PlacementRun& run);
// placement.svg: GPU share of neurons and of firing mass per layer.
absl::Status WritePlacementPlot(const PlacementRun& run, const std::string& dir);

}  // namespace thermocline::offline
