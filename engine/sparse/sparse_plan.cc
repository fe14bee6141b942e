#include "engine/sparse/sparse_plan.h"

#include <map>

#include "absl/strings/str_cat.h"

namespace thermocline {

const char* SparseSourceName(SparsePlan::Source source) {
  switch (source) {
    case SparsePlan::Source::kSidecar:
      return "sidecar";
    case SparsePlan::Source::kModelPredictors:
      return "powerinfer";
    case SparsePlan::Source::kOracle:
      return "oracle";
  }
  return "?";
}

const char* SparseMethodName(SparseMethod method) {
  switch (method) {
    case SparseMethod::kPredicted:
      return "predicted";
    case SparseMethod::kGateFirst:
      return "gate-first";
    case SparseMethod::kInputSparse:
      return "input-sparse";
  }
  return "?";
}

std::string SparseMethodsOf(const std::vector<SparseLayerPlan>& layers) {
  std::map<std::string, int> count;
  for (const SparseLayerPlan& p : layers) ++count[SparseMethodName(p.method)];
  std::string out;
  for (const auto& [name, n] : count) {
    absl::StrAppend(&out, out.empty() ? "" : ", ", name,
                    count.size() > 1 ? absl::StrCat(" ", n) : "");
  }
  return out;
}

absl::StatusOr<std::vector<SparseLayerPlan>> SparsePlanFromModel(const LlamaModel& model) {
  if (!model.carries_predictors()) {
    return absl::FailedPreconditionError(
        "the model carries no predictors (blk.N.fc1/fc2); give a sidecar instead");
  }
  std::vector<SparseLayerPlan> plan(model.layers().size());
  for (size_t l = 0; l < plan.size(); ++l) {
    const LayerWeights& L = model.layers()[l];
    SparseLayerPlan& p = plan[l];
    p.rank = L.pred_fc1.rows;
    p.fc1 = OwnedWeight{L.pred_fc1, {}};
    p.fc2 = OwnedWeight{L.pred_fc2, {}};
    p.b1.assign(p.rank, 0.0f);
    p.b2.assign(L.pred_fc2.rows, 0.0f);
    p.threshold = model.sparse_threshold();
  }
  return plan;
}

}  // namespace thermocline
