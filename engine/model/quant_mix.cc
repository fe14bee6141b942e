// llama-quantize's per-tensor type rules for the file types Thermocline writes, learned from
// llama.cpp's llama_tensor_get_type (February 2025) and checked against its files: the kit's
// stories-wide.TYPE.gguf hold exactly the types these rules give.
#include "engine/model/quant_mix.h"

#include <cstdio>

#include "absl/strings/match.h"
#include "absl/strings/str_join.h"

namespace thermocline {
namespace {

using T = GgmlType;

constexpr QuantMix kMixes[] = {
    {"f32", 0, T::kF32},        {"f16", 1, T::kF16},      {"bf16", 32, T::kBF16},
    {"q8_0", 7, T::kQ8_0},      {"q4_0", 2, T::kQ4_0},    {"q4_1", 3, T::kQ4_1},
    {"q5_0", 8, T::kQ5_0},      {"q5_1", 9, T::kQ5_1},    {"q2_k", 10, T::kQ2_K},
    {"q3_k_s", 11, T::kQ3_K},   {"q3_k_m", 12, T::kQ3_K}, {"q3_k_l", 13, T::kQ3_K},
    {"q4_k_s", 14, T::kQ4_K},   {"q4_k_m", 15, T::kQ4_K}, {"q5_k_s", 16, T::kQ5_K},
    {"q5_k_m", 17, T::kQ5_K},   {"q6_k", 18, T::kQ6_K},   {"iq4_nl", 25, T::kIQ4_NL},
    {"iq4_xs", 30, T::kIQ4_XS},
};

bool Is(const QuantMix& mix, const char* name) { return std::string_view(mix.name) == name; }

// llama.cpp's use_more_bits: the first and last eighth of the layers and every third between.
bool UseMoreBits(int64_t i, int64_t n) {
  return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2;
}

int64_t LayerOf(const std::string& name) {
  int layer = -1;
  if (std::sscanf(name.c_str(), "blk.%d.", &layer) != 1) return -1;
  return layer;
}

}  // namespace

const QuantMix* FindQuantMix(std::string_view name) {
  for (const QuantMix& m : kMixes) {
    // Any case: llama-quantize's users write Q4_K_M.
    if (absl::EqualsIgnoreCase(absl::string_view(name.data(), name.size()), m.name)) return &m;
  }
  return nullptr;
}

const QuantMix* FindQuantMixByFileType(uint32_t file_type) {
  for (const QuantMix& m : kMixes) {
    if (m.file_type == file_type) return &m;
  }
  return nullptr;
}

std::string QuantMixNames() {
  return absl::StrJoin(kMixes, ", ",
                       [](std::string* out, const QuantMix& m) { out->append(m.name); });
}

bool QuantizedByMix(const std::string& name, size_t n_dims) {
  return n_dims >= 2 && absl::EndsWith(name, "weight") &&
         !absl::StrContains(name, "_norm.weight") &&
         !absl::StrContains(name, "ffn_gate_inp.weight") && name != "position_embd.weight" &&
         name != "token_types.weight";
}

bool MixOrderLess(const std::string& a, const std::string& b) {
  const int64_t la = LayerOf(a), lb = LayerOf(b);
  if (la != lb) return la < lb;
  return a < b;
}

GgmlType TensorTypeFor(const QuantMix& mix, const MixContext& ctx, MixCounters& counters,
                       const std::string& name, int64_t cols, bool* fallback) {
  if (fallback != nullptr) *fallback = false;
  GgmlType type = mix.base;
  if (TypeInfo(type).block_size == 1) return type;  // float files: no per-tensor rules
  const bool moe8 = ctx.n_expert == 8;
  const bool iq4 = Is(mix, "iq4_nl") || Is(mix, "iq4_xs");
  if (name == "output.weight" || (!ctx.has_output && name == "token_embd.weight")) {
    if (cols % TypeInfo(type).block_size != 0) {
      type = T::kQ8_0;
    } else if (type != T::kQ8_0) {
      type = T::kQ6_K;
    }
  } else if (name == "token_embd.weight") {
    // The mixes written here keep the default type.
  } else if (absl::StrContains(name, "attn_v.weight")) {
    const int64_t i = counters.i_attention_wv, n = ctx.n_attention_wv;
    if (Is(mix, "q2_k")) {
      type = ctx.n_gqa >= 4 ? T::kQ4_K : T::kQ3_K;
    } else if (Is(mix, "q3_k_m")) {
      type = i < 2 ? T::kQ5_K : T::kQ4_K;
    } else if (Is(mix, "q3_k_l")) {
      type = T::kQ5_K;
    } else if (iq4 && ctx.n_gqa >= 4) {
      type = T::kQ5_K;
    } else if ((Is(mix, "q4_k_m") || Is(mix, "q5_k_m")) && UseMoreBits(i, n)) {
      type = T::kQ6_K;
    } else if (Is(mix, "q4_k_s") && i < 4) {
      type = T::kQ5_K;
    }
    if (moe8) type = T::kQ8_0;
    ++counters.i_attention_wv;
  } else if (absl::StrContains(name, "attn_k.weight")) {
    if (moe8) type = T::kQ8_0;
  } else if (absl::StrContains(name, "ffn_down")) {
    const int64_t i = ctx.n_expert > 1 ? LayerOf(name) : counters.i_ffn_down;
    const int64_t n = ctx.n_layer;
    if (Is(mix, "q2_k")) {
      type = T::kQ3_K;
    } else if (Is(mix, "q3_k_m")) {
      type = i < n / 16 ? T::kQ5_K : T::kQ4_K;
    } else if (Is(mix, "q3_k_l")) {
      type = T::kQ5_K;
    } else if (Is(mix, "q4_k_m")) {
      if (UseMoreBits(i, n)) type = T::kQ6_K;
    } else if (i < n / 8 && iq4) {
      type = T::kQ5_K;
    } else if (Is(mix, "q5_k_m") && UseMoreBits(i, n)) {
      type = T::kQ6_K;
    } else if (Is(mix, "q4_k_s") && i < n / 8) {
      type = T::kQ5_K;
    }
    ++counters.i_ffn_down;
  } else if (absl::StrContains(name, "attn_output.weight")) {
    if (moe8) {
      if (Is(mix, "q2_k") || Is(mix, "q3_k_s") || Is(mix, "q3_k_m") || Is(mix, "q4_k_s") ||
          Is(mix, "q4_k_m") || iq4) {
        type = T::kQ5_K;
      }
    } else if (Is(mix, "q2_k")) {
      type = T::kQ3_K;
    } else if (Is(mix, "q3_k_m")) {
      type = T::kQ4_K;
    } else if (Is(mix, "q3_k_l")) {
      type = T::kQ5_K;
    }
  } else if (absl::StrContains(name, "attn_qkv.weight")) {
    if (Is(mix, "q3_k_m") || Is(mix, "q3_k_l")) {
      type = T::kQ4_K;
    } else if (Is(mix, "q4_k_m")) {
      type = T::kQ5_K;
    } else if (Is(mix, "q5_k_m")) {
      type = T::kQ6_K;
    }
  }
  if (cols % TypeInfo(type).block_size != 0) {
    if (fallback != nullptr) *fallback = true;
    switch (type) {
      case T::kQ2_K:
      case T::kQ3_K:
      case T::kIQ4_XS:
        type = T::kIQ4_NL;
        break;
      case T::kQ4_K:
        type = T::kQ5_0;
        break;
      case T::kQ5_K:
        type = T::kQ5_1;
        break;
      case T::kQ6_K:
        type = T::kQ8_0;
        break;
      default:
        break;
    }
    if (cols % TypeInfo(type).block_size != 0) type = T::kF16;
  }
  return type;
}

}  // namespace thermocline
