// The table of supported families. Facts per family are those of the GGUF files llama.cpp's
// converters write (key names, tensor names, which tensors are optional).
#include "engine/model/architecture.h"

namespace thermocline {
namespace {

ArchitectureSpec Llama() {
  ArchitectureSpec a;
  a.name = "llama";
  a.activation_configurable = true;
  a.qkv_bias = Presence::kOptional;
  a.output_bias = Presence::kOptional;
  a.rope_freqs = true;
  a.experts = Presence::kOptional;  // Mixtral and other llama-layout MoE files
  a.expert_weights_norm = true;
  return a;
}

ArchitectureSpec Qwen2() {
  ArchitectureSpec a;
  a.name = "qwen2";
  a.rope = RopeKind::kNeox;
  a.qkv_bias = Presence::kRequired;
  return a;
}

ArchitectureSpec Qwen2Moe() {
  ArchitectureSpec a = Qwen2();
  a.name = "qwen2moe";
  a.experts = Presence::kRequired;
  a.expert_weights_norm = false;
  a.shared_expert = true;
  a.expert_ff_key = true;
  return a;
}

ArchitectureSpec Qwen3() {
  ArchitectureSpec a;
  a.name = "qwen3";
  a.rope = RopeKind::kNeox;
  a.qk_norm = Presence::kRequired;
  return a;
}

ArchitectureSpec Qwen3Moe() {
  ArchitectureSpec a = Qwen3();
  a.name = "qwen3moe";
  a.experts = Presence::kRequired;
  a.expert_weights_norm = true;
  a.expert_ff_key = true;
  return a;
}

ArchitectureSpec Gemma2() {
  ArchitectureSpec a;
  a.name = "gemma2";
  a.rope = RopeKind::kNeox;
  a.activation = FfnActivation::kGeluTanh;
  a.post_norms = true;
  a.embed_scale_sqrt = true;
  a.attn_softcap = 50.0f;
  a.final_softcap = 30.0f;
  a.final_softcap_key = true;
  a.swa_period = 2;
  a.swa_default = 4096;
  a.embd_per_head_scale_layers = 46;
  return a;
}

ArchitectureSpec Gemma3() {
  ArchitectureSpec a;
  a.name = "gemma3";
  a.rope = RopeKind::kNeox;
  a.activation = FfnActivation::kGeluTanh;
  a.post_norms = true;
  a.qk_norm = Presence::kRequired;
  a.embed_scale_sqrt = true;
  a.final_softcap_key = true;
  a.swa_period = 6;
  a.swa_rope_base = 10000.0f;
  a.embd_per_head_scale_layers = 62;
  return a;
}

ArchitectureSpec Phi3() {
  ArchitectureSpec a;
  a.name = "phi3";
  a.rope = RopeKind::kNeox;
  a.fused_qkv = Presence::kOptional;
  a.fused_gate_up = true;
  a.longrope_factors = true;
  a.swa_period = 1;
  return a;
}

const std::vector<ArchitectureSpec>& Table() {
  static const std::vector<ArchitectureSpec> table = {
      Llama(), Qwen2(), Qwen2Moe(), Qwen3(), Qwen3Moe(), Gemma2(), Gemma3(), Phi3(),
  };
  return table;
}

}  // namespace

const ArchitectureSpec* FindArchitecture(std::string_view name) {
  for (const ArchitectureSpec& a : Table()) {
    if (std::string_view(a.name) == name) return &a;
  }
  return nullptr;
}

std::vector<std::string> SupportedArchitectures() {
  std::vector<std::string> names;
  for (const ArchitectureSpec& a : Table()) names.emplace_back(a.name);
  return names;
}

}  // namespace thermocline
