// RoPE's angles: for each pair i of the rotated dimensions, θ_i = pos · c_i, and the cos/sin
// table of a position that every head and layer of one kind shares. The angle folds in the
// base, the per-pair frequency factors (rope_freqs, Llama 3 scaling, LongRoPE), linear position
// scaling and YaRN's interpolation ramp, so a token's table costs rope_dim / 2 cos/sin pairs
// whatever the scaling. Formulas: linear scaling divides positions by the factor; Llama 3
// (Meta's apply_scaling) divides each frequency by a factor between 1 (short wavelengths) and
// the scaling factor (long ones); YaRN (Peng et al. 2023, as llama.cpp's rope_yarn) blends the
// interpolated and the original angle per pair and scales cos and sin by 1 + 0.1 ln(factor).
//
// Precision: as ggml forms the angles, in float. The base angle of pair i is pos · s^i with
// s = base^(-2 / rope_dim), by one float multiplication per pair from θ_0 = pos; each pair's
// factor divides it, the scale multiplies it, and cos and sin are float. Computing the same
// angles in double (closer to exact) differs from llama.cpp by an ulp of the angle, which an
// F16 cache's rounding of q and k sometimes turns into a different half.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "absl/types/span.h"
#include "engine/model/hparams.h"

namespace thermocline {

class RopeTable {
 public:
  RopeTable() = default;
  // The layers' RoPE (all of them, or Gemma 3's global ones). `factors`: (rope_dim / 2)
  // divisors of each pair's angle from the file (rope_freqs, LongRoPE's), or empty.
  static RopeTable ForModel(const LlamaHparams& h, absl::Span<const float> factors);
  // The sliding layers' RoPE where the family gives them their own base (rope_freq_base_swa,
  // unscaled).
  static RopeTable ForSlidingLayers(const LlamaHparams& h);

  // cos_sin: (rope_dim) = (cos θ_i, sin θ_i) · mscale for each pair i at position pos.
  void Fill(int64_t pos, float* cos_sin) const {
    float base_angle = static_cast<float>(pos);
    const int64_t n = static_cast<int64_t>(divisor_.size());
    for (int64_t i = 0; i < n; ++i) {
      const float extrap = base_angle / divisor_[i];
      const float interp = freq_scale_ * extrap;
      const float theta = yarn_ ? interp * (1 - ramp_[i]) + extrap * ramp_[i] : interp;
      cos_sin[2 * i] = std::cos(theta) * mscale_;
      cos_sin[2 * i + 1] = std::sin(theta) * mscale_;
      base_angle *= theta_scale_;
    }
  }
  float mscale() const { return mscale_; }

  // Llama 3's divisor of the frequency `freq` (radians per position).
  static double Llama3Divisor(double freq, const LlamaHparams& h);

 private:
  float theta_scale_ = 1.0f;    // base^(-2 / rope_dim): pair i + 1's frequency over pair i's
  float freq_scale_ = 1.0f;     // linear scaling's (and YaRN's) 1 / factor
  bool yarn_ = false;           // blend by ramp_
  std::vector<float> divisor_;  // (rope_dim / 2): each pair's frequency factor
  std::vector<float> ramp_;     // (rope_dim / 2), YaRN: the original angle's share
  float mscale_ = 1.0f;
};

}  // namespace thermocline
