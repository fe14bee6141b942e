// The placed MoE FFN: device experts through the device's FFN executor, the rest on the host
// (a ReLU-family expert over its firing neurons only), prefill batched expert by expert.
#include "engine/sparse/moe_ffn.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "engine/model/cpu_ops.h"
#include "engine/model/moe_route.h"

namespace thermocline {

absl::StatusOr<std::shared_ptr<const ExpertWeights>> ExpertWeights::Build(
    const LlamaModel& model, std::vector<SparseLayerPlan> layers, ThreadPool& pool,
    bool sparse_host) {
  const LlamaHparams& h = model.hparams();
  if (!h.is_moe()) {
    return absl::FailedPreconditionError("an expert placement needs a mixture-of-experts model");
  }
  if (static_cast<int64_t>(layers.size()) != h.n_layer) {
    return absl::InvalidArgumentError(
        absl::StrCat("the expert plan has ", layers.size(), " layers, the model ", h.n_layer));
  }
  std::shared_ptr<ExpertWeights> w(new ExpertWeights(model));
  w->slot_.assign(h.n_layer * h.n_expert, -1);
  w->down_t_.resize(h.n_layer * h.n_expert);
  w->all_neurons_.resize(h.n_ff_exp);
  std::iota(w->all_neurons_.begin(), w->all_neurons_.end(), 0);
  for (int64_t l = 0; l < h.n_layer; ++l) {
    for (int32_t e : layers[l].device_experts) {
      if (e < 0 || e >= h.n_expert || w->slot_[l * h.n_expert + e] >= 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "layer ", l, ": device expert ", e, " is out of range or listed twice (the model has ",
            h.n_expert, " experts); solve the placement again for this model"));
      }
      w->slot_[l * h.n_expert + e] = static_cast<int32_t>(w->owner_.size());
      w->owner_.emplace_back(l, e);
    }
  }
  bool sparse = sparse_host && GateDecides(h.activation);
  for (const LayerWeights& L : model.layers()) {
    for (const WeightView& up : L.expert_up) sparse = sparse && SparseRowsSupported(up.type);
  }
  w->sparse_host_ = sparse;
  // Each copied expert's down pages are released once copied (the experts of a layer follow
  // each other in the file, so a run of copied ones is released as one range, the pages they
  // share included).
  const GgufFile& file = model.gguf();
  for (int64_t l = 0; l < h.n_layer; ++l) {
    const LayerWeights& L = model.layers()[l];
    const uint8_t* run = nullptr;
    uint64_t run_bytes = 0;
    auto release = [&] {
      if (run != nullptr) w->released_file_bytes_ += file.ReleasePages(run, run_bytes);
      run = nullptr;
      run_bytes = 0;
    };
    for (int64_t e = 0; e < h.n_expert; ++e) {
      if (!sparse && w->slot_[l * h.n_expert + e] < 0) {
        release();
        continue;
      }
      const WeightView& down = L.expert_down[e];
      absl::StatusOr<OwnedWeight> down_t = TransposeWeight(pool, down);
      if (!down_t.ok()) return down_t.status();
      w->down_t_[l * h.n_expert + e] = *std::move(down_t);
      const uint64_t bytes = static_cast<uint64_t>(down.rows) * down.row_bytes;
      if (run == nullptr || run + run_bytes != down.data) {
        release();
        run = down.data;
      }
      run_bytes += bytes;
    }
    release();
  }
  w->plan_ = std::move(layers);
  return std::shared_ptr<const ExpertWeights>(std::move(w));
}

gpu::GpuFfnSpec ExpertWeights::DeviceSpec() const {
  const LlamaHparams& h = model_.hparams();
  gpu::GpuFfnSpec spec;
  spec.n_embd = h.n_embd;
  spec.n_ff = h.n_ff_exp;
  spec.activation = h.activation;
  for (size_t s = 0; s < owner_.size(); ++s) {
    const auto [l, e] = owner_[s];
    const LayerWeights& L = model_.layers()[l];
    gpu::GpuFfnLayerSpec y;
    y.gate = L.expert_gate[e];
    y.up = L.expert_up[e];
    y.down_t = down_t_[l * h.n_expert + e].view;
    y.device_neurons = all_neurons_;
    spec.layers.push_back(y);
  }
  return spec;
}

uint64_t ExpertWeights::bytes() const {
  uint64_t b = 0;
  for (const OwnedWeight& w : down_t_) b += w.data.size();
  return b;
}

