// The seam where whole layers run elsewhere (a GPU): attention norm, QKV, RoPE, the KV cache,
// attention, the output projection, the FFN and both residual adds, and optionally the output
// head. Session hands a run of consecutive owned layers over in one call, so the residual stream
// crosses to the backend and back only where layers change device. The CPU path lives in
// Session and is the reference every backend is compared to.
#pragma once

#include <cstdint>

#include "absl/status/status.h"

namespace thermocline {

class LayerBackend {
 public:
  virtual ~LayerBackend() = default;

  // Whether layer `layer` (< n_layer) runs here; Owns(n_layer): the output norm and head do.
  virtual bool Owns(int64_t layer) const = 0;

  // Runs layers [first, last) on tokens at positions pos .. pos + n - 1, all owned.
  // x: (n, n_embd) the residual stream on the host, read on entry and written on return (not
  // written when `logits` is given). cos_sin: (n, rope_dim) the RoPE table Session computes.
  // With logits (only when last == n_layer and Owns(n_layer)): the output head too, logits of
  // every token (all_rows: (n, n_vocab)) or of the last one (n_vocab). The backend keeps the KV
  // cache of its layers for positions < n_ctx; positions at or past a session's Truncate point
  // are simply overwritten. Called from the session's thread; must not allocate per call.
  virtual absl::Status Forward(int64_t first, int64_t last, float* x, int64_t n, int64_t pos,
                               const float* cos_sin, float* logits, bool all_rows) = 0;
};

}  // namespace thermocline
