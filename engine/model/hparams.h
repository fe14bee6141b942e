// Hyperparameters of a model of any supported family (architecture.h), read and checked from
// GGUF metadata under the family's key prefix.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "engine/gguf/gguf.h"
#include "engine/model/activation.h"
#include "engine/model/architecture.h"

namespace thermocline {

// {arch}.rope.scaling.type. kLinear covers files without the key (a factor, if any, divides
// positions); kNone ignores the factor.
enum class RopeScaling { kNone, kLinear, kYarn, kLlama3, kLongRope };

struct LlamaHparams {
  int64_t n_vocab = 0;
  int64_t n_ctx_train = 0;
  int64_t n_embd = 0;
  int64_t n_layer = 0;
  int64_t n_ff = 0;
  int64_t n_head = 0;
  int64_t n_head_kv = 0;
  int64_t head_dim = 0;
  int64_t rope_dim = 0;  // leading dims of each head that RoPE rotates
  float rms_eps = 1e-5f;
  float rope_freq_base = 10000.0f;
  float rope_freq_scale = 1.0f;
  FfnActivation activation = FfnActivation::kSilu;

  // Beyond the llama computation (the defaults are llama's). head_dim above is the key length.
  const ArchitectureSpec* arch = nullptr;  // set by FromGguf
  RopeKind rope_kind = RopeKind::kAdjacent;
  int64_t head_dim_v = 0;   // {arch}.attention.value_length (default head_dim)
  float attn_scale = 0;     // scores = attn_scale · q·k; 1/sqrt(head_dim) unless the family says
  float embd_scale = 1.0f;  // token embeddings are multiplied by it (Gemma: sqrt(n_embd))
  float attn_softcap = 0;   // > 0: scores become c·tanh(s / c) before the softmax
  float final_softcap = 0;  // > 0: logits become c·tanh(l / c)
  int64_t n_swa = 0;        // sliding window in positions; 0: every layer attends to all
  int swa_period = 0;       // which layers slide (ArchitectureSpec::swa_period)
  float rope_freq_base_swa = 0;  // RoPE base of sliding layers (unscaled); 0: as the others
  RopeScaling rope_scaling = RopeScaling::kLinear;
  float rope_scaling_factor = 1.0f;  // {arch}.rope.scaling.factor (context multiple)
  int64_t rope_orig_ctx = 0;         // rope.scaling.original_context_length (default n_ctx_train)
  float rope_attn_factor = 1.0f;     // rope.scaling.attn_factor: multiplies cos and sin
  float yarn_beta_fast = 32.0f;      // YaRN's correction range, in rotations over orig_ctx
  float yarn_beta_slow = 1.0f;
  float llama3_low_freq_factor = 1.0f;   // rope.scaling.low_freq_factor (llama3)
  float llama3_high_freq_factor = 4.0f;  // rope.scaling.high_freq_factor (llama3)
  // Mixture of experts (every layer when n_expert > 0).
  int64_t n_expert = 0;
  int64_t n_expert_used = 0;
  int64_t n_ff_exp = 0;    // width of one expert
  int64_t n_ff_shexp = 0;  // width of the shared expert (qwen2moe), 0: none

  int64_t q_dim() const { return n_head * head_dim; }
  int64_t kv_dim() const { return n_head_kv * head_dim; }  // K rows; V rows too when v == k
  int64_t v_dim() const { return n_head_kv * head_dim_v; }
  int64_t o_dim() const { return n_head * head_dim_v; }  // attention output, attn_output's input
  bool is_moe() const { return n_expert > 0; }
  // Whether layer `l` attends to the last n_swa positions only.
  bool LayerSlides(int64_t l) const {
    return n_swa > 0 && swa_period > 0 && (swa_period == 1 || l % swa_period < swa_period - 1);
  }
  // Reads the keys of general.architecture's family; `activation_override` wins over
  // llama.feed_forward_activation (families with a fixed activation refuse a different one).
  static absl::StatusOr<LlamaHparams> FromGguf(const GgufFile& file,
                                               std::optional<FfnActivation> activation_override);
};

}  // namespace thermocline
