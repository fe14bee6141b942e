#include "engine/model/model_support.h"

#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace thermocline {
namespace {

absl::Status Refuse(const LlamaModel& model, std::string_view path,
                    const std::vector<std::string>& what) {
  return absl::FailedPreconditionError(
      absl::StrCat(std::string(path), " cannot run ", model.architecture().name, " models yet (",
                   absl::StrJoin(what, ", "), "); run the model without it"));
}

}  // namespace

absl::StatusOr<ModelSupport> CheckModelSupported(const GgufFile& file,
                                                 const ModelOptions& options) {
  return LlamaModel::CheckSupported(file, options);
}

absl::StatusOr<ModelSupport> CheckModelSupported(const std::string& path,
                                                 const ModelOptions& options) {
  auto file = GgufFile::Open(path);
  if (!file.ok()) return file.status();
  auto support = LlamaModel::CheckSupported(**file, options);
  if (!support.ok()) {
    return absl::Status(support.status().code(),
                        absl::StrCat(path, ": ", support.status().message()));
  }
  return support;
}

absl::Status RequireGatedFfn(const LlamaModel& model, std::string_view path) {
  const LlamaHparams& h = model.hparams();
  std::vector<std::string> what;
  if (h.is_moe()) what.push_back("a mixture of experts");
  if (h.activation == FfnActivation::kGeluTanh) what.push_back("the GELU-gated FFN");
  if (what.empty()) return absl::OkStatus();
  return Refuse(model, path, what);
}

absl::Status RequireLlamaLayers(const LlamaModel& model, std::string_view path) {
  const LlamaHparams& h = model.hparams();
  std::vector<std::string> what;
  if (h.rope_kind != RopeKind::kAdjacent) what.push_back("NEOX RoPE");
  bool biases = false, qk_norm = false, post_norms = false;
  for (const LayerWeights& L : model.layers()) {
    biases |= !L.bq.empty() || !L.bk.empty() || !L.bv.empty() || !L.bo.empty();
    qk_norm |= !L.q_norm.empty() || !L.k_norm.empty();
    post_norms |= !L.post_attn_norm.empty() || !L.post_ffn_norm.empty();
  }
  if (biases) what.push_back("attention biases");
  if (qk_norm) what.push_back("Q/K norms");
  if (post_norms) what.push_back("post-attention and post-FFN norms");
  if (h.attn_softcap > 0 || h.final_softcap > 0) what.push_back("soft-capping");
  bool slides = false;
  for (int64_t l = 0; l < h.n_layer; ++l) slides |= h.LayerSlides(l);
  if (slides) what.push_back("sliding-window attention");
  if (h.head_dim_v != h.head_dim) what.push_back("values shorter or longer than keys");
  if (std::abs(h.attn_scale * std::sqrt(static_cast<float>(h.head_dim)) - 1.0f) > 1e-6f) {
    what.push_back("an attention scale other than 1/sqrt(head_dim)");
  }
  if (h.is_moe()) what.push_back("a mixture of experts");
  if (h.activation == FfnActivation::kGeluTanh) what.push_back("the GELU-gated FFN");
  if (what.empty()) return absl::OkStatus();
  return Refuse(model, path, what);
}

}  // namespace thermocline
