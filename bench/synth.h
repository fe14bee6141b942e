// Random-weight llama models of any shape, written as GGUF, for benchmarks at scales no model
// can be downloaded for here. Deterministic for a seed.
//
// With a sparsity, a ReLU model's neurons fire like a trained one's: dimension 0 of the residual
// stream is a constant (the embeddings carry it, no layer writes it: rows 0 of attn_output and
// ffn_down are zero), so each gate row's weight on it acts as a bias that sets how often the
// neuron fires. Every other dimension of xn carries token-dependent noise of a known variance,
// so a bias of z noise-deviations fires with probability Phi(z). Layers add little to the
// residual (output projections scaled down), which keeps that variance the same in every layer.
// Which neurons fire depends on a few directions of xn (MakeGateRow in synth.cc), so low-rank
// predictors can learn it, as they can for trained models.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/model/hparams.h"
#include "engine/ops/ggml_types.h"
#include "engine/util/thread_pool.h"

namespace thermocline {

class LlamaModel;

struct SynthOptions {
  int64_t n_layer = 2;
  int64_t n_embd = 256;
  int64_t n_ff = 688;
  int64_t n_head = 4;
  int64_t n_head_kv = 4;
  int64_t n_vocab = 512;
  int64_t n_ctx = 2048;
  GgmlType type = GgmlType::kF16;  // weight matrices; norms stay f32
  FfnActivation activation = FfnActivation::kSilu;
  uint64_t seed = 42;
  // ReLU family only, 0 = plain random weights. Mean fraction of FFN neurons that do NOT fire
  // per token, in [0.5, 0.999], with a power-law firing frequency: hot_fraction of the neurons
  // fire for more than half of the tokens, the rest ever more rarely (see synth.cc).
  double sparsity = 0;
  double hot_fraction = 0.05;
  // A Mixtral-style mixture of experts when n_expert > 0: every layer's FFN is n_expert random
  // experts of n_ff neurons (ffn_{gate,up,down}_exps) and a random F32 router (ffn_gate_inp)
  // choosing n_expert_used of them per token. With a sparsity (ReLU family), every expert's
  // neurons fire like a sparse dense FFN's, each expert from its own seed.
  int64_t n_expert = 0;
  int64_t n_expert_used = 0;
};

// The firing probability of each of n neurons, sorted from the hottest: p(r) =
// min(0.99, 0.5 * ((r + 1) / (hot_fraction * n))^-alpha), alpha chosen so that the mean is
// 1 - sparsity. InvalidArgument when no alpha reaches it.
absl::StatusOr<std::vector<double>> PowerLawFiring(int64_t n, double sparsity, double hot_fraction);

// What a --sparsity model's gate is made of gives an exact-structure predictor per layer
// (rank 2 * 16 + 1; see synth.cc): the sidecar `synth --sidecar` writes, so that sparse speed
// can be measured without profiling a large random model.
struct SynthPredictor {
  int64_t rank = 0;
  std::vector<float> fc1, b1;  // (rank, n_embd), (rank)
  std::vector<float> fc2, b2;  // (n_ff, rank), (n_ff)
  float threshold = 0;         // active iff logit > threshold
  std::vector<double> firing;  // (n_ff) each neuron's firing probability
};
absl::StatusOr<std::vector<SynthPredictor>> SynthPredictors(const SynthOptions& options);

// The recall `synth --sidecar` calibrates the implied predictors to, as the profiler trains its
// predictors to a target recall; the sidecar records it as its target.
inline constexpr double kSynthPredictorRecall = 0.99;

// Sets each layer's threshold as a profiler would: the model runs `n_tokens` tokens (ids spread
// over the vocabulary) with the dense FFN, and the threshold is the largest that keeps `recall`
// of the neurons that fired predicted. The construction's own threshold (SynthPredictors) is a
// bound that predicts far more neurons than that needs: its recall is ~0.999.
absl::Status CalibrateSynthThresholds(const LlamaModel& model, ThreadPool& pool, double recall,
                                      int64_t n_tokens, std::vector<SynthPredictor>& predictors);

absl::Status SynthesizeModel(const SynthOptions& options, const std::string& path,
                             ThreadPool& pool);

}  // namespace thermocline
