// Placement problem construction from a model and its sidecar, and the plain evaluator.
#include "offline/solver/placement.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "engine/gpu/device_memory.h"

namespace thermocline::offline {
namespace {

double MatrixBytes(const WeightView& w) { return static_cast<double>(w.rows) * w.row_bytes; }

}  // namespace

const char* ObjectiveName(Objective o) { return o == Objective::kTime ? "time" : "frequency"; }

absl::StatusOr<Objective> ParseObjective(const std::string& name) {
  if (name == "time") return Objective::kTime;
  if (name == "frequency") return Objective::kFrequency;
  return absl::InvalidArgumentError(
      absl::StrCat("--objective '", name, "': expected 'time' or 'frequency'"));
}

int64_t PlacementProblem::MinNeurons(size_t l) const {
  return std::min(std::max<int64_t>(1, min_neurons), layers[l].n_ff);
}

Placement Placement::AllCpu(const PlacementProblem& p) {
  Placement x;
  for (const LayerCosts& L : p.layers) x.gpu_bucket.emplace_back(L.buckets.size(), 0);
  x.attention_gpu.assign(p.layers.size(), 0);
  return x;
}

int64_t Placement::GpuNeurons(const PlacementProblem& p, size_t l) const {
  int64_t n = 0;
  for (size_t b = 0; b < gpu_bucket[l].size(); ++b) {
    if (gpu_bucket[l][b]) n += p.layers[l].bucket_neurons(b);
  }
  return n;
}

double PlacementGpuBytes(const PlacementProblem& p, const Placement& x) {
  double bytes = x.output_gpu ? p.output_bytes : 0.0;
  for (size_t l = 0; l < p.layers.size(); ++l) {
    const LayerCosts& L = p.layers[l];
    const int64_t n = x.GpuNeurons(p, l);
    bytes += n * L.bytes_per_neuron + (n > 0 ? L.predictor_bytes : 0.0);
    if (x.attention_gpu[l]) bytes += L.attn_bytes + L.kv_bytes;
  }
  return bytes;
}

bool PlacementFeasible(const PlacementProblem& p, const Placement& x) {
  for (size_t l = 0; l < p.layers.size(); ++l) {
    const int64_t n = x.GpuNeurons(p, l);
    if (n > 0 && n < p.MinNeurons(l)) return false;
  }
  // A relative tolerance matching the ILP's feasibility tolerance on the MiB-scaled row.
  return PlacementGpuBytes(p, x) <= p.budget_bytes * (1 + 1e-9) + 1e-3;
}

double PlacementSeconds(const PlacementProblem& p, const Placement& x) {
  const double g = p.gpu_bytes_per_s, c = p.cpu_bytes_per_s;
  double s = p.output_bytes / (x.output_gpu ? g : c);
  for (size_t l = 0; l < p.layers.size(); ++l) {
    const LayerCosts& L = p.layers[l];
    const bool ffn_gpu = x.GpuNeurons(p, l) > 0;
    double gpu_work = 0, cpu_work = 0;
    for (size_t b = 0; b < L.buckets.size(); ++b) {
      (x.gpu_bucket[l][b] ? gpu_work : cpu_work) += L.bucket_work[b];
    }
    const double gpu_ffn = (gpu_work * L.bytes_per_neuron + (ffn_gpu ? L.predictor_bytes : 0)) / g;
    const double cpu_ffn = (cpu_work * L.bytes_per_neuron + (ffn_gpu ? 0 : L.predictor_bytes)) / c;
    s += (L.attn_bytes + L.kv_read_bytes) / (x.attention_gpu[l] ? g : c);
    s += std::max(gpu_ffn, cpu_ffn);
    if (ffn_gpu || x.attention_gpu[l]) s += p.sync_s;
  }
  return s;
}

double PlacementFiringMass(const PlacementProblem& p, const Placement& x) {
  double m = 0;
  for (size_t l = 0; l < p.layers.size(); ++l) {
    for (size_t b = 0; b < p.layers[l].buckets.size(); ++b) {
      if (x.gpu_bucket[l][b]) m += p.layers[l].bucket_freq[b];
    }
  }
  return m;
}

double TotalFiringMass(const PlacementProblem& p) {
  double m = 0;
  for (const LayerCosts& L : p.layers)
    m = std::accumulate(L.bucket_freq.begin(), L.bucket_freq.end(), m);
  return m;
}

double PlacementObjective(const PlacementProblem& p, const Placement& x, Objective o) {
  if (o == Objective::kTime) return -PlacementSeconds(p, x);
  double extra = x.output_gpu ? 1 : 0;
  for (uint8_t a : x.attention_gpu) extra += a;
  return PlacementFiringMass(p, x) + kFrequencyTieBreak * extra;
}

std::vector<ModelledLayer> ModelledLayerTimes(const PlacementProblem& p, const Sidecar& sidecar,
                                              double* output_s) {
  const double g = p.gpu_bytes_per_s, c = p.cpu_bytes_per_s;
  std::vector<ModelledLayer> out(p.layers.size());
  const double tokens = std::max<double>(1, static_cast<double>(sidecar.tokens));
  for (size_t l = 0; l < p.layers.size() && l < sidecar.layers.size(); ++l) {
    const LayerCosts& L = p.layers[l];
    const SidecarLayer& y = sidecar.layers[l];
    ModelledLayer& m = out[l];
    m.attention_gpu = y.attention_gpu;
    m.gpu_neurons = y.n_gpu;
    const double precision = y.predictor.rank > 0 && y.precision > 0 ? y.precision : 1.0;
    std::vector<uint8_t> on_gpu(L.n_ff, 0);
    for (int64_t k = 0; k < y.n_gpu && k < static_cast<int64_t>(y.neuron_order.size()); ++k) {
      on_gpu[y.neuron_order[k]] = 1;
    }
    double gpu_work = 0, cpu_work = 0;
    for (int64_t i = 0; i < L.n_ff && i < static_cast<int64_t>(y.fire_count.size()); ++i) {
      (on_gpu[i] ? gpu_work : cpu_work) += y.fire_count[i] / tokens / precision;
    }
    const bool ffn_gpu = y.n_gpu > 0;
    m.gpu_ffn_s = (gpu_work * L.bytes_per_neuron + (ffn_gpu ? L.predictor_bytes : 0)) / g;
    m.cpu_ffn_s = (cpu_work * L.bytes_per_neuron + (ffn_gpu ? 0 : L.predictor_bytes)) / c;
    m.attention_s = (L.attn_bytes + L.kv_read_bytes) / (m.attention_gpu ? g : c);
    m.sync_s = ffn_gpu || m.attention_gpu ? p.sync_s : 0;
  }
  if (output_s != nullptr) {
    *output_s = p.output_bytes / (sidecar.placement.output_gpu ? g : c);
  }
  return out;
}

double MinimumUsefulBudget(const PlacementProblem& p) {
  double best = p.output_bytes > 0 && !p.experts ? p.output_bytes : INFINITY;
  for (size_t l = 0; l < p.layers.size(); ++l) {
    const LayerCosts& L = p.layers[l];
    // The fewest neurons reaching the minimum: buckets are equal except possibly a smaller
    // last one, so either whole buckets alone or the small one plus whole buckets.
    const int64_t m = p.MinNeurons(l);
    const int64_t full = L.bucket_neurons(0);
    const int64_t small = L.bucket_neurons(L.buckets.size() - 1);
    int64_t n = (m + full - 1) / full * full;
    if (small < full)
      n = std::min(n, small + (std::max<int64_t>(0, m - small) + full - 1) / full * full);
    n = std::min(n, L.n_ff);
    best = std::min(best, n * L.bytes_per_neuron + L.predictor_bytes);
    if (L.attn_bytes > 0 && !p.experts) best = std::min(best, L.attn_bytes + L.kv_bytes);
  }
  return best;
}

absl::StatusOr<PlacementProblem> BuildPlacementProblem(const LlamaModel& model,
                                                       const Sidecar& sidecar,
                                                       const HardwareProfile& hw,
                                                       const ProblemOptions& options) {
  const LlamaHparams& hp = model.hparams();
  if (hp.is_moe()) return BuildExpertPlacementProblem(model, sidecar, hw, options);
  if (options.bucket_size < 1) return absl::InvalidArgumentError("--bucket must be >= 1");
  if (sidecar.tokens <= 0) return absl::FailedPreconditionError("sidecar has no profile");
  if (hw.cpu_bandwidth_gbps <= 0) {
    return absl::InvalidArgumentError("the hardware profile has no CPU bandwidth");
  }
  PlacementProblem p;
  p.gpu_bytes_per_s = hw.GpuBytesPerSecond();
  p.cpu_bytes_per_s = hw.CpuBytesPerSecond();
  // A hybrid layer ships x to the GPU and its partial sum back: two n_embd float vectors.
  p.sync_s = hw.sync_latency_us * 1e-6 + 2.0 * hp.n_embd * 4 / (hw.pcie_gbps * 1e9);
  const int64_t context = options.context > 0 ? options.context : hp.n_ctx_train;
  p.context = context;
  // Memory as the runtime allocates it (engine/gpu/device_memory.h): the hybrid layers' weights,
  // norms and KV cache, the output head, each layer's FFN device part, and the scratch of the
  // layers and of the FFN executor, which come off the budget first.
  const gpu::GpuLayersMemory mem =
      gpu::ComputeHybridLayersMemory(model, context, std::max<int64_t>(options.max_batch, 1),
                                     /*output=*/true, options.kv_type);
  int64_t max_rank = 0;
  for (const SidecarLayer& sl : sidecar.layers) max_rank = std::max(max_rank, sl.predictor.rank);
  const double scratch = static_cast<double>(
      mem.scratch + gpu::FfnScratchBytes(hp.n_embd, hp.n_ff, hp.n_ff, max_rank));
  p.scratch_bytes = scratch;
  p.budget_bytes = std::max(0.0, options.budget_bytes - scratch);
  p.output_bytes = static_cast<double>(mem.output);
  double max_bpn = 0;
  for (int64_t l = 0; l < hp.n_layer; ++l) {
    const LayerWeights& w = model.layers()[l];
    const SidecarLayer& sl = sidecar.layers[l];
    LayerCosts L;
    L.n_ff = hp.n_ff;
    const gpu::FfnLayerBytes ffn =
        gpu::FfnLayerDeviceBytes(w, hp.n_embd, hp.n_ff, sl.predictor.rank, GgmlType::kF16);
    L.bytes_per_neuron = ffn.per_neuron;
    max_bpn = std::max(max_bpn, L.bytes_per_neuron);
    L.attn_bytes = MatrixBytes(w.wq) + MatrixBytes(w.wk) + MatrixBytes(w.wv) + MatrixBytes(w.wo);
    L.kv_bytes = static_cast<double>(mem.layer[l]) - L.attn_bytes;  // KV (F32), norms, rounding
    L.kv_read_bytes = 2.0 * (context / 2) * hp.kv_dim() * 4;        // K and V at half the context
    L.predictor_bytes = ffn.fixed;  // the predictor and the neuron map, with the first neuron
    const double precision = sl.predictor.rank > 0 && sl.precision > 0 ? sl.precision : 1.0;
    std::vector<int32_t> order(hp.n_ff);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int32_t a, int32_t b) { return sl.fire_count[a] > sl.fire_count[b]; });
    for (int64_t b0 = 0; b0 < hp.n_ff; b0 += options.bucket_size) {
      const int64_t b1 = std::min(hp.n_ff, b0 + options.bucket_size);
      L.buckets.emplace_back(order.begin() + b0, order.begin() + b1);
      double freq = 0;
      for (int64_t i = b0; i < b1; ++i) freq += sl.fire_count[order[i]];
      freq /= static_cast<double>(sidecar.tokens);
      L.bucket_freq.push_back(freq);
      L.bucket_work.push_back(freq / precision);
    }
    p.layers.push_back(std::move(L));
  }
  if (options.min_neurons >= 0) {
    p.min_neurons = options.min_neurons;
  } else {
    // Neurons that always fire, moved to the GPU, must save at least one sync on the CPU side;
    // rounded up to whole buckets.
    const double n = p.sync_s * p.cpu_bytes_per_s / std::max(1.0, max_bpn);
    const int64_t buckets = static_cast<int64_t>(std::ceil(n / options.bucket_size));
    p.min_neurons = std::max<int64_t>(1, buckets) * options.bucket_size;
  }
  return p;
}

}  // namespace thermocline::offline
