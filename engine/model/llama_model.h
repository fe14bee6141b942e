// A loaded model of any supported family (architecture.h): hyperparameters, weights (views into
// the memory-mapped GGUF, never copied except small norm and bias vectors) and tokenizer.
// Immutable after Load, so any number of sessions may share it across threads.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/gguf/gguf.h"
#include "engine/model/hparams.h"
#include "engine/ops/matmul.h"
#include "engine/tokenizer/tokenizer.h"
#include "engine/util/huge_pages.h"

namespace thermocline {

struct ModelOptions {
  std::optional<FfnActivation> activation;  // overrides llama.feed_forward_activation
};

// What a file's metadata and tensor table say about whether it can run, learnt without reading
// weights (LlamaModel::CheckSupported).
struct ModelSupport {
  std::string architecture;           // general.architecture
  std::vector<std::string> warnings;  // what would load but deserves a word to the user
};

struct LayerWeights {
  std::vector<float> attn_norm;  // (n_embd)
  WeightView wq;                 // (q_dim, n_embd)
  WeightView wk;                 // (kv_dim, n_embd)
  WeightView wv;                 // (kv_dim, n_embd)
  WeightView wo;                 // (n_embd, q_dim)
  std::vector<float> ffn_norm;   // (n_embd)
  WeightView ffn_gate;           // (n_ff, n_embd)
  WeightView ffn_up;             // (n_ff, n_embd)
  WeightView ffn_down;           // (n_embd, n_ff)
  // Carried by PowerInfer files (data == nullptr when absent): down transposed, and the
  // predictor fc2·relu(fc1·xn), active where the logit > sparse_threshold().
  WeightView ffn_down_t;  // (n_ff, n_embd)
  WeightView pred_fc1;    // (rank, n_embd)
  WeightView pred_fc2;    // (n_ff, rank)

  // What families beyond llama add (empty / data == nullptr when the layer has none). Fused
  // tensors (phi3's attn_qkv, and ffn_up holding gate then up) are bound as the views above,
  // each a range of the fused tensor's rows.
  std::vector<float> bq, bk, bv;      // (q_dim), (kv_dim), (v_dim): added to Q, K, V
  std::vector<float> bo;              // (n_embd): added to the attention output projection
  std::vector<float> q_norm;          // (head_dim): RMSNorm weight of each head of Q, before RoPE
  std::vector<float> k_norm;          // (head_dim): the same for K
  std::vector<float> post_attn_norm;  // (n_embd): RMSNorm of attn_output's result (Gemma)
  std::vector<float> post_ffn_norm;   // (n_embd): RMSNorm of the FFN's result (Gemma)
  // Mixture of experts: the router and each expert's matrices, views into the 3-D tensors
  // blk.N.ffn_{gate,up,down}_exps (expert e: rows e·n_ff_exp ... of gate and up, e·n_embd ...
  // of down). ffn_gate/ffn_up/ffn_down above are empty in such a layer.
  WeightView ffn_gate_inp;              // (n_expert, n_embd): router logits
  std::vector<WeightView> expert_gate;  // n_expert of (n_ff_exp, n_embd)
  std::vector<WeightView> expert_up;    // n_expert of (n_ff_exp, n_embd)
  std::vector<WeightView> expert_down;  // n_expert of (n_embd, n_ff_exp)
  // The shared expert (qwen2moe), always run, scaled by sigmoid(shexp_gate_inp · xn).
  WeightView shexp_gate;              // (n_ff_shexp, n_embd)
  WeightView shexp_up;                // (n_ff_shexp, n_embd)
  WeightView shexp_down;              // (n_embd, n_ff_shexp)
  std::vector<float> shexp_gate_inp;  // (n_embd)

  bool is_moe() const { return ffn_gate_inp.data != nullptr; }
};

class LlamaModel {
 public:
  static absl::StatusOr<std::unique_ptr<LlamaModel>> Load(const std::string& path,
                                                          const ModelOptions& options = {});
  // Takes an already opened file (tests build models in memory).
  static absl::StatusOr<std::unique_ptr<LlamaModel>> FromGguf(std::unique_ptr<GgufFile> file,
                                                              const ModelOptions& options = {});

  const LlamaHparams& hparams() const { return hparams_; }
  const Tokenizer& tokenizer() const { return *tokenizer_; }
  // Whether `file` would load with `options`, from its metadata and tensor table alone (no
  // weight is read or converted beyond small vectors): the architecture and tokenizer are
  // supported and every tensor the family needs is there in a computable type and shape. The
  // error names what is not supported. Cheap enough for a registration request.
  static absl::StatusOr<ModelSupport> CheckSupported(const GgufFile& file,
                                                     const ModelOptions& options = {});

  const GgufFile& gguf() const { return *file_; }
  const std::vector<LayerWeights>& layers() const { return layers_; }
  const WeightView& token_embd() const { return token_embd_; }
  const WeightView& output() const { return output_; }  // token_embd when tied
  const std::vector<float>& output_norm() const { return output_norm_; }
  const ArchitectureSpec& architecture() const { return *hparams_.arch; }
  // Per-pair divisors of RoPE angles from the file (rope_freqs.weight, or LongRoPE's long or
  // short factors for a context of n_ctx positions); empty when the file has none.
  absl::Span<const float> rope_factors(int64_t n_ctx) const;
  // What loading noticed but did not refuse (e.g. a BPE vocabulary without a pre-tokenizer
  // name), for the caller to log.
  const std::vector<std::string>& warnings() const { return warnings_; }
  // Bytes of all weight matrices that a dense decode step reads.
  uint64_t weight_bytes() const { return weight_bytes_; }
  // Writes row `token` of the embedding matrix as floats into out (n_embd).
  void Embed(int32_t token, float* out) const;
  // A PowerInfer file's predictors (blk.N.fc1/fc2 in every layer) and their threshold
  // (powerinfer.sparse_threshold, default 0).
  bool carries_predictors() const { return carries_predictors_; }
  float sparse_threshold() const { return sparse_threshold_; }

 private:
  LlamaModel() = default;
  // Binds every tensor; check_only skips building PowerInfer's ffn_down from ffn_down_t.
  absl::Status Bind(const GgufFile& f, bool check_only);

  std::unique_ptr<GgufFile> file_;
  LlamaHparams hparams_;
  std::unique_ptr<Tokenizer> tokenizer_;
  WeightView token_embd_;
  WeightView output_;
  std::vector<float> output_norm_;
  std::vector<LayerWeights> layers_;
  uint64_t weight_bytes_ = 0;
  bool carries_predictors_ = false;
  float sparse_threshold_ = 0;
  // ffn_down rebuilt from ffn_down_t when a PowerInfer file has only the latter.
  std::vector<HugeBytes> owned_;
  std::vector<float> rope_freqs_;  // rope_freqs.weight (rope_dim / 2) or empty
  std::vector<float> rope_long_;   // LongRoPE's factors for long contexts
  std::vector<float> rope_short_;  // ... and for contexts up to rope_orig_ctx
  std::vector<std::string> warnings_;
};

}  // namespace thermocline
