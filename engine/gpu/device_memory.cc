#include "engine/gpu/device_memory.h"

#include <algorithm>

#include "engine/ops/weight_layout.h"

namespace thermocline::gpu {
namespace {

// What DeviceArena::Allocate accounts for a request of `bytes` (0 bytes still takes a block).
uint64_t Block(uint64_t bytes) { return MemoryBudget::Rounded(bytes == 0 ? 1 : bytes); }

constexpr uint64_t kQ8BlockBytes = 34;  // a Q8_0 block of 32 activations

// Stands in for the host FFN of hybrid layers: only its presence matters to the account.
class HostFfnPlaceholder : public FfnBackend {
 public:
  void Forward(int, const float*, const float*, int64_t, float*) override {}
};

}  // namespace

uint64_t ComputeGpuFfnMemory(const GpuFfnSpec& spec) {
  uint64_t total = 0;
  int64_t max_dev = 0, max_rank = 0;
  for (const GpuFfnLayerSpec& s : spec.layers) {
    const int64_t n = static_cast<int64_t>(s.device_neurons.size());
    max_dev = std::max(max_dev, n);
    if (n == 0) continue;
    for (const WeightView* w : {&s.gate, &s.up, &s.down_t}) {
      total += Block(static_cast<uint64_t>(n) * RowBytes(w->type, w->cols));
    }
    total += Block(n * 4) + Block((n + 1) * 4);  // the neuron table, the all-neurons list
    if (s.rank > 0) {
      total += Block(s.rank * RowBytes(s.fc1.type, s.fc1.cols)) +
               Block(s.fc2.rows * RowBytes(s.fc2.type, s.fc2.cols)) + Block(s.b1.size() * 4) +
               Block(s.b2.size() * 4);
      max_rank = std::max(max_rank, s.rank);
    }
    total += Block(spec.n_ff * 4);  // the neuron map
  }
  return total + FfnScratchBytes(spec.n_embd, spec.n_ff, max_dev, max_rank);
}

uint64_t FfnScratchBytes(int64_t n_embd, int64_t n_ff, int64_t max_device, int64_t max_rank) {
  const int64_t m = std::max<int64_t>(max_device, 1);
  uint64_t s = Block(n_embd * 4) + Block(n_embd / 32 * kQ8BlockBytes + 1) +
               Block(std::max<int64_t>(max_rank, 1) * 4) +
               Block(max_rank / 32 * kQ8BlockBytes + 1) + Block(m * 4) + Block((m + 1) * 4) +
               Block(m * 4) + Block(m * 4) +
               Block(static_cast<uint64_t>(AxpyPartialSplits(m)) * n_embd * 4) + Block(n_embd * 4) +
               Block(4);
  if (max_rank > 0 || max_device > 0) {
    s += Block(n_ff * 4) + Block((n_ff + 1) * 4) + Block(n_embd * 4);  // resident mode
  }
  return s;
}

FfnLayerBytes FfnLayerDeviceBytes(const LayerWeights& layer, int64_t n_embd, int64_t n_ff,
                                  int64_t predictor_rank, GgmlType predictor_type) {
  FfnLayerBytes b;
  const GgmlType down_t = DownTType(layer.ffn_down);
  b.per_neuron =
      static_cast<double>(RowBytes(layer.ffn_gate.type, n_embd) +
                          RowBytes(layer.ffn_up.type, n_embd) + RowBytes(down_t, n_embd) + 8);
  // Each of the layer's allocations may round up by one granule.
  constexpr double kRounding = MemoryBudget::kGranularity;
  b.fixed = 5 * kRounding + static_cast<double>(Block(n_ff * 4));
  if (predictor_rank > 0) {
    b.fixed += static_cast<double>(Block(predictor_rank * RowBytes(predictor_type, n_embd)) +
                                   Block(n_ff * RowBytes(predictor_type, predictor_rank)) +
                                   Block(predictor_rank * 4) + Block(n_ff * 4));
  }
  return b;
}

uint64_t ExpertDeviceBytes(const LayerWeights& layer, int64_t expert, int64_t n_embd,
                           int64_t n_ff_exp) {
  const uint64_t n = static_cast<uint64_t>(n_ff_exp);
  const WeightView& down = layer.expert_down[expert];
  return Block(n * RowBytes(layer.expert_gate[expert].type, n_embd)) +
         Block(n * RowBytes(layer.expert_up[expert].type, n_embd)) +
         Block(n * RowBytes(DownTType(down), n_embd)) + Block(n * 4) + Block((n + 1) * 4) +
         Block(n * 4);  // the neuron table, the all-neurons list, the neuron map
}

GpuLayersMemory ComputeHybridLayersMemory(const LlamaModel& model, int64_t n_ctx, int64_t max_batch,
                                          bool output, KvType kv_type) {
  static HostFfnPlaceholder placeholder;
  GpuLayersSpec spec;
  spec.model = &model;
  spec.layers.assign(model.hparams().n_layer, 1);
  spec.output = output;
  spec.n_ctx = n_ctx;
  spec.max_batch = max_batch;
  spec.kv_type = kv_type;
  spec.host_ffn = &placeholder;
  return ComputeGpuLayersMemory(spec);
}

}  // namespace thermocline::gpu
