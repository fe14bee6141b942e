// The placement problem of a mixture of experts: whole experts as the units (placement.h).
#include <algorithm>
#include <cmath>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "engine/gpu/device_memory.h"
#include "offline/solver/placement.h"

namespace thermocline::offline {

absl::StatusOr<PlacementProblem> BuildExpertPlacementProblem(const LlamaModel& model,
                                                             const Sidecar& sidecar,
                                                             const HardwareProfile& hw,
                                                             const ProblemOptions& options) {
  const LlamaHparams& hp = model.hparams();
  if (!hp.is_moe() || sidecar.n_expert != hp.n_expert) {
    return absl::FailedPreconditionError(
        "the sidecar has no routing profile of this model's experts; run `thermocline profile` "
        "for it");
  }
  if (sidecar.tokens <= 0) return absl::FailedPreconditionError("sidecar has no profile");
  if (hw.cpu_bandwidth_gbps <= 0) {
    return absl::InvalidArgumentError("the hardware profile has no CPU bandwidth");
  }
  const int64_t n_exp = hp.n_expert, width = hp.n_ff_exp;
  PlacementProblem p;
  p.experts = true;
  p.n_ff_exp = width;
  p.gpu_bytes_per_s = hw.GpuBytesPerSecond();
  p.cpu_bytes_per_s = hw.CpuBytesPerSecond();
  // A device expert ships xn to the GPU and its output back: two n_embd float vectors.
  p.sync_s = hw.sync_latency_us * 1e-6 + 2.0 * hp.n_embd * 4 / (hw.pcie_gbps * 1e9);
  p.context = options.context > 0 ? options.context : hp.n_ctx_train;
  p.scratch_bytes = static_cast<double>(gpu::FfnScratchBytes(hp.n_embd, width, width, 0));
  p.budget_bytes = std::max(0.0, options.budget_bytes - p.scratch_bytes);
  p.min_neurons = width;  // one expert
  const double tokens = static_cast<double>(sidecar.tokens);
  for (int64_t l = 0; l < hp.n_layer; ++l) {
    const LayerWeights& w = model.layers()[l];
    const SidecarLayer& sl = sidecar.layers[l];
    if (static_cast<int64_t>(sl.expert_route_count.size()) != n_exp) {
      return absl::FailedPreconditionError(
          absl::StrCat("sidecar layer ", l, " has no routing counts of its ", n_exp, " experts"));
    }
    LayerCosts L;
    L.n_ff = n_exp * width;
    // The most an expert of the layer takes (the experts of a layer share their types).
    uint64_t expert_bytes = 0;
    for (int64_t e = 0; e < n_exp; ++e) {
      expert_bytes = std::max(expert_bytes, gpu::ExpertDeviceBytes(w, e, hp.n_embd, width));
    }
    L.bytes_per_neuron = static_cast<double>(expert_bytes) / static_cast<double>(width);
    auto bytes = [](const WeightView& m) { return static_cast<double>(m.rows) * m.row_bytes; };
    L.attn_bytes = bytes(w.wq) + bytes(w.wk) + bytes(w.wv) + bytes(w.wo);
    L.kv_read_bytes = 2.0 * (p.context / 2) * hp.kv_dim() * 4;
    std::vector<int32_t> order(n_exp);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
      return sl.expert_route_count[a] > sl.expert_route_count[b];
    });
    for (int32_t e : order) {
      std::vector<int32_t> ids(width);
      std::iota(ids.begin(), ids.end(), static_cast<int32_t>(e * width));
      L.buckets.push_back(std::move(ids));
      const double rows = sl.expert_route_count[e] / tokens * static_cast<double>(width);
      L.bucket_freq.push_back(rows);
      L.bucket_work.push_back(rows);
    }
    p.layers.push_back(std::move(L));
  }
  return p;
}

std::vector<int32_t> GpuExperts(const PlacementProblem& p, const Placement& x, size_t l) {
  std::vector<int32_t> out;
  for (size_t b = 0; b < p.layers[l].buckets.size(); ++b) {
    if (x.gpu_bucket[l][b]) out.push_back(p.layers[l].buckets[b][0] / p.n_ff_exp);
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace thermocline::offline
