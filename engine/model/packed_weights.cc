// PackedWeights: the matrices of the scope re-laid (Q4_0, Q2_K to Q6_K) or copied as they are
// (every other type), one at a time, each released from the file as soon as its copy exists (the
// load never holds two copies of more than one matrix).
#include "engine/model/packed_weights.h"

namespace thermocline {
namespace {

// A matrix below a huge page gains nothing from a copy (it is not on a huge page either) and
// would hold its partial file pages twice.
constexpr size_t kMinCopyBytes = kHugePageBytes;

}  // namespace

std::shared_ptr<const PackedWeights> PackedWeights::Build(const LlamaModel& model,
                                                          const PackScope& scope,
                                                          ThreadPool& pool) {
  auto p = std::make_shared<PackedWeights>();
  const GgufFile& file = model.gguf();
  auto pack = [&](const WeightView& w) {
    if (w.data == nullptr || w.layout != WeightLayout::kRows || w.rows == 0 ||
        p->copies_.count(w.data) != 0) {
      return;
    }
    OwnedWeight copy = PackRowGroups(pool, w);
    if (copy.data.empty()) {  // a type without row groups: a plain copy where huge pages pay
      if (w.rows * w.row_bytes < kMinCopyBytes) return;
      copy = CopyWeight(pool, w);
    }
    p->bytes_ += copy.data.size();
    p->released_file_bytes_ += file.ReleasePages(w.data, w.rows * w.row_bytes);
    p->copies_.emplace(w.data, std::move(copy));
  };
  const std::vector<LayerWeights>& layers = model.layers();
  for (size_t l = 0; l < layers.size(); ++l) {
    const LayerWeights& L = layers[l];
    if (l < scope.attention.size() && scope.attention[l]) {
      for (const WeightView* w : {&L.wq, &L.wk, &L.wv, &L.wo}) pack(*w);
    }
    if (l < scope.ffn.size() && scope.ffn[l] && !L.is_moe()) {
      for (const WeightView* w : {&L.ffn_gate, &L.ffn_up, &L.ffn_down}) pack(*w);
    }
  }
  if (scope.output && model.output().data != model.token_embd().data) pack(model.output());
  return p;
}

const WeightView& PackedWeights::Resolve(const WeightView& w) const {
  const auto it = copies_.find(w.data);
  if (it == copies_.end() || it->second.view.rows != w.rows || it->second.view.cols != w.cols) {
    return w;
  }
  return it->second.view;
}

}  // namespace thermocline