MoeFfn::MoeFfn(std::shared_ptr<const ExpertWeights> weights, ThreadPool* pool,
               const MoeFfnOptions& options)
    : weights_(std::move(weights)), model_(weights_->model()), pool_(pool), options_(options) {
  const LlamaHparams& h = model_.hparams();
  const int64_t widest = std::max(h.n_ff_exp, h.n_ff_shexp);
  const int64_t rows = std::max<int64_t>(1, options_.max_batch);
  router_.resize(rows * h.n_expert);
  sel_.resize(rows * h.n_expert_used);
  sel_w_.resize(rows * h.n_expert_used);
  tok_.resize(rows);
  tok_w_.resize(rows);
  xg_.resize(rows * h.n_embd);
  gate_.resize(rows * widest);
  up_.resize(rows * widest);
  eo_.resize(rows * h.n_embd);
  dev_out_.resize(h.n_embd);
  idx_.resize(h.n_ff_exp);
  size_t prepared = 0;
  for (const LayerWeights& L : model_.layers()) {
    for (const WeightView& up : L.expert_up) {
      prepared = std::max(prepared, PreparedBytes(up.type, h.n_embd));
    }
  }
  x_up_.resize(prepared);
  scratch_.Reserve(rows, std::max({h.n_embd, widest}));
  sparse_scratch_.Reserve(pool_->size(), h.n_embd, h.n_ff_exp);
  axpy_tokens_.Reserve(rows, h.n_ff_exp);
}

absl::StatusOr<std::unique_ptr<MoeFfn>> MoeFfn::Create(std::shared_ptr<const ExpertWeights> weights,
                                                       ThreadPool* pool,
                                                       const MoeFfnOptions& options) {
  std::unique_ptr<MoeFfn> f(new MoeFfn(std::move(weights), pool, options));
  if (options.device == nullptr || f->weights_->n_device_experts() == 0) return f;
  gpu::GpuFfnSpec spec = f->weights_->DeviceSpec();
  spec.memory_cap = options.gpu_memory;
  spec.budget = options.budget;
  spec.queue = options.queue;
  spec.device = options.device_index;
  absl::StatusOr<std::unique_ptr<gpu::GpuFfnExecutor>> e = options.device->CreateFfnExecutor(spec);
  if (e.ok()) {
    f->executor_ = *std::move(e);
    f->device_status_ = absl::OkStatus();
  } else if (absl::IsUnavailable(e.status())) {
    f->device_status_ = e.status();  // no device: every expert on the host
  } else {
    return e.status();
  }
  return f;
}

void MoeFfn::Forward(int layer, const float*, const float* xn, int64_t n, float* out) {
  if (n > 1 && options_.dense_prefill && n <= options_.max_batch) {
    Prefill(layer, xn, n, out);
    return;
  }
  const int64_t d = model_.hparams().n_embd;
  for (int64_t t = 0; t < n; ++t) Token(layer, xn + t * d, out + t * d);
}

void MoeFfn::Prefill(int layer, const float* xn, int64_t n, float* out) {
  const LlamaHparams& h = model_.hparams();
  const LayerWeights& L = model_.layers()[layer];
  const int64_t d = h.n_embd, k = h.n_expert_used, n_ff = h.n_ff_exp;
  MatMul(*pool_, L.ffn_gate_inp, xn, n, router_.data(), scratch_);
  RouteTopK(h, router_.data(), n, sel_.data(), sel_w_.data());
  std::fill_n(out, n * d, 0.0f);
  // Expert by expert over the tokens that chose it: each routed expert's rows are read once.
  for (int64_t e = 0; e < h.n_expert; ++e) {
    int64_t m = 0;
    for (int64_t i = 0; i < n * k; ++i) {
      if (sel_[i] != e) continue;
      tok_[m] = static_cast<int32_t>(i / k);
      tok_w_[m++] = sel_w_[i];
    }
    if (m == 0) continue;
    for (int64_t i = 0; i < m; ++i) std::copy_n(xn + tok_[i] * d, d, xg_.data() + i * d);
    MatMul(*pool_, L.expert_gate[e], xg_.data(), m, gate_.data(), scratch_);
    MatMul(*pool_, L.expert_up[e], xg_.data(), m, up_.data(), scratch_);
    GatedActivation(h.activation, gate_.data(), up_.data(), m * n_ff);
    if (const WeightView* down_t = weights_->down_t(layer, e)) {
      SparseAxpyTokens(*pool_, isa_, *down_t, gate_.data(), m, eo_.data(), axpy_tokens_);
    } else {
      MatMul(*pool_, L.expert_down[e], gate_.data(), m, eo_.data(), scratch_);
    }
    for (int64_t i = 0; i < m; ++i) {
      float* o = out + tok_[i] * d;
      const float* y = eo_.data() + i * d;
      const float wgt = tok_w_[i];
      for (int64_t c = 0; c < d; ++c) o[c] += wgt * y[c];
    }
  }
  SharedExpert(layer, xn, n, out);
}

