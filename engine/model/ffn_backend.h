// The seam where a layer's FFN is computed. The dense path lives in Session; a sparse or
// hybrid backend (predictor → active neurons → neuron-aware operators, split between
// executors) plugs in here without the session knowing how the FFN is computed.
#pragma once

#include <cstdint>

namespace thermocline {

class FfnBackend {
 public:
  virtual ~FfnBackend() = default;
  // out: (n_tokens, n_embd) = FFN of `layer` on xn: (n_tokens, n_embd), the input after
  // ffn_norm. x: (n_tokens, n_embd) is the same input before ffn_norm (what predictors see).
  // Called from the session's thread; the backend may use its own threads. Must not allocate.
  virtual void Forward(int layer, const float* x, const float* xn, int64_t n_tokens,
                       float* out) = 0;
};

}  // namespace thermocline
