// Training one layer's predictor: the profiler's samples turned into (ffn_norm(x), mask)
// datasets, mini-batch Adam on a class-weighted binary cross-entropy, and a threshold chosen on
// held-out data for a target recall.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/model/llama_model.h"
#include "engine/util/thread_pool.h"
#include "offline/predictor/predictor.h"
#include "offline/profile/activation_profiler.h"

namespace thermocline::offline {

// Training samples and two held-out halves: `calib` chooses the threshold, `test` measures it.
struct LayerDataset {
  enum Split { kTrain = 0, kCalib = 1, kTest = 2 };
  int64_t n_embd = 0;
  int64_t n_ff = 0;
  int64_t mask_words = 0;
  std::vector<float> x[3];        // (n[s], n_embd): ffn_norm(x)
  std::vector<uint64_t> mask[3];  // (n[s], mask_words)
  // Held-out splits (calib, test) only: what each firing adds to the layer's output,
  // |act_i| · ‖down column i‖, (n[s], n_ff), 0 where nothing fired; what missing it costs.
  // Empty: every firing counts the same.
  std::vector<float> contribution[3];
  int64_t n[3] = {0, 0, 0};
  bool fired(Split s, int64_t row, int64_t neuron) const {
    return (mask[s][row * mask_words + (neuron >> 6)] >> (neuron & 63)) & 1;
  }
  double ActiveFraction(Split s) const;
};

// ffn_norm: (n_embd) weights of the layer's FFN RMSNorm.
LayerDataset BuildLayerDataset(const ActivationProfiler& profiler, int layer, const float* ffn_norm,
                               float rms_eps);

// Fills data.contribution of the held-out splits from the layer's gate, up and down.
void ComputeContributions(ThreadPool& pool, const LlamaModel& model, int layer, LayerDataset& data);

struct TrainOptions {
  int epochs = 12;
  int64_t batch = 64;
  float learning_rate = 1e-2f;
  float max_pos_weight = 8.0f;  // positives weigh min(this, negatives/positives)
  double target_recall = 0.99;
  // The threshold aims at 1 - (1 - target) * (1 - margin) on the calibration half, so that
  // the test half (not seen by training or calibration) still reaches the target.
  double recall_margin = 0.3;
  // The share of the firings' contribution (LayerDataset::contribution) the threshold keeps on
  // the held-out half, besides target_recall of their count: whichever keeps more decides.
  // Count recall lets a weak predictor miss the few neurons that add the most (relu-wide.q2_k:
  // +1% to +2% perplexity at 99% recall); 0.998 bounds what the misses take from the output,
  // at the price of more neurons predicted active where activations are heavy-tailed (the 1.1B
  // synthetic ReLU model: 14.3% → 15.7%). 1: off (count recall alone). The profile's default
  // is rank_search.h's (auto_contribution).
  double target_contribution = 1.0;
  uint64_t seed = 1;
};

struct PredictorEval {
  double recall = 0;            // firings predicted / firings
  double contribution = 1;      // their contribution predicted / all of it (1 without data)
  double precision = 0;         // firings predicted / predictions
  double predicted_active = 0;  // mean fraction of neurons predicted active per token
  double true_active = 0;       // mean fraction firing per token
};

struct TrainedPredictor {
  Predictor predictor;  // F16-rounded, threshold set
  PredictorEval calib;
  PredictorEval test;
  double test_recall_at_zero = 0;  // recall at the plain decision threshold (logit 0)
  double seconds = 0;
};

TrainedPredictor TrainPredictor(ThreadPool& pool, const LayerDataset& data, int64_t rank,
                                const TrainOptions& options);

// Recall, precision and predicted active fraction of `p` on a split at `threshold`.
PredictorEval EvaluatePredictor(ThreadPool& pool, const Predictor& p, const LayerDataset& data,
                                LayerDataset::Split split, float threshold);

}  // namespace thermocline::offline
