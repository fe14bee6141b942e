// A loaded llama-family model: hyperparameters, weights (views into the memory-mapped GGUF,
// never copied except small norm vectors) and tokenizer. Immutable after Load, so any number of
// sessions may share it across threads.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/gguf/gguf.h"
#include "engine/model/hparams.h"
#include "engine/ops/matmul.h"
#include "engine/tokenizer/tokenizer.h"
#include "engine/util/huge_pages.h"

namespace thermocline {

struct ModelOptions {
  std::optional<FfnActivation> activation;  // overrides llama.feed_forward_activation
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
  const GgufFile& gguf() const { return *file_; }
  const std::vector<LayerWeights>& layers() const { return layers_; }
  const WeightView& token_embd() const { return token_embd_; }
  const WeightView& output() const { return output_; }  // token_embd when tied
  const std::vector<float>& output_norm() const { return output_norm_; }
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
  absl::Status Bind();

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
};

}  // namespace thermocline
