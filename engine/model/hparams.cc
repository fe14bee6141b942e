#include "engine/model/hparams.h"

#include <cmath>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/util/status_macros.h"

namespace thermocline {
namespace {

// Upper bounds that no real model comes near; they keep a corrupt header from sizing buffers.
constexpr int64_t kMaxDim = 1 << 17;
constexpr int64_t kMaxLayers = 4096;
constexpr int64_t kMaxVocab = 1 << 22;
constexpr int64_t kMaxCtx = 1 << 24;
constexpr int64_t kMaxExperts = 1 << 12;

absl::Status CheckRange(const std::string& key, int64_t v, int64_t lo, int64_t hi) {
  if (v < lo || v > hi) {
    return absl::InvalidArgumentError(
        absl::StrCat("metadata ", key, " = ", v, " is out of range [", lo, ", ", hi, "]"));
  }
  return absl::OkStatus();
}

// Reads the {arch}.* keys of one file; every error names the key.
class KeyReader {
 public:
  KeyReader(const GgufFile& file, const char* arch) : f_(file), p_(absl::StrCat(arch, ".")) {}

  std::string Key(std::string_view k) const { return p_ + std::string(k); }
  absl::Status Required(std::string_view k, int64_t* out, int64_t lo, int64_t hi) const {
    auto v = f_.GetInt(Key(k));
    if (!v.ok()) return v.status();
    *out = *v;
    return CheckRange(Key(k), *out, lo, hi);
  }
  absl::Status Optional(std::string_view k, int64_t* out, int64_t lo, int64_t hi) const {
    auto v = f_.GetInt(Key(k), *out);
    if (!v.ok()) return v.status();
    *out = *v;
    return CheckRange(Key(k), *out, lo, hi);
  }
  // A positive float; `*out` keeps its value when the key is absent.
  absl::Status Positive(std::string_view k, float* out) const {
    auto v = f_.GetFloat(Key(k), *out);
    if (!v.ok()) return v.status();
    if (!(*v > 0) || !std::isfinite(*v)) {
      return absl::InvalidArgumentError(absl::StrCat(Key(k), " = ", *v, " must be positive"));
    }
    *out = static_cast<float>(*v);
    return absl::OkStatus();
  }
  absl::StatusOr<double> Float(std::string_view k) const { return f_.GetFloat(Key(k)); }
  bool Has(std::string_view k) const { return f_.Find(Key(k)) != nullptr; }
  absl::StatusOr<std::string> String(std::string_view k, std::string fallback) const {
    return f_.GetString(Key(k), std::move(fallback));
  }

 private:
  const GgufFile& f_;
  std::string p_;
};

absl::Status ReadActivation(const GgufFile& file, const ArchitectureSpec& a, const KeyReader& k,
                            std::optional<FfnActivation> override_act, LlamaHparams& h) {
  if (!a.activation_configurable) {
    h.activation = a.activation;
    if (override_act && *override_act != a.activation) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the FFN activation of ", a.name, " models is ", ActivationName(a.activation),
          "; it cannot be set to ", ActivationName(*override_act)));
    }
    return absl::OkStatus();
  }
  if (override_act) {
    h.activation = *override_act;
    return absl::OkStatus();
  }
  // PowerInfer runs ReLU llamas only, and its files do not say so.
  auto act = k.String("feed_forward_activation", file.is_powerinfer() ? "relu" : "silu");
  if (!act.ok()) return act.status();
  auto parsed = ParseActivation(*act);
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(k.Key("feed_forward_activation"), ": ", parsed.status().message()));
  }
  h.activation = *parsed;
  return absl::OkStatus();
}

