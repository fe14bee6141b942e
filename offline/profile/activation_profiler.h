// The profiler's FFN observer: during dense inference it counts, per layer and FFN neuron, how
// often the neuron fires, keeps |activation| statistics (for SwiGLU magnitude thresholds), and a
// reservoir sample of (FFN input x before ffn_norm, fired mask) pairs for predictor training.
//
// "Fired" means |act| > threshold. For ReLU-family activations (ReGLU, dReLU) the threshold is
// 0, i.e. act != 0. SwiGLU has no exact zeros: the first `calibration_tokens` tokens only feed
// a histogram of |act| per layer, from which the threshold for `target_sparsity` is taken;
// counting and sampling start after them. SwiGLU tokens also calibrate gate-first layers
// (engine/sparse/sparse_plan.h): a per-neuron scale from the same first tokens, then a
// histogram of the score |silu(gate)| · scale. And they calibrate input-sparse layers: per layer
// a histogram of |x| over every element of the normed inputs of attention's q/k/v and of the
// FFN's gate/up, of the same tokens as the |act| histogram.
//
// In a mixture-of-experts model it counts instead, per layer and expert, the tokens the router
// sends to the expert (OnRouting): the routing frequency the placement solver places experts
// by. Such a model has no neuron statistics and no samples.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "engine/model/hparams.h"
#include "engine/model/session.h"

namespace thermocline::offline {

struct ProfilerOptions {
  int64_t max_samples = 4096;        // reservoir size (same tokens for every layer)
  double heldout_fraction = 0.25;    // share of samples kept out of predictor training
  double target_sparsity = 0.5;      // SwiGLU only: fraction of |act| counted as not firing
  int64_t calibration_tokens = 256;  // SwiGLU only
  uint64_t seed = 0x7e53;
};

// |act| histogram bins: the top 12 bits of a float's magnitude (8 exponent bits and 4 mantissa
// bits), so bins are log-spaced about 4% apart and binning needs no log().
constexpr int kAbsHistBins = 4096;
inline int AbsHistBin(float v) {
  uint32_t bits;
  __builtin_memcpy(&bits, &v, 4);
  return static_cast<int>((bits & 0x7fffffffu) >> 19);
}
// The largest float in `bin` (every |v| <= it falls in bins <= bin).
float AbsHistBinUpper(int bin);

struct LayerStats {
  std::vector<uint64_t> fire_count;  // (n_ff) tokens on which the neuron fired
  std::vector<double> abs_sum;       // (n_ff) sum of |act| over counted tokens
  std::vector<uint64_t> abs_hist;    // (kAbsHistBins) |act| of every neuron and token
  // SwiGLU only: a gate-first layer's calibration. The score of neuron i on a token is
  // |silu(gate_i)| · gate_scale[i], gate_scale its mean |up| over the first calibration_tokens
  // tokens, so that the score ranks neurons as |act| = |silu(gate)| · |up| does on average;
  // gate_hist holds the scores of every neuron and later token.
  std::vector<double> up_abs_sum;  // (n_ff) over the calibration tokens
  int64_t up_tokens = 0;
  std::vector<float> gate_scale;    // (n_ff) once calibrated; empty before
  std::vector<uint64_t> gate_hist;  // (kAbsHistBins)
  // SwiGLU only: an input-sparse layer's calibration, |x| of every element of the normed
  // attention input (after attn_norm) and FFN input (after ffn_norm) of every observed token.
  std::vector<uint64_t> attn_in_hist;  // (kAbsHistBins)
  std::vector<uint64_t> ffn_in_hist;   // (kAbsHistBins)
  uint64_t fired_total = 0;            // sum of fire_count
  float threshold = 0.0f;              // fired iff |act| > threshold
  bool calibrated = false;

  // The |act| value below or at which a fraction q of all observed activations lie.
  float AbsQuantile(double q) const;
  // The same of the gate-first score (0 when none was observed).
  float GateScoreQuantile(double q) const;
  // The same of |x| entering q/k/v and entering gate/up (0 when none was observed).
  float AttnInQuantile(double q) const;
  float FfnInQuantile(double q) const;
};

// 1 - fired / (tokens * n): the mean fraction of neurons NOT firing per token.
double Sparsity(const std::vector<uint64_t>& fire_count, int64_t tokens);
// Fraction of neurons (most frequent first) that carry `mass` of all firings (skew80: 0.8).
double SkewFraction(const std::vector<uint64_t>& fire_count, double mass = 0.8);

class ActivationProfiler final : public FfnObserver {
 public:
  ActivationProfiler(const LlamaHparams& hparams, const ProfilerOptions& options);

  void OnFfn(int layer, const float* x, int64_t n_embd, const float* act, int64_t n_ff,
             int64_t n_tokens) override;
  void OnRouting(int layer, const int32_t* selected, int64_t k, int64_t n_tokens) override;
  void OnGate(int layer, const float* gate, const float* up, int64_t n_ff,
              int64_t n_tokens) override;
  // xn: (n_tokens, n_embd). SwiGLU only: into attn_in_hist and ffn_in_hist.
  void OnAttentionInput(int layer, const float* xn, int64_t n_embd, int64_t n_tokens) override;
  void OnFfnInput(int layer, const float* xn, int64_t n_embd, int64_t n_tokens) override;

  int64_t n_layer() const { return n_layer_; }
  int64_t n_embd() const { return n_embd_; }
  int64_t n_ff() const { return n_ff_; }
  bool magnitude_based() const { return magnitude_; }
  int64_t tokens() const { return tokens_; }  // counted tokens (after calibration)
  int64_t observed_tokens() const { return observed_; }
  const LayerStats& layer(int l) const { return layers_[l]; }
  const ProfilerOptions& options() const { return options_; }
  // Mixture of experts: n_expert > 0, and per layer the tokens routed to each expert (n_expert);
  // each layer's counts sum to tokens() * n_expert_used.
  int64_t n_expert() const { return n_expert_; }
  const std::vector<uint64_t>& route_count(int layer) const { return route_count_[layer]; }

  int64_t num_samples() const { return filled_; }
  bool heldout(int64_t s) const { return heldout_[s] != 0; }
  int64_t mask_words() const { return mask_words_; }
  // x of sample s at layer l as floats: out (n_embd).
  void SampleX(int layer, int64_t s, float* out) const;
  // Fired mask of sample s at layer l: bit i of word i/64 is neuron i.
  const uint64_t* SampleMask(int layer, int64_t s) const {
    return masks_[layer].data() + s * mask_words_;
  }

 private:
  void StartBatch(int64_t n_tokens);

  ProfilerOptions options_;
  int64_t n_layer_, n_embd_, n_ff_, mask_words_;
  int64_t n_expert_ = 0;
  std::vector<std::vector<uint64_t>> route_count_;  // (n_layer, n_expert)
  bool magnitude_;
  std::vector<LayerStats> layers_;
  int64_t tokens_ = 0;
  int64_t observed_ = 0;
  bool batch_counted_ = false;
  std::vector<int64_t> batch_slots_;  // per row of the current batch: reservoir slot or -1
  int64_t seen_for_reservoir_ = 0;
  int64_t filled_ = 0;
  std::vector<std::vector<uint16_t>> xs_;     // per layer (max_samples, n_embd) f16
  std::vector<std::vector<uint64_t>> masks_;  // per layer (max_samples, mask_words)
  std::vector<uint8_t> heldout_;
  std::mt19937_64 rng_;
};

}  // namespace thermocline::offline
