// GpuFfnBackend: every neuron of every layer on the GPU executor.
#include "bench/gpu_ffn_backend.h"

#include <algorithm>
#include <numeric>

#include "engine/model/model_support.h"

namespace thermocline::gpu {

absl::StatusOr<std::unique_ptr<GpuFfnBackend>> GpuFfnBackend::Create(const LlamaModel& model,
                                                                     ThreadPool& pool,
                                                                     uint64_t memory_cap) {
  const LlamaHparams& h = model.hparams();
  if (absl::Status s = RequireGatedFfn(model, "the GPU FFN"); !s.ok()) return s;
  std::vector<OwnedWeight> down_t;  // read only while the executor uploads
  for (const LayerWeights& L : model.layers()) {
    absl::StatusOr<OwnedWeight> t = TransposeWeight(pool, L.ffn_down);
    if (!t.ok()) return t.status();
    down_t.push_back(*std::move(t));
  }
  std::vector<int32_t> all(h.n_ff);
  std::iota(all.begin(), all.end(), 0);
  GpuFfnSpec spec;
  spec.n_embd = h.n_embd;
  spec.n_ff = h.n_ff;
  spec.activation = h.activation;
  spec.memory_cap = memory_cap;
  for (int64_t l = 0; l < h.n_layer; ++l) {
    GpuFfnLayerSpec s;
    s.gate = model.layers()[l].ffn_gate;
    s.up = model.layers()[l].ffn_up;
    s.down_t = down_t[l].view;
    s.device_neurons = all;
    spec.layers.push_back(s);
  }
  absl::StatusOr<std::unique_ptr<GpuFfnExecutor>> executor = CreateGpuFfnExecutor(spec);
  if (!executor.ok()) return executor.status();
  std::unique_ptr<GpuFfnBackend> backend(new GpuFfnBackend());
  backend->n_embd_ = h.n_embd;
  backend->executor_ = *std::move(executor);
  return backend;
}

void GpuFfnBackend::Forward(int layer, const float* x, const float* xn, int64_t n_tokens,
                            float* out) {
  for (int64_t t = 0; t < n_tokens; ++t) {
    float* o = out + t * n_embd_;
    if (status_.ok()) status_ = executor_->Launch(layer, xn + t * n_embd_, nullptr, 0);
    if (status_.ok()) status_ = executor_->Wait(o, nullptr, nullptr);
    if (!status_.ok()) std::fill_n(o, n_embd_, 0.0f);
  }
}

}  // namespace thermocline::gpu
