#include "engine/model/hparams.h"

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace thermocline {
namespace {

// Upper bounds that no real llama comes near; they keep a corrupt header from sizing buffers.
constexpr int64_t kMaxDim = 1 << 17;
constexpr int64_t kMaxLayers = 4096;
constexpr int64_t kMaxVocab = 1 << 22;
constexpr int64_t kMaxCtx = 1 << 24;

absl::Status CheckRange(const std::string& key, int64_t v, int64_t lo, int64_t hi) {
  if (v < lo || v > hi) {
    return absl::InvalidArgumentError(
        absl::StrCat("metadata ", key, " = ", v, " is out of range [", lo, ", ", hi, "]"));
  }
  return absl::OkStatus();
}

}  // namespace

const char* ActivationName(FfnActivation a) {
  switch (a) {
    case FfnActivation::kSilu:
      return "silu";
    case FfnActivation::kRelu:
      return "relu";
    case FfnActivation::kDRelu:
      return "drelu";
  }
  return "?";
}

absl::StatusOr<FfnActivation> ParseActivation(const std::string& name) {
  const std::string n = absl::AsciiStrToLower(name);
  if (n == "silu" || n == "swiglu" || n == "swish") return FfnActivation::kSilu;
  if (n == "relu" || n == "reglu") return FfnActivation::kRelu;
  if (n == "drelu") return FfnActivation::kDRelu;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown FFN activation '", name, "' (expected silu, relu or drelu)"));
}

absl::StatusOr<LlamaHparams> LlamaHparams::FromGguf(
    const GgufFile& file, std::optional<FfnActivation> activation_override) {
  auto arch = file.GetString("general.architecture");
  if (!arch.ok()) return arch.status();
  if (*arch != "llama") {
    return absl::InvalidArgumentError(absl::StrCat(
        "architecture '", *arch, "' is not supported (Thermocline runs 'llama' models)"));
  }
  const std::string p = "llama.";
  LlamaHparams h;
  auto get = [&](const char* key, int64_t* out, int64_t lo, int64_t hi) -> absl::Status {
    auto v = file.GetInt(p + key);
    if (!v.ok()) return v.status();
    *out = *v;
    return CheckRange(p + key, *out, lo, hi);
  };
  absl::Status s;
  if (!(s = get("embedding_length", &h.n_embd, 1, kMaxDim)).ok()) return s;
  if (!(s = get("block_count", &h.n_layer, 1, kMaxLayers)).ok()) return s;
  if (!(s = get("feed_forward_length", &h.n_ff, 1, 8 * kMaxDim)).ok()) return s;
  if (!(s = get("attention.head_count", &h.n_head, 1, kMaxDim)).ok()) return s;
  if (!(s = get("context_length", &h.n_ctx_train, 1, kMaxCtx)).ok()) return s;

  auto kv = file.GetInt(p + "attention.head_count_kv", h.n_head);
  if (!kv.ok()) return kv.status();
  h.n_head_kv = *kv;
  if (!(s = CheckRange(p + "attention.head_count_kv", h.n_head_kv, 1, h.n_head)).ok()) return s;
  if (h.n_head % h.n_head_kv != 0) {
    return absl::InvalidArgumentError(absl::StrCat("llama.attention.head_count (", h.n_head,
                                                   ") is not a multiple of head_count_kv (",
                                                   h.n_head_kv, ")"));
  }
  if (h.n_embd % h.n_head != 0) {
    return absl::InvalidArgumentError(absl::StrCat("llama.embedding_length (", h.n_embd,
                                                   ") is not a multiple of head_count (", h.n_head,
                                                   ")"));
  }
  h.head_dim = h.n_embd / h.n_head;
  auto key_len = file.GetInt(p + "attention.key_length", h.head_dim);
  if (!key_len.ok()) return key_len.status();
  if (*key_len != h.head_dim) {
    return absl::InvalidArgumentError(absl::StrCat("llama.attention.key_length = ", *key_len,
                                                   " differs from embedding_length / "
                                                   "head_count = ",
                                                   h.head_dim, "; such models are not supported"));
  }
  auto rope_dim = file.GetInt(p + "rope.dimension_count", h.head_dim);
  if (!rope_dim.ok()) return rope_dim.status();
  h.rope_dim = *rope_dim;
  if (h.rope_dim <= 0 || h.rope_dim > h.head_dim || h.rope_dim % 2 != 0) {
    return absl::InvalidArgumentError(absl::StrCat("llama.rope.dimension_count = ", h.rope_dim,
                                                   " must be even and at most the head size ",
                                                   h.head_dim));
  }
  auto eps = file.GetFloat(p + "attention.layer_norm_rms_epsilon", 1e-5);
  if (!eps.ok()) return eps.status();
  if (!(*eps > 0 && *eps < 1)) {
    return absl::InvalidArgumentError("llama.attention.layer_norm_rms_epsilon must be in (0, 1)");
  }
  h.rms_eps = static_cast<float>(*eps);
  auto base = file.GetFloat(p + "rope.freq_base", 10000.0);
  if (!base.ok()) return base.status();
  if (!(*base > 0)) return absl::InvalidArgumentError("llama.rope.freq_base must be positive");
  h.rope_freq_base = static_cast<float>(*base);
  auto scale = file.GetFloat(p + "rope.scaling.factor", 1.0);
  if (!scale.ok()) return scale.status();
  if (*scale > 0) h.rope_freq_scale = static_cast<float>(1.0 / *scale);

  if (activation_override) {
    h.activation = *activation_override;
  } else {
    // PowerInfer runs ReLU llamas only, and its files do not say so.
    auto act =
        file.GetString(p + "feed_forward_activation", file.is_powerinfer() ? "relu" : "silu");
    if (!act.ok()) return act.status();
    auto parsed = ParseActivation(*act);
    if (!parsed.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("llama.feed_forward_activation: ", parsed.status().message()));
    }
    h.activation = *parsed;
  }

  // The vocabulary size comes from the embedding matrix; llama.vocab_size must agree if present.
  const GgufTensorInfo* embd = file.FindTensor("token_embd.weight");
  if (embd == nullptr) {
    return absl::InvalidArgumentError("tensor token_embd.weight is missing");
  }
  if (embd->dims.size() != 2) {
    return absl::InvalidArgumentError("tensor token_embd.weight must have 2 dimensions");
  }
  h.n_vocab = embd->dims[1];
  if (!(s = CheckRange("vocabulary size (token_embd.weight ne[1])", h.n_vocab, 1, kMaxVocab))
           .ok()) {
    return s;
  }
  auto vocab_key = file.GetInt(p + "vocab_size", h.n_vocab);
  if (!vocab_key.ok()) return vocab_key.status();
  if (*vocab_key != h.n_vocab) {
    return absl::InvalidArgumentError(absl::StrCat(
        "llama.vocab_size = ", *vocab_key, " but token_embd.weight has ", h.n_vocab, " rows"));
  }
  return h;
}

}  // namespace thermocline
