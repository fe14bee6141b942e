#include "engine/model/moe_route.h"

#include <cmath>

#include "engine/model/cpu_ops.h"

namespace thermocline {

void RouteTopK(const LlamaHparams& h, float* probs, int64_t n, int32_t* sel, float* w) {
  const int64_t n_expert = h.n_expert, k = h.n_expert_used;
  for (int64_t t = 0; t < n; ++t) {
    float* p = probs + t * n_expert;
    Softmax(p, n_expert);
    int32_t* s = sel + t * k;
    float* wt = w + t * k;
    double sum = 0;
    for (int64_t j = 0; j < k; ++j) {
      int64_t best = 0;
      for (int64_t e = 1; e < n_expert; ++e) best = p[e] > p[best] ? e : best;
      s[j] = static_cast<int32_t>(best);
      wt[j] = p[best];
      sum += p[best];
      p[best] = -1.0f;  // below every probability: not chosen again
    }
    if (h.arch->expert_weights_norm) {
      const float inv = static_cast<float>(1.0 / sum);
      for (int64_t j = 0; j < k; ++j) wt[j] *= inv;
    }
  }
}

void AddSharedExpert(ThreadPool& pool, const LlamaHparams& h, const LayerWeights& L,
                     const float* xn, int64_t n, float* gate, float* up, float* eo,
                     MatMulScratch& scratch, float* out) {
  if (L.shexp_gate.data == nullptr) return;
  const int64_t d = h.n_embd;
  MatMul(pool, L.shexp_gate, xn, n, gate, scratch);
  MatMul(pool, L.shexp_up, xn, n, up, scratch);
  GatedActivation(h.activation, gate, up, n * h.n_ff_shexp);
  MatMul(pool, L.shexp_down, gate, n, eo, scratch);
  for (int64_t t = 0; t < n; ++t) {
    double g = 0;
    for (int64_t c = 0; c < d; ++c) g += static_cast<double>(L.shexp_gate_inp[c]) * xn[t * d + c];
    const float wgt = static_cast<float>(1.0 / (1.0 + std::exp(-g)));
    for (int64_t c = 0; c < d; ++c) out[t * d + c] += wgt * eo[t * d + c];
  }
}

}  // namespace thermocline
