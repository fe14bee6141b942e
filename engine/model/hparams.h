// Hyperparameters of a llama-family model, read and checked from GGUF metadata.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "engine/gguf/gguf.h"

namespace thermocline {

// The FFN's gating nonlinearity: SwiGLU silu(gate)*up, ReGLU relu(gate)*up,
// dReLU relu(gate)*relu(up).
enum class FfnActivation { kSilu, kRelu, kDRelu };
const char* ActivationName(FfnActivation a);
// Accepts "silu"/"swiglu", "relu"/"reglu", "drelu".
absl::StatusOr<FfnActivation> ParseActivation(const std::string& name);

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

  int64_t q_dim() const { return n_head * head_dim; }
  int64_t kv_dim() const { return n_head_kv * head_dim; }

  // Reads llama.* keys; `activation_override` wins over llama.feed_forward_activation.
  static absl::StatusOr<LlamaHparams> FromGguf(const GgufFile& file,
                                               std::optional<FfnActivation> activation_override);
};

}  // namespace thermocline
