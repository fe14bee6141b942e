// SparseFfn: predictor → active set → neuron-aware operators, optionally split between a host
// and a device executor that run concurrently and meet in one sum.
#include "engine/sparse/sparse_ffn.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "engine/model/cpu_ops.h"

namespace thermocline {

namespace {
// Activations that are zero wherever the gate is <= 0 (ReGLU, dReLU).
bool GateDecides(FfnActivation a) {
  return a == FfnActivation::kRelu || a == FfnActivation::kDRelu;
}

double Seconds(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}
}  // namespace

// One executor's buffers: its part of the active set and its partial output.
struct SparseFfn::Executor {
  ThreadPool* pool = nullptr;
  std::vector<int32_t> idx;  // (n_ff) active neurons of this part
  std::vector<float> gate;   // (n_ff) compact: gate of idx[j], then the activation
  std::vector<float> up;     // (n_ff)
  std::vector<float> out;    // (n_embd)
  SparseScratch scratch;
  int64_t fired = 0;

  Executor(ThreadPool* p, int64_t n_embd, int64_t n_ff)
      : pool(p), idx(n_ff), gate(n_ff), up(n_ff), out(n_embd) {
    scratch.Reserve(p->size(), n_embd, n_ff);
  }
};

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

absl::StatusOr<std::unique_ptr<SparseFfn>> SparseFfn::Create(const LlamaModel& model,
                                                             std::vector<SparseLayerPlan> plan,
                                                             ThreadPool* pool,
                                                             const SparseFfnOptions& options) {
  const LlamaHparams& h = model.hparams();
  if (static_cast<int64_t>(plan.size()) != h.n_layer) {
    return absl::InvalidArgumentError(
        absl::StrCat("sparse plan has ", plan.size(), " layers, the model ", h.n_layer));
  }
  for (size_t l = 0; l < plan.size(); ++l) {
    const SparseLayerPlan& p = plan[l];
    const LayerWeights& L = model.layers()[l];
    if (KernelsFor(L.ffn_gate.type) == nullptr || KernelsFor(L.ffn_up.type) == nullptr) {
      return absl::UnimplementedError(absl::StrCat("layer ", l, ": FFN type has no kernels"));
    }
    if (p.rank > 0 &&
        (p.fc1.view.rows != p.rank || p.fc1.view.cols != h.n_embd || p.fc2.view.rows != h.n_ff ||
         p.fc2.view.cols != p.rank || static_cast<int64_t>(p.b1.size()) != p.rank ||
         static_cast<int64_t>(p.b2.size()) != h.n_ff)) {
      return absl::InvalidArgumentError(absl::StrCat("layer ", l, ": predictor shapes"));
    }
    for (int32_t i : p.device_neurons) {
      if (i < 0 || i >= h.n_ff) {
        return absl::InvalidArgumentError(absl::StrCat("layer ", l, ": neuron ", i));
      }
    }
  }
  std::unique_ptr<SparseFfn> f(new SparseFfn(model, std::move(plan), pool, options));
  for (const LayerWeights& L : model.layers()) {
    if (L.ffn_down_t.data != nullptr) {
      f->down_t_.push_back(OwnedWeight{L.ffn_down_t, {}});
      continue;
    }
    absl::StatusOr<OwnedWeight> t = TransposeWeight(*pool, L.ffn_down);
    if (!t.ok()) return t.status();
    f->down_t_.push_back(*std::move(t));
  }
  for (const SparseLayerPlan& p : f->plan_) {
    OwnedWeight t;
    if (p.rank > 0) {
      absl::StatusOr<OwnedWeight> tr = TransposeWeight(*pool, p.fc2.view);  // (rank, n_ff)
      if (!tr.ok()) return tr.status();
      t = *std::move(tr);
    }
    f->fc2_t_.push_back(std::move(t));
  }
  if (options.gpu) {
    if (absl::Status s = f->StartGpu(); !s.ok()) return s;
  }
  return f;
}

absl::Status SparseFfn::StartGpu() {
  const LlamaHparams& h = model_.hparams();
  gpu::GpuFfnSpec spec;
  spec.n_embd = h.n_embd;
  spec.n_ff = h.n_ff;
  spec.activation = h.activation;
  spec.memory_cap = options_.gpu_memory;
  for (size_t l = 0; l < plan_.size(); ++l) {
    const LayerWeights& L = model_.layers()[l];
    gpu::GpuFfnLayerSpec layer;
    layer.gate = L.ffn_gate;
    layer.up = L.ffn_up;
    layer.down_t = down_t_[l].view;
    layer.device_neurons = plan_[l].device_neurons;
    layer.magnitude_threshold = plan_[l].magnitude_threshold;
    spec.layers.push_back(layer);  // the host picks the active set: no predictor on the GPU
  }
  absl::StatusOr<std::unique_ptr<gpu::GpuFfnExecutor>> e = gpu::CreateGpuFfnExecutor(spec);
  if (e.ok()) {
    gpu_ = *std::move(e);
    gpu_status_ = absl::OkStatus();
  } else if (absl::IsUnavailable(e.status())) {
    gpu_status_ = e.status();  // no device: the device part runs on the CPU executor
  } else {
    return e.status();
  }
  return absl::OkStatus();
}

SparseFfn::SparseFfn(const LlamaModel& model, std::vector<SparseLayerPlan> plan, ThreadPool* pool,
                     const SparseFfnOptions& options)
    : model_(model), plan_(std::move(plan)), pool_(pool), options_(options) {
  const LlamaHparams& h = model.hparams();
  int64_t max_rank = 0, max_conv = 0;
  for (size_t l = 0; l < plan_.size(); ++l) {
    max_rank = std::max(max_rank, plan_[l].rank);
    const LayerWeights& L = model.layers()[l];
    max_conv = std::max<int64_t>(max_conv, PreparedBytes(L.ffn_gate.type, h.n_embd));
    max_conv = std::max<int64_t>(max_conv, PreparedBytes(L.ffn_up.type, h.n_embd));
    std::vector<uint8_t> dev(h.n_ff, 0);
    for (int32_t i : plan_[l].device_neurons) dev[i] = 1;
    on_device_.push_back(std::move(dev));
  }
  x_gate_.resize(max_conv);
  x_up_.resize(max_conv);
  hidden_.resize(std::max<int64_t>(max_rank, 1));
  rank_ids_.resize(std::max<int64_t>(max_rank, 1));
  for (size_t k = 0; k < rank_ids_.size(); ++k) rank_ids_[k] = static_cast<int32_t>(k);
  predictor_scratch_.Reserve(pool_->size(), h.n_ff, std::max<int64_t>(max_rank, 1));
  logits_.resize(h.n_ff);
  dense_gate_.resize(h.n_ff);
  dense_up_.resize(h.n_ff);
  matmul_scratch_.Reserve(1, std::max(h.n_embd, std::max<int64_t>(max_rank, 1)));
  host_ = std::make_unique<Executor>(pool_, h.n_embd, h.n_ff);
  if (options_.split || options_.gpu) {
    device_pool_ = std::make_unique<ThreadPool>(std::max(1, options_.device_threads));
    dispatch_pool_ = std::make_unique<ThreadPool>(2);
    device_ = std::make_unique<Executor>(device_pool_.get(), h.n_embd, h.n_ff);
  }
}

SparseFfn::~SparseFfn() = default;

void SparseFfn::Forward(int layer, const float* x, const float* xn, int64_t n_tokens, float* out) {
  if (n_tokens > 1 && options_.dense_prefill && session_ != nullptr) {
    session_->DenseFfn(layer, x, xn, n_tokens, out);
    return;
  }
  const int64_t d = model_.hparams().n_embd;
  for (int64_t t = 0; t < n_tokens; ++t) ForwardToken(layer, xn + t * d, out + t * d);
}

void SparseFfn::ForwardToken(int layer, const float* xn, float* out) {
  const auto t0 = std::chrono::steady_clock::now();
  const LlamaHparams& h = model_.hparams();
  const LayerWeights& L = model_.layers()[layer];
  const SparseLayerPlan& p = plan_[layer];
  const uint8_t* dev = on_device_[layer].data();
  Executor& host = *host_;
  Executor* device = device_ ? device_.get() : nullptr;
  int64_t n_host = 0, n_dev = 0;
  auto add = [&](int32_t i, float act, bool have_act) {
    Executor& e = (device != nullptr && dev[i]) ? *device : host;
    int64_t& n = (&e == &host) ? n_host : n_dev;
    e.idx[n] = i;
    if (have_act) e.gate[n] = act;
    ++n;
  };
  const bool have_act = options_.oracle;
  if (options_.oracle) {
    // Exact active set: dense gate/up, neurons whose activation passes the threshold.
    MatMul(*pool_, L.ffn_gate, xn, 1, dense_gate_.data(), matmul_scratch_);
    MatMul(*pool_, L.ffn_up, xn, 1, dense_up_.data(), matmul_scratch_);
    GatedActivation(h.activation, dense_gate_.data(), dense_up_.data(), h.n_ff);
    for (int64_t i = 0; i < h.n_ff; ++i) {
      if (std::fabs(dense_gate_[i]) > p.magnitude_threshold) add(i, dense_gate_[i], true);
    }
  } else if (p.rank > 0) {
    MatMul(*pool_, p.fc1.view, xn, 1, hidden_.data(), matmul_scratch_);
    for (int64_t j = 0; j < p.rank; ++j) hidden_[j] = std::max(0.0f, hidden_[j] + p.b1[j]);
    // fc2 as an axpy over its transposed rows: rank rows of n_ff stream well where n_ff rows
    // of rank elements would not, and the hidden units relu zeroed are skipped.
    SparseAxpy(*pool_, isa_, fc2_t_[layer].view, rank_ids_.data(), hidden_.data(), p.rank,
               logits_.data(), predictor_scratch_);
    const float thr = p.threshold;
    for (int64_t i = 0; i < h.n_ff; ++i) {
      if (logits_[i] + p.b2[i] > thr) add(static_cast<int32_t>(i), 0.0f, false);
    }
  } else {
    for (int64_t i = 0; i < h.n_ff; ++i) add(static_cast<int32_t>(i), 0.0f, false);
  }
  const auto t1 = std::chrono::steady_clock::now();
  if (!have_act) {
    // xn prepared once per layer (once for both when gate and up share a type), shared
    // read-only by both executors.
    PrepareActivations(L.ffn_gate.type, isa_, xn, h.n_embd, x_gate_.data());
    if (L.ffn_up.type != L.ffn_gate.type) {
      PrepareActivations(L.ffn_up.type, isa_, xn, h.n_embd, x_up_.data());
    }
  }
  if (gpu_ != nullptr && n_dev > 0) {
    // The GPU computes the device part while this thread's pool computes the host part.
    absl::Status st = gpu_->Launch(layer, xn, device->idx.data(), n_dev);
    RunPart(layer, host, n_host, have_act);
    int64_t predicted = 0, fired = 0;
    if (st.ok()) st = gpu_->Wait(device->out.data(), &predicted, &fired);
    if (st.ok()) {
      device->fired = fired;
    } else {
      RunPart(layer, *device, n_dev, have_act);  // a failed launch falls back to the CPU
    }
    for (int64_t i = 0; i < h.n_embd; ++i) out[i] = host.out[i] + device->out[i];
  } else if (device != nullptr && n_dev > 0) {
    dispatch_pool_->Run([&](int thread) {
      if (thread == 0) {
        RunPart(layer, host, n_host, have_act);
      } else {
        RunPart(layer, *device, n_dev, have_act);
      }
    });
    for (int64_t i = 0; i < h.n_embd; ++i) out[i] = host.out[i] + device->out[i];
  } else {
    RunPart(layer, host, n_host, have_act);
    std::copy_n(host.out.data(), h.n_embd, out);
  }
  const auto t2 = std::chrono::steady_clock::now();
  stats_.layer_tokens += 1;
  stats_.predicted += static_cast<double>(n_host + n_dev);
  stats_.fired += static_cast<double>(host.fired + (device ? device->fired : 0));
  if (device) device->fired = 0;
  stats_.predictor_s += options_.oracle ? 0.0 : Seconds(t0, t1);
  stats_.total_s += Seconds(t0, t2);
}

void SparseFfn::RunPart(int layer, Executor& e, int64_t n, bool have_act) {
  const LayerWeights& L = model_.layers()[layer];
  const SparseLayerPlan& p = plan_[layer];
  ThreadPool& pool = *e.pool;
  if (!have_act) {
    const void* x_up = L.ffn_up.type == L.ffn_gate.type ? x_gate_.data() : x_up_.data();
    if (GateDecides(model_.hparams().activation)) {
      // ReLU family: a neuron whose gate is <= 0 is zero whatever its up, so up (and down)
      // rows are read only for the neurons whose gate fired.
      SparseMatVec(pool, isa_, L.ffn_gate, x_gate_.data(), e.idx.data(), n, e.gate.data());
      int64_t m = 0;
      for (int64_t j = 0; j < n; ++j) {
        if (e.gate[j] > 0.0f) {
          e.idx[m] = e.idx[j];
          e.gate[m++] = e.gate[j];
        }
      }
      n = m;
      SparseMatVec(pool, isa_, L.ffn_up, x_up, e.idx.data(), n, e.up.data());
    } else {
      SparseGateUp(pool, isa_, L.ffn_gate, x_gate_.data(), L.ffn_up, x_up, e.idx.data(), n,
                   e.gate.data(), e.up.data());
    }
    GatedActivation(model_.hparams().activation, e.gate.data(), e.up.data(), n);
    // Predicted but below the magnitude threshold: dropped (SparseAxpy skips the zeros).
    const float thr = p.magnitude_threshold;
    for (int64_t j = 0; j < n; ++j) {
      if (std::fabs(e.gate[j]) <= thr) e.gate[j] = 0.0f;
    }
  }
  int64_t fired = 0;
  for (int64_t j = 0; j < n; ++j) fired += e.gate[j] != 0.0f;
  e.fired = fired;
  const OwnedWeight& dt = down_t_[layer];
  SparseAxpy(pool, isa_, dt.view, e.idx.data(), e.gate.data(), n, e.out.data(), e.scratch);
}

double SparseFfn::DenseBytesPerToken() const {
  double bytes = static_cast<double>(model_.output().row_bytes) * model_.output().rows;
  for (const LayerWeights& L : model_.layers()) {
    for (const WeightView* w : {&L.wq, &L.wk, &L.wv, &L.wo, &L.ffn_gate, &L.ffn_up, &L.ffn_down}) {
      bytes += static_cast<double>(w->row_bytes) * w->rows;
    }
  }
  return bytes;
}

double SparseFfn::PredictorBytesPerToken() const {
  if (options_.oracle) return 0;
  double bytes = 0;
  for (const SparseLayerPlan& p : plan_) {
    if (p.rank == 0) continue;
    bytes += static_cast<double>(p.fc1.view.row_bytes) * p.fc1.view.rows +
             static_cast<double>(p.fc2.view.row_bytes) * p.fc2.view.rows +
             4.0 * (p.rank + p.b2.size());
  }
  return bytes;
}

double SparseFfn::SparseBytesPerToken() const {
  double bytes = static_cast<double>(model_.output().row_bytes) * model_.output().rows;
  const double predicted_per_layer = stats_.predicted / std::max<int64_t>(1, stats_.layer_tokens);
  const double fired_per_layer = stats_.fired / std::max<int64_t>(1, stats_.layer_tokens);
  for (size_t l = 0; l < plan_.size(); ++l) {
    const LayerWeights& L = model_.layers()[l];
    for (const WeightView* w : {&L.wq, &L.wk, &L.wv, &L.wo}) {
      bytes += static_cast<double>(w->row_bytes) * w->rows;
    }
    // Up rows are read for the predicted neurons, or (ReLU family) those whose gate fired.
    const double up_rows =
        GateDecides(model_.hparams().activation) ? fired_per_layer : predicted_per_layer;
    const double gu =
        options_.oracle ? (L.ffn_gate.row_bytes + L.ffn_up.row_bytes) * L.ffn_gate.rows
                        : L.ffn_gate.row_bytes * predicted_per_layer + L.ffn_up.row_bytes * up_rows;
    bytes += gu + down_t_[l].view.row_bytes * fired_per_layer;
  }
  return bytes + PredictorBytesPerToken();
}

}  // namespace thermocline
