// The router of a mixture-of-experts layer, shared by the dense MoE FFN (Session), the placed
// one (engine/sparse/moe_ffn.h) and what observes routing (the profiler): softmax over the
// router logits, the k most probable experts, their weights renormalised where the family does.
#pragma once

#include <cstdint>

#include "engine/model/hparams.h"
#include "engine/model/llama_model.h"
#include "engine/ops/matmul.h"
#include "engine/util/thread_pool.h"

namespace thermocline {

// probs: (n, n_expert) router logits on entry, overwritten. sel, w: (n, n_expert_used) each
// token's experts (most probable first, the lower id on a tie) and their weights.
void RouteTopK(const LlamaHparams& h, float* probs, int64_t n, int32_t* sel, float* w);

// out: (n, n_embd) += the shared expert of layer L (Qwen2-MoE's) on xn, each token's output
// scaled by its sigmoid gate; nothing when the layer has none. gate, up: (n, n_ff_shexp) and
// eo: (n, n_embd) scratch.
void AddSharedExpert(ThreadPool& pool, const LlamaHparams& h, const LayerWeights& L,
                     const float* xn, int64_t n, float* gate, float* up, float* eo,
                     MatMulScratch& scratch, float* out);

}  // namespace thermocline
