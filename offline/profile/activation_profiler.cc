// Counting, histogram and reservoir sampling of FFN activations.
#include "offline/profile/activation_profiler.h"

#include <algorithm>
#include <cmath>
#include <functional>

#include "engine/ops/kernels.h"

namespace thermocline::offline {

float AbsHistBinUpper(int bin) {
  const uint32_t bits = (static_cast<uint32_t>(bin + 1) << 19) - 1;
  float v;
  __builtin_memcpy(&v, &bits, 4);
  return v;
}

namespace {
float HistQuantile(const std::vector<uint64_t>& hist, double q) {
  uint64_t total = 0;
  for (uint64_t c : hist) total += c;
  if (total == 0) return 0.0f;
  const double target = std::clamp(q, 0.0, 1.0) * static_cast<double>(total);
  uint64_t cumulative = 0;
  for (int b = 0; b < kAbsHistBins; ++b) {
    cumulative += hist[b];
    if (static_cast<double>(cumulative) >= target && cumulative > 0) return AbsHistBinUpper(b);
  }
  return AbsHistBinUpper(kAbsHistBins - 1);
}
}  // namespace

float LayerStats::AbsQuantile(double q) const { return HistQuantile(abs_hist, q); }
float LayerStats::GateScoreQuantile(double q) const { return HistQuantile(gate_hist, q); }
float LayerStats::AttnInQuantile(double q) const { return HistQuantile(attn_in_hist, q); }
float LayerStats::FfnInQuantile(double q) const { return HistQuantile(ffn_in_hist, q); }

double Sparsity(const std::vector<uint64_t>& fire_count, int64_t tokens) {
  if (tokens <= 0 || fire_count.empty()) return 0.0;
  double fired = 0;
  for (uint64_t c : fire_count) fired += static_cast<double>(c);
  return 1.0 - fired / (static_cast<double>(tokens) * static_cast<double>(fire_count.size()));
}

double SkewFraction(const std::vector<uint64_t>& fire_count, double mass) {
  if (fire_count.empty()) return 0.0;
  std::vector<uint64_t> sorted = fire_count;
  std::sort(sorted.begin(), sorted.end(), std::greater<>());
  double total = 0;
  for (uint64_t c : sorted) total += static_cast<double>(c);
  if (total <= 0) return 0.0;
  double cumulative = 0;
  for (size_t i = 0; i < sorted.size(); ++i) {
    cumulative += static_cast<double>(sorted[i]);
    if (cumulative >= mass * total) return static_cast<double>(i + 1) / sorted.size();
  }
  return 1.0;
}

ActivationProfiler::ActivationProfiler(const LlamaHparams& hparams, const ProfilerOptions& options)
    : options_(options),
      n_layer_(hparams.n_layer),
      n_embd_(hparams.n_embd),
      n_ff_(hparams.n_ff),
      mask_words_((hparams.n_ff + 63) / 64),
      magnitude_(hparams.activation == FfnActivation::kSilu && !hparams.is_moe()),
      layers_(hparams.n_layer),
      rng_(options.seed) {
  for (LayerStats& s : layers_) {
    s.fire_count.assign(n_ff_, 0);
    s.abs_sum.assign(n_ff_, 0.0);
    s.abs_hist.assign(kAbsHistBins, 0);
    if (magnitude_) {
      s.gate_hist.assign(kAbsHistBins, 0);
      s.up_abs_sum.assign(n_ff_, 0.0);
      s.attn_in_hist.assign(kAbsHistBins, 0);
      s.ffn_in_hist.assign(kAbsHistBins, 0);
    }
    s.calibrated = !magnitude_;
  }
  n_expert_ = hparams.n_expert;
  route_count_.assign(n_layer_, std::vector<uint64_t>(n_expert_, 0));
  // An MoE model's samples would never be filled (its layers have no OnFfn).
  const int64_t cap = hparams.is_moe() ? 0 : std::max<int64_t>(0, options_.max_samples);
  xs_.resize(n_layer_);
  masks_.resize(n_layer_);
  for (int64_t l = 0; l < n_layer_; ++l) {
    xs_[l].assign(cap * n_embd_, 0);
    masks_[l].assign(cap * mask_words_, 0);
  }
  heldout_.assign(cap, 0);
}

void ActivationProfiler::StartBatch(int64_t n_tokens) {
  observed_ += n_tokens;
  batch_counted_ = !magnitude_ || observed_ - n_tokens >= options_.calibration_tokens;
  batch_slots_.assign(n_tokens, -1);
  if (!batch_counted_) return;
  tokens_ += n_tokens;
  // Reservoir sampling (Algorithm R) over counted tokens; layers share the decision.
  const int64_t cap = static_cast<int64_t>(heldout_.size());
  std::bernoulli_distribution heldout(options_.heldout_fraction);
  for (int64_t t = 0; t < n_tokens; ++t, ++seen_for_reservoir_) {
    int64_t slot = -1;
    if (seen_for_reservoir_ < cap) {
      slot = seen_for_reservoir_;
      filled_ = slot + 1;
    } else if (cap > 0) {
      std::uniform_int_distribution<int64_t> pick(0, seen_for_reservoir_);
      const int64_t j = pick(rng_);
      if (j < cap) slot = j;
    }
    if (slot >= 0) heldout_[slot] = heldout(rng_) ? 1 : 0;
    batch_slots_[t] = slot;
  }
}

void ActivationProfiler::OnFfn(int layer, const float* x, int64_t n_embd, const float* act,
                               int64_t n_ff, int64_t n_tokens) {
  if (layer == 0) StartBatch(n_tokens);
  LayerStats& s = layers_[layer];
  for (int64_t t = 0; t < n_tokens * n_ff; ++t) s.abs_hist[AbsHistBin(act[t])]++;
  if (!batch_counted_) return;
  if (!s.calibrated) {  // SwiGLU: the calibration tokens are in the histogram now
    s.threshold = s.AbsQuantile(options_.target_sparsity);
    s.calibrated = true;
  }
  const float thr = s.threshold;
  for (int64_t t = 0; t < n_tokens; ++t) {
    const float* a = act + t * n_ff;
    const int64_t slot = batch_slots_[t];
    uint64_t* mask = slot >= 0 ? masks_[layer].data() + slot * mask_words_ : nullptr;
    if (mask != nullptr) std::fill(mask, mask + mask_words_, 0);
    uint64_t fired = 0;
    for (int64_t i = 0; i < n_ff; ++i) {
      const float m = std::fabs(a[i]);
      s.abs_sum[i] += m;
      if (m > thr) {
        s.fire_count[i]++;
        ++fired;
        if (mask != nullptr) mask[i >> 6] |= uint64_t{1} << (i & 63);
      }
    }
    s.fired_total += fired;
    if (slot >= 0) {
      uint16_t* dst = xs_[layer].data() + slot * n_embd_;
      const float* src = x + t * n_embd;
      for (int64_t j = 0; j < n_embd_; ++j) dst[j] = FloatToHalf(src[j]);
    }
  }
}

void ActivationProfiler::OnGate(int layer, const float* gate, const float* up, int64_t n_ff,
                                int64_t n_tokens) {
  if (!magnitude_) return;
  LayerStats& s = layers_[layer];
  if (s.gate_scale.empty()) {  // calibrating the scale: mean |up| per neuron
    for (int64_t t = 0; t < n_tokens; ++t) {
      for (int64_t i = 0; i < n_ff; ++i) s.up_abs_sum[i] += std::fabs(up[t * n_ff + i]);
    }
    s.up_tokens += n_tokens;
    if (s.up_tokens >= options_.calibration_tokens) {
      s.gate_scale.resize(n_ff);
      for (int64_t i = 0; i < n_ff; ++i) {
        s.gate_scale[i] = static_cast<float>(s.up_abs_sum[i] / static_cast<double>(s.up_tokens));
      }
    }
    return;
  }
  for (int64_t t = 0; t < n_tokens; ++t) {
    for (int64_t i = 0; i < n_ff; ++i) {
      const float g = gate[t * n_ff + i];
      s.gate_hist[AbsHistBin(g / (1.0f + std::exp(-g)) * s.gate_scale[i])]++;
    }
  }
}

namespace {
// |x| of n values into hist's bins.
void AddToHist(std::vector<uint64_t>& hist, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) hist[AbsHistBin(x[i])]++;
}
}  // namespace

