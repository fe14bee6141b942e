// Small element-wise operators of the forward pass (norms, RoPE of both pair layouts, softmax,
// gated activations, soft-capping). Plain loops the compiler vectorizes; the heavy products
// live in ops/matmul.h.
#pragma once

#include <cmath>
#include <cstdint>

#include "engine/model/hparams.h"
#include "engine/ops/kernels.h"

namespace thermocline {

// out = x / rms(x) * weight. x, out, weight: (n). As ggml's rms_norm rounds: the squares in
// float summed in double, their mean rounded to float, scale = 1 / sqrtf(mean + eps) in float.
inline void RmsNorm(const float* x, const float* weight, int64_t n, float eps, float* out) {
  // Eight partial sums: independent chains the compiler keeps in vector lanes. One running sum
  // is a chain of n dependent adds (≈ 3 µs for 2048 values, 45 norms per token).
  constexpr int kParts = 8;
  double part[kParts] = {};
  int64_t j = 0;
  for (; j + kParts <= n; j += kParts) {
    for (int k = 0; k < kParts; ++k) part[k] += static_cast<double>(x[j + k] * x[j + k]);
  }
  double sum = 0.0;
  for (; j < n; ++j) sum += static_cast<double>(x[j] * x[j]);
  for (double p : part) sum += p;
  const float mean = static_cast<float>(sum / static_cast<double>(n));
  const float scale = 1.0f / std::sqrt(mean + eps);
  for (int64_t i = 0; i < n; ++i) out[i] = x[i] * scale * weight[i];
}

// In-place softmax of x: (n).
inline void Softmax(float* x, int64_t n) {
  float max = x[0];
  for (int64_t i = 1; i < n; ++i) max = x[i] > max ? x[i] : max;
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - max);
    sum += x[i];
  }
  const float inv = static_cast<float>(1.0 / sum);
  for (int64_t i = 0; i < n; ++i) x[i] *= inv;
}

// One coordinate of a rotated pair, a·b + r, rounded once as ggml's RoPE computes it (its
// compiler fuses the first product and the sum into an FMA): a·b of two floats is exact in
// double, so only the sum rounds (to double, then float: a second rounding that differs from a
// single one only when the double lands on a float's midpoint). Vectorizes without FMA.
inline float RotateTerm(float a, float b, float r) {
  return static_cast<float>(static_cast<double>(a) * b + r);
}

// RoPE as llama.cpp applies it for `llama` (adjacent pairs): for each head of x,
// (x[2i], x[2i+1]) rotated by cos_sin[i] = (cos θ_i, sin θ_i), for i < rope_dim / 2.
inline void ApplyRope(float* x, int64_t n_heads, int64_t head_dim, int64_t rope_dim,
                      const float* cos_sin) {
  for (int64_t h = 0; h < n_heads; ++h) {
    float* v = x + h * head_dim;
    for (int64_t i = 0; i < rope_dim / 2; ++i) {
      const float c = cos_sin[2 * i], s = cos_sin[2 * i + 1];
      const float x0 = v[2 * i], x1 = v[2 * i + 1];
      v[2 * i] = RotateTerm(x0, c, -(x1 * s));
      v[2 * i + 1] = RotateTerm(x0, s, x1 * c);
    }
  }
}

// RoPE in the GPT-NeoX layout (qwen2, gemma, phi3): for each head of x, (x[i], x[i + rope_dim/2])
// rotated by cos_sin[i], for i < rope_dim / 2.
inline void ApplyRopeNeox(float* x, int64_t n_heads, int64_t head_dim, int64_t rope_dim,
                          const float* cos_sin) {
  const int64_t half = rope_dim / 2;
  for (int64_t h = 0; h < n_heads; ++h) {
    float* v = x + h * head_dim;
    for (int64_t i = 0; i < half; ++i) {
      const float c = cos_sin[2 * i], s = cos_sin[2 * i + 1];
      const float x0 = v[i], x1 = v[i + half];
      v[i] = RotateTerm(x0, c, -(x1 * s));
      v[i + half] = RotateTerm(x0, s, x1 * c);
    }
  }
}

// GELU with the tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
inline float GeluTanh(float x) {
  constexpr float kSqrt2OverPi = 0.7978845608028654f;
  return 0.5f * x * (1.0f + std::tanh(kSqrt2OverPi * x * (1.0f + 0.044715f * x * x)));
}

// x := c · tanh(x / c), n elements (soft-capping, Gemma 2).
inline void SoftCap(float* x, int64_t n, float c) {
  const float inv = 1.0f / c;
  for (int64_t i = 0; i < n; ++i) x[i] = c * std::tanh(x[i] * inv);
}

// Each of the n rows of x: (n, dim) plus bias: (dim).
inline void AddBias(float* x, int64_t n, int64_t dim, const float* bias) {
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t i = 0; i < dim; ++i) x[t * dim + i] += bias[i];
  }
}

// gate := act(gate) * up (or relu(up) for dReLU), n elements.
inline void GatedActivation(FfnActivation act, float* gate, const float* up, int64_t n) {
  switch (act) {
    case FfnActivation::kSilu:
      SiluMul(gate, up, n);
      break;
    case FfnActivation::kRelu:
      for (int64_t i = 0; i < n; ++i) gate[i] = gate[i] > 0.0f ? gate[i] * up[i] : 0.0f;
      break;
    case FfnActivation::kDRelu:
      for (int64_t i = 0; i < n; ++i) {
        gate[i] = (gate[i] > 0.0f && up[i] > 0.0f) ? gate[i] * up[i] : 0.0f;
      }
      break;
    case FfnActivation::kGeluTanh:
      for (int64_t i = 0; i < n; ++i) gate[i] = GeluTanh(gate[i]) * up[i];
      break;
  }
}

}  // namespace thermocline