absl::Status ReadRopeScaling(const KeyReader& k, const ArchitectureSpec& a, LlamaHparams& h) {
  auto type = k.String("rope.scaling.type", "linear");
  if (!type.ok()) return type.status();
  // rope.scale_linear is the key's old name.
  // A factor of 0 means none, as in llama.cpp.
  for (const char* key : {"rope.scaling.factor", "rope.scale_linear"}) {
    if (!k.Has(key)) continue;
    auto f = k.Float(key);
    if (!f.ok()) return f.status();
    if (!(*f >= 0) || !std::isfinite(*f)) {
      return absl::InvalidArgumentError(absl::StrCat(k.Key(key), " = ", *f, " must be >= 0"));
    }
    if (*f > 0) h.rope_scaling_factor = static_cast<float>(*f);
    break;
  }
  h.rope_orig_ctx = h.n_ctx_train;
  TC_RETURN_IF_ERROR(
      k.Optional("rope.scaling.original_context_length", &h.rope_orig_ctx, 1, kMaxCtx));
  TC_RETURN_IF_ERROR(k.Positive("rope.scaling.attn_factor", &h.rope_attn_factor));
  if (*type == "none") {
    h.rope_scaling = RopeScaling::kNone;
  } else if (*type == "linear") {
    h.rope_scaling = RopeScaling::kLinear;
    h.rope_freq_scale = 1.0f / h.rope_scaling_factor;
  } else if (*type == "yarn") {
    h.rope_scaling = RopeScaling::kYarn;
    h.rope_freq_scale = 1.0f / h.rope_scaling_factor;
    TC_RETURN_IF_ERROR(k.Positive("rope.scaling.yarn_beta_fast", &h.yarn_beta_fast));
    TC_RETURN_IF_ERROR(k.Positive("rope.scaling.yarn_beta_slow", &h.yarn_beta_slow));
  } else if (*type == "llama3") {
    // The factor is spread over the pairs (rope.h), not applied to positions.
    h.rope_scaling = RopeScaling::kLlama3;
    h.rope_orig_ctx = 8192;
    TC_RETURN_IF_ERROR(
        k.Optional("rope.scaling.original_context_length", &h.rope_orig_ctx, 1, kMaxCtx));
    TC_RETURN_IF_ERROR(k.Positive("rope.scaling.low_freq_factor", &h.llama3_low_freq_factor));
    TC_RETURN_IF_ERROR(k.Positive("rope.scaling.high_freq_factor", &h.llama3_high_freq_factor));
    if (!(h.llama3_high_freq_factor > h.llama3_low_freq_factor)) {
      return absl::InvalidArgumentError(
          absl::StrCat(k.Key("rope.scaling.high_freq_factor"), " must exceed low_freq_factor"));
    }
  } else if (*type == "longrope" && a.longrope_factors) {
    h.rope_scaling = RopeScaling::kLongRope;  // factors from rope_factors_long/short
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        k.Key("rope.scaling.type"), " = \"", *type, "\" is not supported (none, linear, yarn, ",
        "llama3", a.longrope_factors ? ", longrope" : "", ")"));
  }
  return absl::OkStatus();
}

