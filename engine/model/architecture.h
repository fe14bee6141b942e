// The model families Thermocline runs, each as one row of a table: what `general.architecture`
// names, which tensors and keys the family has, and which parts of the llama forward pass it
// changes. The loader (llama_model.cc, hparams.cc) and the forward pass (session.cc) read these
// rows; adding a family adds a row, not a code path.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "engine/model/activation.h"

namespace thermocline {

// Which pairs of a head's dimensions RoPE rotates together.
enum class RopeKind {
  kAdjacent,  // (2i, 2i + 1): llama
  kNeox,      // (i, i + rope_dim / 2): GPT-NeoX, qwen2, gemma, phi3
};

// Whether an optional group of tensors may, must or must not be in a file of the family.
enum class Presence { kNever, kOptional, kRequired };

struct ArchitectureSpec {
  // general.architecture; also the prefix of the family's keys ("qwen2.block_count").
  const char* name = "";
  RopeKind rope = RopeKind::kAdjacent;
  // The FFN's nonlinearity, and whether {arch}.feed_forward_activation or the caller may
  // change it (llama only: its ReLU fine-tunes say so there).
  FfnActivation activation = FfnActivation::kSilu;
  bool activation_configurable = false;

  // blk.N.attn_{q,k,v}.bias (q_dim / kv_dim / v_dim) and blk.N.attn_output.bias (n_embd).
  Presence qkv_bias = Presence::kNever;
  Presence output_bias = Presence::kNever;
  // blk.N.attn_q_norm / attn_k_norm (head_dim): RMSNorm of each head of Q and K before RoPE.
  Presence qk_norm = Presence::kNever;
  // blk.N.post_attention_norm / post_ffw_norm (n_embd): RMSNorm of the attention and FFN
  // outputs before their residual adds.
  bool post_norms = false;
  // blk.N.attn_qkv (q_dim + 2 kv_dim rows, Q then K then V) instead of attn_q/k/v; kOptional:
  // either form.
  Presence fused_qkv = Presence::kNever;
  // blk.N.ffn_up holds 2 n_ff rows, the gate's then the up's, and there is no ffn_gate.
  bool fused_gate_up = false;
  // rope_freqs.weight (rope_dim / 2): each pair's angle divided by its factor (Llama 3.1+).
  bool rope_freqs = false;
  // rope_factors_long / rope_factors_short.weight with {arch}.rope.scaling.type = longrope.
  bool longrope_factors = false;

  // Mixture of experts: {arch}.expert_count / expert_used_count, router blk.N.ffn_gate_inp,
  // experts blk.N.ffn_{gate,up,down}_exps (3-D). kOptional: MoE when expert_count > 0.
  Presence experts = Presence::kNever;
  // The top-k router weights renormalised to sum 1 (Mixtral); else the softmax's own (Qwen MoE).
  bool expert_weights_norm = false;
  // blk.N.ffn_{gate,up,down}_shexp, scaled by sigmoid(blk.N.ffn_gate_inp_shexp · x).
  bool shared_expert = false;
  // Width of one expert: {arch}.expert_feed_forward_length, else feed_forward_length.
  bool expert_ff_key = false;

  // Token embeddings multiplied by sqrt(n_embd) (Gemma).
  bool embed_scale_sqrt = false;
  // Soft-capping c·tanh(s / c) of attention scores and final logits, with the family's default
  // caps, each replaced by {arch}.attn_logit_softcapping / final_logit_softcapping when present;
  // 0: the family caps nothing unless the key says so (final_softcap_key).
  float attn_softcap = 0;
  float final_softcap = 0;
  bool final_softcap_key = false;
  // Sliding-window attention over {arch}.attention.sliding_window positions (default
  // swa_default): 0 none; 1 every layer; p > 1 layers l with l % p < p - 1 (Gemma 2: even
  // layers; Gemma 3: five local layers, then one global).
  int swa_period = 0;
  int64_t swa_default = 0;
  // RoPE base of the sliding layers (Gemma 3: 10000, unscaled); 0: the same as the others.
  float swa_rope_base = 0;
  // Attention scale 1/sqrt(n_embd / n_head) instead of 1/sqrt(head_dim) for files of this many
  // layers (the 27B Gemmas, whose query_pre_attn_scalar is n_embd / n_head); 0: never.
  int64_t embd_per_head_scale_layers = 0;
};

// The row for general.architecture = name; nullptr when the family is not supported.
const ArchitectureSpec* FindArchitecture(std::string_view name);
// Every supported general.architecture, in the table's order.
std::vector<std::string> SupportedArchitectures();

}  // namespace thermocline
