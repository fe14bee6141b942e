#include "engine/model/rope.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace thermocline {
namespace {

// The base frequency of pair i, rounded to float as the cos/sin table has always used it.
double BaseFrequency(double base, int64_t i, int64_t rope_dim) {
  return static_cast<float>(std::pow(base, -2.0 * static_cast<double>(i) / rope_dim));
}

// YaRN's pair index at which a frequency makes `rotations` turns over the original context.
double YarnCorrectionDim(double rotations, int64_t rope_dim, int64_t orig_ctx, double base) {
  return rope_dim * std::log(orig_ctx / (rotations * 2 * std::numbers::pi)) / (2 * std::log(base));
}

}  // namespace

double RopeTable::Llama3Divisor(double freq, const LlamaHparams& h) {
  const double factor = h.rope_scaling_factor;
  const double low = h.llama3_low_freq_factor, high = h.llama3_high_freq_factor;
  const double orig = static_cast<double>(h.rope_orig_ctx);
  const double wavelen = 2 * std::numbers::pi / freq;
  if (wavelen < orig / high) return 1.0;
  if (wavelen > orig / low) return factor;
  const double smooth = (orig / wavelen - low) / (high - low);
  return 1.0 / ((1 - smooth) / factor + smooth);
}

RopeTable RopeTable::ForModel(const LlamaHparams& h, absl::Span<const float> factors) {
  RopeTable t;
  const int64_t pairs = h.rope_dim / 2;
  t.coef_.resize(pairs);
  t.mscale_ = h.rope_attn_factor;
  const double scale = h.rope_freq_scale;
  // YaRN: pairs below `low` keep their angle (ramp 1), above `high` are interpolated (ramp 0).
  double low = 0, high = 0;
  if (h.rope_scaling == RopeScaling::kYarn) {
    const double base = h.rope_freq_base;
    low = std::max(
        0.0, std::floor(YarnCorrectionDim(h.yarn_beta_fast, h.rope_dim, h.rope_orig_ctx, base)));
    high =
        std::min(static_cast<double>(h.rope_dim - 1),
                 std::ceil(YarnCorrectionDim(h.yarn_beta_slow, h.rope_dim, h.rope_orig_ctx, base)));
    t.mscale_ *= static_cast<float>(1.0 + 0.1 * std::log(1.0 / scale));
  }
  for (int64_t i = 0; i < pairs; ++i) {
    const double freq = BaseFrequency(h.rope_freq_base, i, h.rope_dim);
    double divisor = factors.empty() ? 1.0 : static_cast<double>(factors[i]);
    if (factors.empty() && h.rope_scaling == RopeScaling::kLlama3) {
      divisor = Llama3Divisor(freq, h);
    }
    const double extrap = freq / divisor;
    if (h.rope_scaling == RopeScaling::kYarn) {
      const double y = (static_cast<double>(i) - low) / std::max(0.001, high - low);
      const double ramp = 1.0 - std::clamp(y, 0.0, 1.0);
      t.coef_[i] = extrap * (scale * (1.0 - ramp) + ramp);
    } else {
      t.coef_[i] = extrap * scale;
    }
  }
  return t;
}

RopeTable RopeTable::ForSlidingLayers(const LlamaHparams& h) {
  RopeTable t;
  const int64_t pairs = h.rope_dim / 2;
  t.coef_.resize(pairs);
  for (int64_t i = 0; i < pairs; ++i)
    t.coef_[i] = BaseFrequency(h.rope_freq_base_swa, i, h.rope_dim);
  return t;
}

}  // namespace thermocline