absl::Status ReadExperts(const KeyReader& k, const ArchitectureSpec& a, LlamaHparams& h) {
  if (a.experts == Presence::kNever) return absl::OkStatus();
  TC_RETURN_IF_ERROR(k.Optional("expert_count", &h.n_expert, 0, kMaxExperts));
  if (a.experts == Presence::kRequired && h.n_expert == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(k.Key("expert_count"), " is missing: ", a.name, " files have experts"));
  }
  if (h.n_expert == 0) return absl::OkStatus();
  TC_RETURN_IF_ERROR(k.Required("expert_used_count", &h.n_expert_used, 1, h.n_expert));
  h.n_ff_exp = h.n_ff;
  if (a.expert_ff_key) {
    TC_RETURN_IF_ERROR(k.Optional("expert_feed_forward_length", &h.n_ff_exp, 1, 8 * kMaxDim));
  }
  if (a.shared_expert) {
    h.n_ff_shexp = h.n_ff_exp;
    TC_RETURN_IF_ERROR(
        k.Optional("expert_shared_feed_forward_length", &h.n_ff_shexp, 1, 8 * kMaxDim));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<LlamaHparams> LlamaHparams::FromGguf(
    const GgufFile& file, std::optional<FfnActivation> activation_override) {
  auto arch_name = file.GetString("general.architecture");
  if (!arch_name.ok()) return arch_name.status();
  const ArchitectureSpec* arch = FindArchitecture(*arch_name);
  if (arch == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("architecture '", *arch_name, "' is not supported (Thermocline runs ",
                     absl::StrJoin(SupportedArchitectures(), ", "), ")"));
  }
  const ArchitectureSpec& a = *arch;
  const KeyReader k(file, a.name);
  LlamaHparams h;
  h.arch = arch;
  h.rope_kind = a.rope;
  TC_RETURN_IF_ERROR(k.Required("embedding_length", &h.n_embd, 1, kMaxDim));
  TC_RETURN_IF_ERROR(k.Required("block_count", &h.n_layer, 1, kMaxLayers));
  // An MoE file may give only the experts' width.
  if (a.expert_ff_key && !k.Has("feed_forward_length")) {
    TC_RETURN_IF_ERROR(k.Required("expert_feed_forward_length", &h.n_ff, 1, 8 * kMaxDim));
  } else {
    TC_RETURN_IF_ERROR(k.Required("feed_forward_length", &h.n_ff, 1, 8 * kMaxDim));
  }
  TC_RETURN_IF_ERROR(k.Required("attention.head_count", &h.n_head, 1, kMaxDim));
  TC_RETURN_IF_ERROR(k.Required("context_length", &h.n_ctx_train, 1, kMaxCtx));

  h.n_head_kv = h.n_head;
  TC_RETURN_IF_ERROR(k.Optional("attention.head_count_kv", &h.n_head_kv, 1, h.n_head));
  if (h.n_head % h.n_head_kv != 0) {
    return absl::InvalidArgumentError(absl::StrCat(k.Key("attention.head_count"), " (", h.n_head,
                                                   ") is not a multiple of head_count_kv (",
                                                   h.n_head_kv, ")"));
  }
  if (!k.Has("attention.key_length") && h.n_embd % h.n_head != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(k.Key("embedding_length"), " (", h.n_embd, ") is not a multiple of ",
                     "head_count (", h.n_head, ") and attention.key_length is not given"));
  }
  h.head_dim = h.n_embd / h.n_head;
  TC_RETURN_IF_ERROR(k.Optional("attention.key_length", &h.head_dim, 1, kMaxDim));
  h.head_dim_v = h.head_dim;
  TC_RETURN_IF_ERROR(k.Optional("attention.value_length", &h.head_dim_v, 1, kMaxDim));
  h.rope_dim = h.head_dim;
  TC_RETURN_IF_ERROR(k.Optional("rope.dimension_count", &h.rope_dim, 0, h.head_dim));
  if (h.rope_dim <= 0 || h.rope_dim % 2 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(k.Key("rope.dimension_count"), " = ", h.rope_dim,
                                                   " must be even and at most the ", "head size ",
                                                   h.head_dim));
  }
  auto eps = file.GetFloat(k.Key("attention.layer_norm_rms_epsilon"), 1e-5);
  if (!eps.ok()) return eps.status();
  if (!(*eps > 0 && *eps < 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat(k.Key("attention.layer_norm_rms_epsilon"), " must be in (0, 1)"));
  }
  h.rms_eps = static_cast<float>(*eps);
  TC_RETURN_IF_ERROR(k.Positive("rope.freq_base", &h.rope_freq_base));
  TC_RETURN_IF_ERROR(ReadRopeScaling(k, a, h));
  TC_RETURN_IF_ERROR(ReadActivation(file, a, k, activation_override, h));
  TC_RETURN_IF_ERROR(ReadExperts(k, a, h));

  // Attention details of the family.
  const bool embd_per_head =
      a.embd_per_head_scale_layers > 0 && h.n_layer == a.embd_per_head_scale_layers;
  h.attn_scale =
      1.0f / std::sqrt(static_cast<float>(embd_per_head ? h.n_embd / h.n_head : h.head_dim));
  if (a.embed_scale_sqrt) h.embd_scale = std::sqrt(static_cast<float>(h.n_embd));
  if (a.attn_softcap > 0) {
    h.attn_softcap = a.attn_softcap;
    TC_RETURN_IF_ERROR(k.Positive("attn_logit_softcapping", &h.attn_softcap));
  }
  if (a.final_softcap > 0 || a.final_softcap_key) {
    h.final_softcap = a.final_softcap;
    if (k.Has("final_logit_softcapping")) {
      auto cap = k.Float("final_logit_softcapping");
      if (!cap.ok()) return cap.status();
      if (!(*cap >= 0) || !std::isfinite(*cap)) {
        return absl::InvalidArgumentError(
            absl::StrCat(k.Key("final_logit_softcapping"), " must be 0 (none) or positive"));
      }
      h.final_softcap = static_cast<float>(*cap);
    }
  }
  if (a.swa_period > 0) {
    h.swa_period = a.swa_period;
    h.n_swa = a.swa_default;
    TC_RETURN_IF_ERROR(k.Optional("attention.sliding_window", &h.n_swa, 0, kMaxCtx));
    if (h.n_swa > 0 && a.swa_rope_base > 0) h.rope_freq_base_swa = a.swa_rope_base;
  }

  // The vocabulary size comes from the embedding matrix; {arch}.vocab_size must agree if present.
  const GgufTensorInfo* embd = file.FindTensor("token_embd.weight");
  if (embd == nullptr) {
    return absl::InvalidArgumentError("tensor token_embd.weight is missing");
  }
  if (embd->dims.size() != 2) {
    return absl::InvalidArgumentError("tensor token_embd.weight must have 2 dimensions");
  }
  h.n_vocab = embd->dims[1];
  TC_RETURN_IF_ERROR(
      CheckRange("vocabulary size (token_embd.weight ne[1])", h.n_vocab, 1, kMaxVocab));
  int64_t vocab_key = h.n_vocab;
  TC_RETURN_IF_ERROR(k.Optional("vocab_size", &vocab_key, 0, kMaxVocab));
  if (vocab_key != h.n_vocab) {
    return absl::InvalidArgumentError(absl::StrCat(
        k.Key("vocab_size"), " = ", vocab_key, " but token_embd.weight has ", h.n_vocab, " rows"));
  }
  return h;
}

}  // namespace thermocline
