// The seam where a layer's FFN is computed. The dense path lives in Session; a sparse or
// hybrid backend (predictor → active neurons → neuron-aware operators, split between
// executors) plugs in here without the session knowing how the FFN is computed.
#pragma once

#include <cstdint>

#include "absl/status/status.h"

namespace thermocline {

class FfnBackend {
 public:
  virtual ~FfnBackend() = default;
  // out: (n_tokens, n_embd) = FFN of `layer` on xn: (n_tokens, n_embd), the input after
  // ffn_norm. x: (n_tokens, n_embd) is the same input before ffn_norm (what predictors see).
  // Called from the session's thread; the backend may use its own threads. Must not allocate.
  virtual void Forward(int layer, const float* x, const float* xn, int64_t n_tokens,
                       float* out) = 0;
  // Whether Forward computes `layer` for a batch of n_tokens; false: the session computes that
  // FFN dense over its own matrices (an input-sparse layer's exact prefill).
  virtual bool TakesFfn(int layer, int64_t n_tokens) const { return true; }

  // Attention's input projections of `layer`, when the backend computes them (an input-sparse
  // layer skips the columns of dropped entries of q/k/v's input too): q, k, v: (n_tokens,
  // q_dim / kv_dim / v_dim) from xn: (n_tokens, n_embd) after attn_norm, before biases; true.
  // false: the session computes them dense. Must not allocate.
  virtual bool ProjectQkv(int layer, const float* xn, int64_t n_tokens, float* q, float* k,
                          float* v) {
    return false;
  }

  // The host's part of a hybrid layer whose device already predicted the active neurons and
  // computes its own part: out: (n_embd) = the FFN over `active` (n_active neuron ids in the
  // backend's numbering, ascending) only, for one token of xn: (n_embd). Unimplemented unless
  // the backend splits with a device.
  virtual absl::Status ForwardListed(int layer, const float* xn, const int32_t* active,
                                     int64_t n_active, float* out) {
    return absl::UnimplementedError("this FFN backend has no host part of a hybrid layer");
  }
};

}  // namespace thermocline
