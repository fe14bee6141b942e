// Sidecar → SparseLayerPlan per layer.
#include "offline/sparse_loader.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace thermocline::offline {

namespace {

// |act| quantile at level q in [0, 1] from kQuantileLevels evenly spaced quantiles.
float QuantileAt(const std::vector<float>& quantiles, double q) {
  if (quantiles.empty()) return 0.0f;
  const double pos = std::clamp(q, 0.0, 1.0) * (quantiles.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(pos));
  const size_t hi = std::min(lo + 1, quantiles.size() - 1);
  const double f = pos - lo;
  return static_cast<float>(quantiles[lo] * (1 - f) + quantiles[hi] * f);
}

}  // namespace

absl::StatusOr<std::vector<SparseLayerPlan>> SparsePlanFromSidecar(
    const Sidecar& sidecar, const LlamaModel& model, const SparseLoadOptions& options) {
  if (absl::Status s = CheckSidecarMatches(sidecar, model); !s.ok()) return s;
  std::vector<SparseLayerPlan> plan(sidecar.layers.size());
  for (size_t l = 0; l < plan.size(); ++l) {
    const SidecarLayer& s = sidecar.layers[l];
    SparseLayerPlan& p = plan[l];
    const Predictor& pr = s.predictor;
    if (pr.rank > 0) {
      // The sidecar holds fc1/fc2 as F16; in memory they are F16-rounded floats: exact.
      p.rank = pr.rank;
      p.fc1 = MakeWeight(GgmlType::kF16, pr.fc1.data(), pr.rank, pr.n_embd);
      p.fc2 = MakeWeight(GgmlType::kF16, pr.fc2.data(), pr.n_ff, pr.rank);
      p.b1 = pr.b1;
      p.b2 = pr.b2;
      p.threshold = pr.threshold;
    }
    p.magnitude_threshold = s.magnitude_threshold;
    if (static_cast<int64_t>(s.fire_count.size()) == model.hparams().n_ff) {
      p.fire_count = s.fire_count;  // lays the rows out hottest first
    }
    if (options.target_sparsity > 0 && model.hparams().activation == FfnActivation::kSilu) {
      p.magnitude_threshold = QuantileAt(s.act_abs_quantiles, options.target_sparsity);
    }
    if (!s.neuron_order.empty()) {
      if (s.n_gpu < 0 || s.n_gpu > static_cast<int64_t>(s.neuron_order.size())) {
        return absl::InvalidArgumentError(absl::StrCat("sidecar layer ", l, ": n_gpu ", s.n_gpu));
      }
      p.device_neurons.assign(s.neuron_order.begin(), s.neuron_order.begin() + s.n_gpu);
    }
  }
  return plan;
}

absl::StatusOr<std::unique_ptr<SparseFfn>> LoadSparseFfn(const std::string& sidecar_path,
                                                         const LlamaModel& model, ThreadPool* pool,
                                                         const SparseFfnOptions& ffn_options,
                                                         const SparseLoadOptions& options) {
  absl::StatusOr<Sidecar> sidecar = LoadSidecarFor(sidecar_path, model);
  if (!sidecar.ok()) return sidecar.status();
  absl::StatusOr<std::vector<SparseLayerPlan>> plan =
      SparsePlanFromSidecar(*sidecar, model, options);
  if (!plan.ok()) return plan.status();
  return SparseFfn::Create(model, *std::move(plan), pool, ffn_options);
}

}  // namespace thermocline::offline
