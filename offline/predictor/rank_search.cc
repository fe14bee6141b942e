// The per-layer rank walk and the predictor budget.
#include "offline/predictor/rank_search.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>

#include "absl/strings/str_cat.h"

namespace thermocline::offline {
namespace {

uint64_t MatrixBytes(const WeightView& w) { return static_cast<uint64_t>(w.rows) * w.row_bytes; }

size_t NearestLadderIndex(int64_t rank) {
  const auto& ladder = RankLadder();
  size_t best = 0;
  for (size_t i = 1; i < ladder.size(); ++i) {
    if (std::abs(std::log(static_cast<double>(ladder[i]) / rank)) <
        std::abs(std::log(static_cast<double>(ladder[best]) / rank))) {
      best = i;
    }
  }
  return best;
}

}  // namespace

const std::vector<int64_t>& RankLadder() {
  static const std::vector<int64_t> kLadder = {4,   8,   16,  24,  32,  48,   64,   96,  128,
                                               192, 256, 384, 512, 768, 1024, 1536, 2048};
  return kLadder;
}

int64_t StartRank(int64_t n_embd, double sparsity, double skew80) {
  // Twice the active fraction of the model width, halved for strongly skewed layers (skew80
  // near 0.1) and raised up to 1.6x for flat ones (skew80 near 0.8).
  const double active = std::clamp(1.0 - sparsity, 0.0, 1.0);
  const double skew_factor = std::clamp(2.0 * skew80, 0.5, 1.6);
  return std::max<int64_t>(4, std::llround(2.0 * active * n_embd * skew_factor));
}

absl::StatusOr<PredictorSet> TrainPredictors(ThreadPool& pool, const LlamaModel& model,
                                             const ActivationProfiler& profiler,
                                             const PredictorTrainingOptions& options,
                                             ProgressReporter* progress) {
  const auto t0 = std::chrono::steady_clock::now();
  const LlamaHparams& hp = model.hparams();
  if (profiler.num_samples() < 16) {
    return absl::FailedPreconditionError(absl::StrCat(
        "only ", profiler.num_samples(), " samples were profiled; profile more tokens"));
  }
  const auto& ladder = RankLadder();
  PredictorSet set;
  std::vector<uint64_t> ffn_bytes(hp.n_layer);
  for (int64_t l = 0; l < hp.n_layer; ++l) {
    const LayerWeights& w = model.layers()[l];
    ffn_bytes[l] = MatrixBytes(w.ffn_gate) + MatrixBytes(w.ffn_up) + MatrixBytes(w.ffn_down);
    set.ffn_bytes += ffn_bytes[l];
  }
  // Of the whole model: a predictor costs its reads beside the model's, and a model whose FFN
  // is a small share of its bytes (narrow, or heavily quantized FFN weights like Q2_K's)
  // would otherwise get ranks too small to predict it well (relu-wide.q2_k: rank 4 in every
  // layer at 10% of its FFN bytes, 92% of neurons predicted active; 88% at 10% of the model).
  set.model_bytes = model.weight_bytes();
  TrainOptions train_options = options.train;
  const double ffn_params = 3.0 * static_cast<double>(hp.n_layer) * hp.n_ff * hp.n_embd;
  if (options.auto_contribution && !hp.is_moe() &&
      8.0 * static_cast<double>(set.ffn_bytes) < kLowBits * ffn_params) {
    train_options.target_contribution =
        std::min(train_options.target_contribution, kLowBitContribution);
  }
  set.target_contribution = train_options.target_contribution;
  set.budget_bytes = static_cast<uint64_t>(options.budget_fraction * set.model_bytes);
  auto bytes_for = [&](int64_t r) { return Predictor::StorageBytesFor(hp.n_embd, hp.n_ff, r); };
  const int64_t max_useful_rank = std::max<int64_t>(ladder.front(), hp.n_embd);

  // Start ranks for every layer first, scaled down together when they would take more than
  // 70% of the budget (the rest is headroom for layers whose cost says "grow").
  std::vector<int64_t> start(hp.n_layer);
  std::vector<size_t> first_index(hp.n_layer);
  double start_bytes = 0;
  for (int64_t l = 0; l < hp.n_layer; ++l) {
    const LayerStats& stats = profiler.layer(static_cast<int>(l));
    start[l] = StartRank(hp.n_embd, Sparsity(stats.fire_count, profiler.tokens()),
                         SkewFraction(stats.fire_count, 0.8));
    start_bytes += static_cast<double>(bytes_for(std::min(start[l], max_useful_rank)));
  }
  const double scale =
      std::min(1.0, 0.7 * static_cast<double>(set.budget_bytes) / std::max(1.0, start_bytes));
  uint64_t planned = 0;
  for (int64_t l = 0; l < hp.n_layer; ++l) {
    size_t i = NearestLadderIndex(std::max<int64_t>(
        1, std::llround(scale * static_cast<double>(std::min(start[l], max_useful_rank)))));
    while (i > 0 && ladder[i] > max_useful_rank) --i;
    first_index[l] = i;
    planned += bytes_for(ladder[i]);
  }

  uint64_t used = 0;
  for (int64_t l = 0; l < hp.n_layer; ++l) {
    // This layer may grow into what is left after every later layer keeps its start rank.
    planned -= bytes_for(ladder[first_index[l]]);
    const uint64_t remaining =
        set.budget_bytes > used + planned ? set.budget_bytes - used - planned : 0;
    size_t hi = 0;
    while (hi + 1 < ladder.size() && ladder[hi + 1] <= max_useful_rank &&
           bytes_for(ladder[hi + 1]) <= remaining) {
      ++hi;
    }
    LayerPredictor lp;
    lp.ffn_bytes = ffn_bytes[l];
    lp.start_rank = start[l];
    const size_t first = std::min(first_index[l], hi);

    LayerDataset data = BuildLayerDataset(profiler, static_cast<int>(l),
                                          model.layers()[l].ffn_norm.data(), hp.rms_eps);
    if (train_options.target_contribution < 1.0 && !hp.is_moe()) {
      ComputeContributions(pool, model, static_cast<int>(l), data);
    }
    std::map<size_t, TrainedPredictor> trained;
    auto cost = [&](size_t i) {
      const TrainedPredictor& t = trained.at(i);
      return static_cast<double>(bytes_for(ladder[i])) +
             t.test.predicted_active * static_cast<double>(ffn_bytes[l]);
    };
    auto train = [&](size_t i) -> absl::Status {
      TrainedPredictor t = TrainPredictor(pool, data, ladder[i], train_options);
      RankTrial trial;
      trial.rank = ladder[i];
      trial.test = t.test;
      trial.recall_at_zero = t.test_recall_at_zero;
      trial.predictor_bytes = bytes_for(ladder[i]);
      trial.seconds = t.seconds;
      trained.emplace(i, std::move(t));
      trial.cost_bytes = cost(i);
      lp.trials.push_back(trial);
      if (progress != nullptr &&
          !progress->Update((l + std::min(1.0, lp.trials.size() / 3.0)) / hp.n_layer,
                            absl::StrCat("layer ", l, " rank ", ladder[i]))) {
        return absl::CancelledError("predictor training cancelled");
      }
      return absl::OkStatus();
    };
    if (absl::Status s = train(first); !s.ok()) return s;
    size_t best = first;
    const int max_trials = std::max(1, options.max_trials_per_layer);
    for (size_t i = first + 1; i <= hi && static_cast<int>(lp.trials.size()) < max_trials; ++i) {
      if (absl::Status s = train(i); !s.ok()) return s;
      if (cost(i) >= cost(best) * (1.0 - options.tie_tolerance)) break;
      best = i;
    }
    if (best == first) {
      for (size_t i = first; i-- > 0 && static_cast<int>(lp.trials.size()) < max_trials;) {
        if (absl::Status s = train(i); !s.ok()) return s;
        if (cost(i) > cost(best) * (1.0 + options.tie_tolerance)) break;
        best = i;
      }
    }
    // A rank whose test recall fell short (sampling noise around the calibrated threshold)
    // yields to the cheapest one that reached the target, when there is one.
    if (trained.at(best).test.recall < options.train.target_recall) {
      for (auto& [i, t] : trained) {
        if (t.test.recall >= options.train.target_recall &&
            (trained.at(best).test.recall < options.train.target_recall || cost(i) < cost(best))) {
          best = i;
        }
      }
    }
    lp.trained = std::move(trained.at(best));
    used += lp.trained.predictor.StorageBytes();
    set.layers.push_back(std::move(lp));
  }
  set.total_bytes = used;
  set.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return set;
}

}  // namespace thermocline::offline