// Every token, as OnFfn fills abs_hist: the calibration tokens too.
void ActivationProfiler::OnAttentionInput(int layer, const float* xn, int64_t n_embd,
                                          int64_t n_tokens) {
  if (magnitude_) AddToHist(layers_[layer].attn_in_hist, xn, n_tokens * n_embd);
}

void ActivationProfiler::OnFfnInput(int layer, const float* xn, int64_t n_embd, int64_t n_tokens) {
  if (magnitude_) AddToHist(layers_[layer].ffn_in_hist, xn, n_tokens * n_embd);
}

void ActivationProfiler::OnRouting(int layer, const int32_t* selected, int64_t k,
                                   int64_t n_tokens) {
  if (layer == 0) StartBatch(n_tokens);
  if (!batch_counted_) return;
  std::vector<uint64_t>& count = route_count_[layer];
  for (int64_t i = 0; i < n_tokens * k; ++i) {
    if (selected[i] >= 0 && selected[i] < n_expert_) count[selected[i]]++;
  }
}

void ActivationProfiler::SampleX(int layer, int64_t s, float* out) const {
  const uint16_t* src = xs_[layer].data() + s * n_embd_;
  for (int64_t j = 0; j < n_embd_; ++j) out[j] = HalfToFloat(src[j]);
}

}  // namespace thermocline::offline
