// Adaptive predictor rank per layer. Each layer starts from a rank derived from its sparsity and
// skew, then walks a ladder of ranks: up while a larger rank lowers the layer's modelled bytes
// per token, down while a smaller one costs no more (within a tolerance), so skewed, sparse
// layers end small and flat ones larger. Every trained rank meets the recall target through its
// held-out threshold; the cost that ranks compete on is
//   predictor bytes + predicted active fraction × the layer's FFN bytes,
// the bytes a sparse FFN step reads. The ranks of all layers fit within budget_fraction of the
// model's weight bytes (the matrices a dense decode step reads: DESIGN's "under ~10% of the
// model").
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model/llama_model.h"
#include "engine/util/thread_pool.h"
#include "offline/predictor/trainer.h"
#include "offline/profile/activation_profiler.h"
#include "offline/util/progress.h"

namespace thermocline::offline {

struct PredictorTrainingOptions {
  TrainOptions train;
  double budget_fraction = 0.10;  // all predictors <= this × the model's weight bytes
  double tie_tolerance = 0.02;    // a smaller rank wins when its cost is within this
  int max_trials_per_layer = 4;
  // train.target_contribution chosen by the model: kLowBitContribution where its FFN weights
  // take under kLowBits bits each (Q2_K files), else train's as given. False: train's always.
  bool auto_contribution = true;
};

// 2-bit FFN weights leave a model sensitive to the few firings that add the most (trainer.h's
// target_contribution); the contribution target such a model gets by default.
inline constexpr double kLowBits = 3.0;
inline constexpr double kLowBitContribution = 0.998;

struct RankTrial {
  int64_t rank = 0;
  PredictorEval test;
  double recall_at_zero = 0;
  uint64_t predictor_bytes = 0;
  double cost_bytes = 0;  // modelled bytes per token of this layer's sparse FFN step
  double seconds = 0;
};

struct LayerPredictor {
  TrainedPredictor trained;
  std::vector<RankTrial> trials;  // in the order tried
  int64_t start_rank = 0;
  uint64_t ffn_bytes = 0;  // gate + up + down weight bytes of the layer
};

struct PredictorSet {
  std::vector<LayerPredictor> layers;
  uint64_t total_bytes = 0;
  uint64_t budget_bytes = 0;       // budget_fraction of model_bytes
  uint64_t model_bytes = 0;        // LlamaModel::weight_bytes()
  double target_contribution = 1;  // TrainOptions::target_contribution (1: not measured)
  uint64_t ffn_bytes = 0;
  double seconds = 0;
};

// The ranks tried, ascending.
const std::vector<int64_t>& RankLadder();
// The first rank tried for a layer (before capping).
int64_t StartRank(int64_t n_embd, double sparsity, double skew80);

absl::StatusOr<PredictorSet> TrainPredictors(ThreadPool& pool, const LlamaModel& model,
                                             const ActivationProfiler& profiler,
                                             const PredictorTrainingOptions& options,
                                             ProgressReporter* progress);

}  // namespace thermocline::offline
