// The file types of llama.cpp's llama-quantize ("q4_k_m", "q3_k_s", ...): each a default weight
// type and a rule per tensor (llama.cpp's llama_tensor_get_type, without an importance matrix)
// that keeps the tensors quantization hurts most at more bits. docs/types.md lists the mixes.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "engine/ops/ggml_types.h"

namespace thermocline {

struct QuantMix {
  const char* name;    // as llama-quantize names it, lower case: "q4_k_m"
  uint32_t file_type;  // llama.cpp's general.file_type (enum llama_ftype)
  GgmlType base;       // the type of every 2-D weight the rules leave alone
};

// The mix of that name in any case ("q4_k_m", "Q4_K_M"); nullptr for a name that is not a mix
// Thermocline writes.
const QuantMix* FindQuantMix(std::string_view name);
// The mix a file's general.file_type names; nullptr for one Thermocline does not write.
const QuantMix* FindQuantMixByFileType(uint32_t file_type);
// "f32, f16, bf16, q8_0, ..." for messages.
std::string QuantMixNames();

// What the rules need to know about the model and where a tensor stands in llama-quantize's
// order (tensors sorted by layer, then name).
struct MixContext {
  int64_t n_layer = 0;
  int64_t n_gqa = 1;  // attention heads per KV head
  int64_t n_expert = 1;
  bool has_output = true;      // output.weight exists (else the head is tied to token_embd)
  int64_t n_attention_wv = 0;  // attn_v (attn_qkv, attn_kv_b) tensors in the file
};
struct MixCounters {  // advanced by TensorTypeFor, in llama-quantize's order
  int64_t i_attention_wv = 0;
  int64_t i_ffn_down = 0;
};

// The type llama-quantize gives the 2-D weight `name` whose rows hold `cols` elements, including
// its fallback when the type's blocks do not divide the rows (K-quants to Q5_0/Q5_1/Q8_0/IQ4_NL,
// then F16; *fallback, when given, says whether it did).
GgmlType TensorTypeFor(const QuantMix& mix, const MixContext& ctx, MixCounters& counters,
                       const std::string& name, int64_t cols, bool* fallback = nullptr);

// Whether llama-quantize quantizes the tensor at all: 2-D or more, named *weight, not a norm
// nor an expert router.
bool QuantizedByMix(const std::string& name, size_t n_dims);

// llama-quantize's tensor order: by layer number ("blk.N."; others first), then name.
bool MixOrderLess(const std::string& a, const std::string& b);

}  // namespace thermocline
