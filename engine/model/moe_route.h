// The router of a mixture-of-experts layer, shared by the dense MoE FFN (Session), the placed
// one (engine/sparse/moe_ffn.h) and what observes routing (the profiler): softmax over the
// router logits, the k most probable experts, their weights renormalised where the family does.
#pragma once

#include <cstdint>

#include "engine/model/hparams.h"

namespace thermocline {

// probs: (n, n_expert) router logits on entry, overwritten. sel, w: (n, n_expert_used) each
// token's experts (most probable first, the lower id on a tie) and their weights.
void RouteTopK(const LlamaHparams& h, float* probs, int64_t n, int32_t* sel, float* w);

}  // namespace thermocline
