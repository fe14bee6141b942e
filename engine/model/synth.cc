#include "engine/model/synth.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/gguf/gguf.h"
#include "engine/ops/kernels.h"

namespace thermocline {
namespace {

// splitmix64: a fast, well-mixed generator seeded per row, so output is independent of the
// number of threads.
struct SplitMix {
  uint64_t state;
  uint64_t Next() {
    uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  float Uniform() { return static_cast<float>(Next() >> 40) * (1.0f / 16777216.0f) * 2.0f - 1.0f; }
};

// A (rows, cols) matrix of uniform values with standard deviation 1/sqrt(cols), in `type`.
std::vector<uint8_t> RandomMatrix(int64_t rows, int64_t cols, GgmlType type, uint64_t seed,
                                  ThreadPool& pool) {
  const size_t row_bytes = RowBytes(type, cols);
  std::vector<uint8_t> out(row_bytes * rows);
  const TypeKernels* k = KernelsFor(type);
  const float amplitude = std::sqrt(3.0f / static_cast<float>(cols));
  std::vector<std::vector<float>> tmp(pool.size(), std::vector<float>(cols));
  pool.ParallelFor(rows, 64, [&](int thread, int64_t begin, int64_t end) {
    float* buf = tmp[thread].data();
    for (int64_t r = begin; r < end; ++r) {
      SplitMix rng{seed * 0x100000001b3ull + static_cast<uint64_t>(r)};
      for (int64_t c = 0; c < cols; ++c) buf[c] = rng.Uniform() * amplitude;
      k->from_float(buf, out.data() + r * row_bytes, cols);
    }
  });
  return out;
}

}  // namespace

absl::Status SynthesizeModel(const SynthOptions& o, const std::string& path, ThreadPool& pool) {
  if (o.n_layer < 1 || o.n_embd < 1 || o.n_ff < 1 || o.n_head < 1 || o.n_head_kv < 1 ||
      o.n_vocab < 260 || o.n_ctx < 1) {
    return absl::InvalidArgumentError(
        "synth: layers, embd, ff, heads, kv-heads and ctx must be positive; vocab at least 260");
  }
  if (o.n_embd % o.n_head != 0 || o.n_head % o.n_head_kv != 0 || (o.n_embd / o.n_head) % 2 != 0) {
    return absl::InvalidArgumentError(
        "synth: embd must be a multiple of heads with an even head size, and heads a multiple "
        "of kv-heads");
  }
  if (KernelsFor(o.type) == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("synth: unsupported type ", TypeName(o.type)));
  }
  const int64_t block = TypeInfo(o.type).block_size;
  if (o.n_embd % block != 0 || o.n_ff % block != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("synth: embd and ff must be multiples of ", block, " for ", TypeName(o.type)));
  }
  const int64_t head_dim = o.n_embd / o.n_head;

  GgufWriter w;
  w.SetString("general.architecture", "llama");
  w.SetString("general.name", "thermocline-synth");
  w.SetUint32("llama.context_length", static_cast<uint32_t>(o.n_ctx));
  w.SetUint32("llama.embedding_length", static_cast<uint32_t>(o.n_embd));
  w.SetUint32("llama.block_count", static_cast<uint32_t>(o.n_layer));
  w.SetUint32("llama.feed_forward_length", static_cast<uint32_t>(o.n_ff));
  w.SetUint32("llama.attention.head_count", static_cast<uint32_t>(o.n_head));
  w.SetUint32("llama.attention.head_count_kv", static_cast<uint32_t>(o.n_head_kv));
  w.SetUint32("llama.rope.dimension_count", static_cast<uint32_t>(head_dim));
  w.SetFloat32("llama.attention.layer_norm_rms_epsilon", 1e-5f);
  w.SetFloat32("llama.rope.freq_base", 10000.0f);
  w.SetString("llama.feed_forward_activation", ActivationName(o.activation));

  // A SentencePiece-style vocabulary: unk, bos, eos, the 256 byte tokens, then filler pieces.
  std::vector<std::string> tokens = {"<unk>", "<s>", "</s>"};
  std::vector<double> scores = {0, 0, 0};
  std::vector<int64_t> types = {2, 3, 3};
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    tokens.push_back(name);
    scores.push_back(0);
    types.push_back(6);
  }
  for (int64_t i = static_cast<int64_t>(tokens.size()); i < o.n_vocab; ++i) {
    tokens.push_back(absl::StrCat("\xe2\x96\x81t", i));
    scores.push_back(-static_cast<double>(i));
    types.push_back(1);
  }
  w.SetString("tokenizer.ggml.model", "llama");
  w.Set("tokenizer.ggml.tokens", GgufValue::StringArray(std::move(tokens)));
  w.Set("tokenizer.ggml.scores", GgufValue::FloatArray(GgufValueType::kFloat32, std::move(scores)));
  w.Set("tokenizer.ggml.token_type", GgufValue::IntArray(GgufValueType::kInt32, std::move(types)));
  w.SetUint32("tokenizer.ggml.bos_token_id", 1);
  w.SetUint32("tokenizer.ggml.eos_token_id", 2);
  w.SetUint32("tokenizer.ggml.unknown_token_id", 0);

  uint64_t seed = o.seed;
  auto add_matrix = [&](const std::string& name, int64_t rows, int64_t cols) {
    return w.AddTensorCopy(name, o.type, {cols, rows},
                           RandomMatrix(rows, cols, o.type, ++seed, pool));
  };
  auto add_ones = [&](const std::string& name) {
    std::vector<uint8_t> bytes(o.n_embd * sizeof(float));
    const float one = 1.0f;
    for (int64_t i = 0; i < o.n_embd; ++i) std::memcpy(bytes.data() + i * 4, &one, 4);
    return w.AddTensorCopy(name, GgmlType::kF32, {o.n_embd}, std::move(bytes));
  };
  absl::Status s = add_matrix("token_embd.weight", o.n_vocab, o.n_embd);
  for (int64_t l = 0; l < o.n_layer && s.ok(); ++l) {
    const std::string b = absl::StrCat("blk.", l, ".");
    if (s.ok()) s = add_ones(b + "attn_norm.weight");
    if (s.ok()) s = add_matrix(b + "attn_q.weight", o.n_embd, o.n_embd);
    if (s.ok()) s = add_matrix(b + "attn_k.weight", o.n_head_kv * head_dim, o.n_embd);
    if (s.ok()) s = add_matrix(b + "attn_v.weight", o.n_head_kv * head_dim, o.n_embd);
    if (s.ok()) s = add_matrix(b + "attn_output.weight", o.n_embd, o.n_embd);
    if (s.ok()) s = add_ones(b + "ffn_norm.weight");
    if (s.ok()) s = add_matrix(b + "ffn_gate.weight", o.n_ff, o.n_embd);
    if (s.ok()) s = add_matrix(b + "ffn_up.weight", o.n_ff, o.n_embd);
    if (s.ok()) s = add_matrix(b + "ffn_down.weight", o.n_embd, o.n_ff);
  }
  if (s.ok()) s = add_ones("output_norm.weight");
  if (s.ok()) s = add_matrix("output.weight", o.n_vocab, o.n_embd);
  if (!s.ok()) return s;
  return w.Write(path);
}

}  // namespace thermocline