void MoeFfn::HostExpert(int layer, int64_t e, const float* xn, float w, float* acc) {
  const WeightView* down_t = weights_->down_t(layer, e);
  if (down_t == nullptr) {
    FileExpert(layer, e, xn, w, acc);
    return;
  }
  const LlamaHparams& h = model_.hparams();
  const LayerWeights& L = model_.layers()[layer];
  const int64_t n_ff = h.n_ff_exp;
  // The gate of every neuron, the dense path's own mat-vec (the same firing set).
  MatMul(*pool_, L.expert_gate[e], xn, 1, gate_.data(), scratch_);
  const int32_t* idx = weights_->all_neurons().data();
  int64_t n = n_ff;
  if (weights_->sparse_host()) {
    // ReLU family: only the neurons whose gate fires have a nonzero activation; their gate
    // values compacted to the front, up and down_t rows of those alone.
    n = 0;
    for (int64_t i = 0; i < n_ff; ++i) {
      const float g = gate_[i];
      idx_[n] = static_cast<int32_t>(i);
      gate_[n] = g;
      n += g > 0.0f ? 1 : 0;
    }
    idx = idx_.data();
    PrepareActivations(L.expert_up[e].type, isa_, xn, h.n_embd, x_up_.data());
    SparseMatVec(*pool_, isa_, L.expert_up[e], x_up_.data(), idx, n, up_.data());
  } else {
    MatMul(*pool_, L.expert_up[e], xn, 1, up_.data(), scratch_);
  }
  GatedActivation(h.activation, gate_.data(), up_.data(), n);
  SparseAxpy(*pool_, isa_, *down_t, idx, gate_.data(), n, eo_.data(), sparse_scratch_);
  for (int64_t c = 0; c < h.n_embd; ++c) acc[c] += w * eo_[c];
  ++host_calls_;
  host_neurons_ += n;
}

void MoeFfn::FileExpert(int layer, int64_t e, const float* xn, float w, float* acc) {
  const LlamaHparams& h = model_.hparams();
  const LayerWeights& L = model_.layers()[layer];
  MatMul(*pool_, L.expert_gate[e], xn, 1, gate_.data(), scratch_);
  MatMul(*pool_, L.expert_up[e], xn, 1, up_.data(), scratch_);
  GatedActivation(h.activation, gate_.data(), up_.data(), h.n_ff_exp);
  MatMul(*pool_, L.expert_down[e], gate_.data(), 1, eo_.data(), scratch_);
  for (int64_t c = 0; c < h.n_embd; ++c) acc[c] += w * eo_[c];
  ++host_calls_;
  host_neurons_ += h.n_ff_exp;
}

void MoeFfn::SharedExpert(int layer, const float* xn, int64_t n, float* out) {
  AddSharedExpert(*pool_, model_.hparams(), model_.layers()[layer], xn, n, gate_.data(), up_.data(),
                  eo_.data(), scratch_, out);
}

void MoeFfn::Token(int layer, const float* xn, float* out) {
  const LlamaHparams& h = model_.hparams();
  const LayerWeights& L = model_.layers()[layer];
  const int64_t d = h.n_embd, k = h.n_expert_used;
  MatMul(*pool_, L.ffn_gate_inp, xn, 1, router_.data(), scratch_);
  RouteTopK(h, router_.data(), 1, sel_.data(), sel_w_.data());
  std::fill_n(out, d, 0.0f);
  if (options_.all_experts) {
    for (int64_t e = 0; e < h.n_expert; ++e) {
      float w = 0;
      for (int64_t j = 0; j < k; ++j) w = sel_[j] == e ? sel_w_[j] : w;
      FileExpert(layer, e, xn, w, out);
    }
  } else {
    // The first device expert runs while the host computes its own experts; any further device
    // experts follow it one by one (the executor holds one launch at a time).
    const bool device = on_device();
    int64_t launched = -1;
    if (device) {
      for (int64_t j = 0; j < k && launched < 0; ++j) {
        const int32_t slot = weights_->slot(layer, sel_[j]);
        if (slot < 0) continue;
        if (absl::Status st = executor_->Launch(slot, xn, nullptr, 0); !st.ok()) {
          device_failed_ = true;
          device_status_ = absl::Status(
              st.code(), absl::StrCat("the device experts failed and run on the CPU from now on: ",
                                      st.message()));
          break;
        }
        launched = j;
      }
    }
    for (int64_t j = 0; j < k; ++j) {
      if (j == launched || (device && !device_failed_ && weights_->slot(layer, sel_[j]) >= 0)) {
        continue;
      }
      HostExpert(layer, sel_[j], xn, sel_w_[j], out);
    }
    for (int64_t j = launched; j >= 0 && j < k; ++j) {
      const int32_t slot = weights_->slot(layer, sel_[j]);
      if (slot < 0) continue;
      if (device_failed_) {
        HostExpert(layer, sel_[j], xn, sel_w_[j], out);
        continue;
      }
      absl::Status st = absl::OkStatus();
      if (j != launched) st = executor_->Launch(slot, xn, nullptr, 0);
      if (st.ok()) st = executor_->Wait(dev_out_.data(), nullptr, nullptr);
      if (!st.ok()) {
        device_failed_ = true;
        device_status_ = absl::Status(
            st.code(), absl::StrCat("the device experts failed and run on the CPU from now on: ",
                                    st.message()));
        HostExpert(layer, sel_[j], xn, sel_w_[j], out);
        continue;
      }
      const float w = sel_w_[j];
      for (int64_t c = 0; c < d; ++c) out[c] += w * dev_out_[c];
      ++device_calls_;
    }
  }
  SharedExpert(layer, xn, 1, out);
}

}  // namespace thermocline
