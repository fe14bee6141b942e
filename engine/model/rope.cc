#include "engine/model/rope.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace thermocline {
namespace {

// base^(-2 / rope_dim) in float: the ratio of consecutive pairs' frequencies.
float ThetaScale(float base, int64_t rope_dim) {
  return std::pow(base, -2.0f / static_cast<float>(rope_dim));
}

// YaRN's pair index at which a frequency makes `rotations` turns over the original context.
float YarnCorrectionDim(float rotations, int64_t rope_dim, int64_t orig_ctx, float base) {
  return static_cast<float>(rope_dim) *
         std::log(static_cast<float>(orig_ctx) /
                  (rotations * 2 * static_cast<float>(std::numbers::pi))) /
         (2 * std::log(base));
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
  t.theta_scale_ = ThetaScale(h.rope_freq_base, h.rope_dim);
  t.freq_scale_ = h.rope_freq_scale;
  t.mscale_ = h.rope_attn_factor;
  t.divisor_.assign(pairs, 1.0f);
  t.ramp_.assign(pairs, 0.0f);
  if (!factors.empty()) {
    std::copy_n(factors.begin(), pairs, t.divisor_.begin());
  } else if (h.rope_scaling == RopeScaling::kLlama3) {
    float freq = 1.0f;  // pair i's unscaled frequency, formed as Fill forms the angles
    for (int64_t i = 0; i < pairs; ++i, freq *= t.theta_scale_) {
      t.divisor_[i] = static_cast<float>(Llama3Divisor(freq, h));
    }
  }
  if (h.rope_scaling == RopeScaling::kYarn) {
    // Pairs below `low` keep their angle (ramp 1), above `high` are interpolated (ramp 0).
    const float base = h.rope_freq_base;
    const float low = std::max(
        0.0f, std::floor(YarnCorrectionDim(h.yarn_beta_fast, h.rope_dim, h.rope_orig_ctx, base)));
    const float high =
        std::min(static_cast<float>(h.rope_dim - 1),
                 std::ceil(YarnCorrectionDim(h.yarn_beta_slow, h.rope_dim, h.rope_orig_ctx, base)));
    for (int64_t i = 0; i < pairs; ++i) {
      const float y = (static_cast<float>(i) - low) / std::max(0.001f, high - low);
      t.ramp_[i] = 1.0f - std::clamp(y, 0.0f, 1.0f);
    }
    t.yarn_ = true;
    t.mscale_ *= 1.0f + 0.1f * std::log(1.0f / t.freq_scale_);
  }
  return t;
}

RopeTable RopeTable::ForSlidingLayers(const LlamaHparams& h) {
  RopeTable t;
  t.theta_scale_ = ThetaScale(h.rope_freq_base_swa, h.rope_dim);
  t.divisor_.assign(h.rope_dim / 2, 1.0f);
  t.ramp_.assign(h.rope_dim / 2, 0.0f);
  return t;
}

}  // namespace thermocline
