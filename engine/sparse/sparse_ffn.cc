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

// Keeps the (idx[j], value[j]) with keep(value[j]), in order, at the front; returns how many.
template <class Keep>
int64_t KeepWhere(int32_t* idx, float* value, int64_t n, Keep keep) {
  int64_t m = 0;
  for (int64_t j = 0; j < n; ++j) {
    if (keep(value[j])) {
      idx[m] = idx[j];
      value[m++] = value[j];
    }
  }
  return m;
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

absl::StatusOr<std::shared_ptr<const SparseWeights>> SparseWeights::Build(
    const LlamaModel& model, std::vector<SparseLayerPlan> plan, ThreadPool& pool) {
  const LlamaHparams& h = model.hparams();
  if (static_cast<int64_t>(plan.size()) != h.n_layer) {
    return absl::InvalidArgumentError(
        absl::StrCat("sparse plan has ", plan.size(), " layers, the model ", h.n_layer));
  }
  for (size_t l = 0; l < plan.size(); ++l) {
    const SparseLayerPlan& p = plan[l];
    const LayerWeights& L = model.layers()[l];
    if (!SparseRowsSupported(L.ffn_gate.type) || !SparseRowsSupported(L.ffn_up.type)) {
      return absl::UnimplementedError(
          absl::StrCat("layer ", l, ": FFN types ", TypeName(L.ffn_gate.type), "/",
                       TypeName(L.ffn_up.type), " have no sparse kernels"));
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
    if (!p.fire_count.empty() && static_cast<int64_t>(p.fire_count.size()) != h.n_ff) {
      return absl::InvalidArgumentError(absl::StrCat("layer ", l, ": ", p.fire_count.size(),
                                                     " firing counts for ", h.n_ff, " neurons"));
    }
  }
  std::shared_ptr<SparseWeights> w(new SparseWeights(model, std::move(plan)));
  for (size_t l = 0; l < w->plan_.size(); ++l) {
    const SparseLayerPlan& p = w->plan_[l];
    const LayerWeights& L = model.layers()[l];
    Layer y;
    // Hottest first; ties (and a plan without a profile) keep the model's order.
    y.neuron_of.resize(h.n_ff);
    for (int32_t i = 0; i < h.n_ff; ++i) y.neuron_of[i] = i;
    if (!p.fire_count.empty()) {
      std::stable_sort(y.neuron_of.begin(), y.neuron_of.end(),
                       [&](int32_t a, int32_t b) { return p.fire_count[a] > p.fire_count[b]; });
    }
    const int32_t* order = y.neuron_of.data();
    std::vector<int32_t> slot_of(h.n_ff);
    for (int32_t s = 0; s < h.n_ff; ++s) slot_of[order[s]] = s;
    // A neuron's gate and up rows side by side where they share a type: what the hardware
    // prefetcher streams past the end of a gate row is then its up row, needed when the gate
    // fires, not the next neuron's gate row. 1.1B synthetic model, 2 threads, 7 alternating
    // runs: median ratio 1.83x interleaved, 1.73x separate.
    absl::StatusOr<InterleavedGateUp> gu = InterleaveGateUp(pool, L.ffn_gate, L.ffn_up, order);
    if (gu.ok()) {
      y.gate_rows = std::move(gu->storage);
      y.gate = gu->gate;
      y.up = gu->up;
    } else {
      y.gate_rows = GatherRows(pool, L.ffn_gate, order, h.n_ff);
      y.up_rows = GatherRows(pool, L.ffn_up, order, h.n_ff);
      y.gate = y.gate_rows.view;
      y.up = y.up_rows.view;
    }
    // A PowerInfer file's own ffn_down_t is gathered as it is; else down is transposed.
    absl::StatusOr<OwnedWeight> down_t = L.ffn_down_t.data != nullptr
                                             ? GatherRows(pool, L.ffn_down_t, order, h.n_ff)
                                             : TransposeWeight(pool, L.ffn_down, order);
    if (!down_t.ok()) return down_t.status();
    y.down_t = *std::move(down_t);
    if (p.rank > 0) {
      const OwnedWeight fc2 = GatherRows(pool, p.fc2.view, order, h.n_ff);  // (n_ff, rank)
      absl::StatusOr<OwnedWeight> fc2_t = TransposeWeight(pool, fc2.view);  // (rank, n_ff)
      if (!fc2_t.ok()) return fc2_t.status();
      y.fc2_t = *std::move(fc2_t);
      y.b2.resize(h.n_ff);
      for (int32_t s = 0; s < h.n_ff; ++s) y.b2[s] = p.b2[order[s]];
    }
    y.on_device.assign(h.n_ff, 0);
    for (int32_t i : p.device_neurons) y.on_device[slot_of[i]] = 1;
    w->layers_.push_back(std::move(y));
  }
  return std::shared_ptr<const SparseWeights>(std::move(w));
}

uint64_t SparseWeights::bytes() const {
  uint64_t total = 0;
  for (const Layer& y : layers_) {
    total += y.gate_rows.data.size() + y.up_rows.data.size() + y.down_t.data.size() +
             y.fc2_t.data.size();
  }
  return total;
}

absl::StatusOr<std::unique_ptr<SparseFfn>> SparseFfn::Create(const LlamaModel& model,
                                                             std::vector<SparseLayerPlan> plan,
                                                             ThreadPool* pool,
                                                             const SparseFfnOptions& options) {
  absl::StatusOr<std::shared_ptr<const SparseWeights>> weights =
      SparseWeights::Build(model, std::move(plan), *pool);
  if (!weights.ok()) return weights.status();
  return Create(*std::move(weights), pool, options);
}

absl::StatusOr<std::unique_ptr<SparseFfn>> SparseFfn::Create(
    std::shared_ptr<const SparseWeights> weights, ThreadPool* pool,
    const SparseFfnOptions& options) {
  std::unique_ptr<SparseFfn> f(new SparseFfn(std::move(weights), pool, options));
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
  std::vector<std::vector<int32_t>> device_slots(plan().size());  // read while uploading
  for (size_t l = 0; l < plan().size(); ++l) {
    const SparseWeights::Layer& y = weights_->layer(static_cast<int>(l));
    gpu::GpuFfnLayerSpec layer;
    layer.gate = y.gate;
    layer.up = y.up;
    layer.down_t = y.down_t.view;
    for (int32_t s = 0; s < h.n_ff; ++s) {
      if (y.on_device[s]) device_slots[l].push_back(s);
    }
    layer.device_neurons = device_slots[l];
    layer.magnitude_threshold = plan()[l].magnitude_threshold;
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

SparseFfn::SparseFfn(std::shared_ptr<const SparseWeights> weights, ThreadPool* pool,
                     const SparseFfnOptions& options)
    : weights_(std::move(weights)), model_(weights_->model()), pool_(pool), options_(options) {
  const LlamaHparams& h = model_.hparams();
  int64_t max_rank = 0, max_conv = 0;
  for (size_t l = 0; l < plan().size(); ++l) {
    max_rank = std::max(max_rank, plan()[l].rank);
    const LayerWeights& L = model_.layers()[l];
    max_conv = std::max<int64_t>(max_conv, PreparedBytes(L.ffn_gate.type, h.n_embd));
    max_conv = std::max<int64_t>(max_conv, PreparedBytes(L.ffn_up.type, h.n_embd));
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
  hidden_idx_.resize(std::max<int64_t>(max_rank, 1));
  hidden_nz_.resize(std::max<int64_t>(max_rank, 1));
  const int n_lanes = pool_->size();
  lanes_.resize(n_lanes);
  for (Lane& lane : lanes_) {
    lane.idx.resize(h.n_ff);
    lane.gate.resize(h.n_ff);
    lane.up.resize(h.n_ff);
    lane.acc.resize(h.n_embd);
    lane.seen_predicted.resize(h.n_ff);
    lane.seen_up.resize(h.n_ff);
  }
  // Chunks that the threads claim as they come (a token's active set varies, and a static split
  // waited ≈ 20 µs per layer for the slower half), in guided sizes: each 1 / (2 · threads) of
  // the expected work left, down to kMinChunkWork of it, so that the last ones are short and the
  // threads finish together (equal chunks, 4 per thread, left one thread alone for 22 µs per
  // layer on average). A slot weighs its firing count plus the mean count (gate rows of
  // predicted neurons that do not fire; the colder slots' scattered rows cost more per row than
  // the hot block's stream). Bounds are multiples of kChunkAlign slots, so that a chunk of a
  // quantized fc2ᵀ row starts on a block.
  constexpr int64_t kChunkAlign = 64;
  constexpr double kMinChunkWork = 0.025;
  for (size_t l = 0; l < plan().size(); ++l) {
    const std::vector<int32_t>& count = plan()[l].fire_count;
    const std::vector<int32_t>& neuron_of = weights_->layer(static_cast<int>(l)).neuron_of;
    std::vector<double> cum(h.n_ff + 1, 0.0);
    double mean = 0;
    for (int32_t c : count) mean += c;
    mean = count.empty() ? 1.0 : mean / h.n_ff;
    for (int64_t s = 0; s < h.n_ff; ++s) {
      const double c = count.empty() ? 1.0 : count[neuron_of[s]];
      cum[s + 1] = cum[s] + c + mean;
    }
    std::vector<int64_t> bounds = {0};
    for (double done = 0; bounds.back() < h.n_ff;) {
      done += std::max(kMinChunkWork, (1.0 - done) / (2 * n_lanes));
      int64_t b = std::lower_bound(cum.begin(), cum.end(), cum[h.n_ff] * done) - cum.begin();
      b = done >= 1.0 ? h.n_ff : (b + kChunkAlign / 2) / kChunkAlign * kChunkAlign;
      b = std::min<int64_t>(b, h.n_ff);
      if (b > bounds.back()) bounds.push_back(b);  // empty chunks dropped
    }
    chunk_bounds_.push_back(std::move(bounds));
  }
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

void SparseFfn::ForwardTokenFused(int layer, const float* xn, float* out) {
  const auto t0 = std::chrono::steady_clock::now();
  const LlamaHparams& h = model_.hparams();
  const SparseWeights::Layer& y = weights_->layer(layer);
  const SparseLayerPlan& p = plan()[layer];
  n_hidden_nz_ = 0;
  if (p.rank > 0) {
    MatMul(*pool_, p.fc1.view, xn, 1, hidden_.data(), matmul_scratch_);
    for (int64_t j = 0; j < p.rank; ++j) {
      const float v = hidden_[j] + p.b1[j];
      if (v > 0.0f) {
        hidden_idx_[n_hidden_nz_] = static_cast<int32_t>(j);
        hidden_nz_[n_hidden_nz_++] = v;
      }
    }
  }
  const auto t1 = std::chrono::steady_clock::now();
  PrepareActivations(y.gate.type, isa_, xn, h.n_embd, x_gate_.data());
  if (y.up.type != y.gate.type) {
    PrepareActivations(y.up.type, isa_, xn, h.n_embd, x_up_.data());
  }
  next_chunk_.store(0, std::memory_order_relaxed);
  if (observer_ != nullptr) observer_->OnLayer(layer);
  pool_->Run([&](int lane) { RunLane(layer, lane); });
  std::copy_n(lanes_[0].acc.data(), h.n_embd, out);
  for (size_t k = 1; k < lanes_.size(); ++k) {
    const float* acc = lanes_[k].acc.data();
    for (int64_t i = 0; i < h.n_embd; ++i) out[i] += acc[i];
  }
  const auto t2 = std::chrono::steady_clock::now();
  stats_.layer_tokens += 1;
  for (const Lane& lane : lanes_) {
    stats_.predicted += static_cast<double>(lane.predicted);
    stats_.fired += static_cast<double>(lane.fired);
  }
  // fc1 before the lanes, fc2 and the threshold inside lane 0's chunks (the others run
  // alongside).
  stats_.predictor_s += p.rank > 0 ? Seconds(t0, t1) + lanes_[0].predictor_s : 0.0;
  stats_.total_s += Seconds(t0, t2);
}

void SparseFfn::RunLane(int layer, int lane_index) {
  Lane& lane = lanes_[lane_index];
  lane.predicted = lane.fired = 0;
  lane.predictor_s = 0;
  std::fill(lane.acc.begin(), lane.acc.end(), 0.0f);
  const std::vector<int64_t>& bounds = chunk_bounds_[layer];
  const int n_chunks = static_cast<int>(bounds.size()) - 1;
  for (int c = next_chunk_.fetch_add(1, std::memory_order_relaxed); c < n_chunks;
       c = next_chunk_.fetch_add(1, std::memory_order_relaxed)) {
    RunChunk(layer, lane, bounds[c], bounds[c + 1], lane_index == 0);
  }
}

void SparseFfn::RunChunk(int layer, Lane& lane, int64_t begin, int64_t end, bool time_it) {
  const auto t0 = std::chrono::steady_clock::now();
  const LlamaHparams& h = model_.hparams();
  const SparseWeights::Layer& y = weights_->layer(layer);
  const SparseLayerPlan& p = plan()[layer];
  int32_t* idx = lane.idx.data();
  float* gate = lane.gate.data();
  float* up = lane.up.data();
  int64_t n = 0;
  if (p.rank > 0) {
    // This chunk's logits: fc2ᵀ rows of the hidden units that fired, restricted to its slots.
    float* logits = logits_.data() + begin;
    std::fill(logits, logits + (end - begin), 0.0f);
    SparseAxpyRows(isa_, y.fc2_t.view, begin, end - begin, hidden_idx_.data(), hidden_nz_.data(),
                   n_hidden_nz_, logits);
    const float thr = p.threshold;
    const float* b2 = y.b2.data();
    for (int64_t s = begin; s < end; ++s) {
      if (logits[s - begin] + b2[s] > thr) idx[n++] = static_cast<int32_t>(s);
    }
  } else {
    for (int64_t s = begin; s < end; ++s) idx[n++] = static_cast<int32_t>(s);
  }
  if (time_it) lane.predictor_s += Seconds(t0, std::chrono::steady_clock::now());
  lane.predicted += n;
  const int64_t n_predicted = n;
  if (observer_ != nullptr) std::copy_n(idx, n, lane.seen_predicted.data());
  const WeightView& gw = y.gate;
  const WeightView& uw = y.up;
  const void* x_up = uw.type == gw.type ? x_gate_.data() : x_up_.data();
  SparseRowDots(isa_, gw, x_gate_.data(), idx, n, gate);
  // ReLU family: up rows only for the neurons whose gate fired.
  if (GateDecides(h.activation)) n = KeepWhere(idx, gate, n, [](float g) { return g > 0.0f; });
  if (observer_ != nullptr) std::copy_n(idx, n, lane.seen_up.data());
  SparseRowDots(isa_, uw, x_up, idx, n, up);
  GatedActivation(h.activation, gate, up, n);
  // Below the magnitude threshold (and exact zeros): dropped before down reads their rows.
  const float thr = p.magnitude_threshold;
  const int64_t m =
      KeepWhere(idx, gate, n, [thr](float a) { return std::fabs(a) > thr && a != 0.0f; });
  lane.fired += m;
  if (observer_ != nullptr) {
    observer_->OnChunk(layer, {lane.seen_predicted.data(), static_cast<size_t>(n_predicted)},
                       {lane.seen_up.data(), static_cast<size_t>(n)},
                       {idx, static_cast<size_t>(m)});
  }
  SparseAxpyRows(isa_, y.down_t.view, 0, h.n_embd, idx, gate, m, lane.acc.data());
}

void SparseFfn::ForwardToken(int layer, const float* xn, float* out) {
  if (!options_.oracle && device_ == nullptr) {
    ForwardTokenFused(layer, xn, out);
    return;
  }
  const auto t0 = std::chrono::steady_clock::now();
  const LlamaHparams& h = model_.hparams();
  const SparseWeights::Layer& y = weights_->layer(layer);
  const SparseLayerPlan& p = plan()[layer];
  const uint8_t* dev = y.on_device.data();
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
    MatMul(*pool_, y.gate, xn, 1, dense_gate_.data(), matmul_scratch_);
    MatMul(*pool_, y.up, xn, 1, dense_up_.data(), matmul_scratch_);
    GatedActivation(h.activation, dense_gate_.data(), dense_up_.data(), h.n_ff);
    for (int64_t i = 0; i < h.n_ff; ++i) {
      if (std::fabs(dense_gate_[i]) > p.magnitude_threshold) add(i, dense_gate_[i], true);
    }
  } else if (p.rank > 0) {
    MatMul(*pool_, p.fc1.view, xn, 1, hidden_.data(), matmul_scratch_);
    for (int64_t j = 0; j < p.rank; ++j) hidden_[j] = std::max(0.0f, hidden_[j] + p.b1[j]);
    // fc2 as an axpy over its transposed rows: rank rows of n_ff stream well where n_ff rows
    // of rank elements would not, and the hidden units relu zeroed are skipped.
    SparseAxpy(*pool_, isa_, y.fc2_t.view, rank_ids_.data(), hidden_.data(), p.rank, logits_.data(),
               predictor_scratch_);
    const float thr = p.threshold;
    for (int64_t i = 0; i < h.n_ff; ++i) {
      if (logits_[i] + y.b2[i] > thr) add(static_cast<int32_t>(i), 0.0f, false);
    }
  } else {
    for (int64_t i = 0; i < h.n_ff; ++i) add(static_cast<int32_t>(i), 0.0f, false);
  }
  const auto t1 = std::chrono::steady_clock::now();
  if (!have_act) {
    // xn prepared once per layer (once for both when gate and up share a type), shared
    // read-only by both executors.
    PrepareActivations(y.gate.type, isa_, xn, h.n_embd, x_gate_.data());
    if (y.up.type != y.gate.type) {
      PrepareActivations(y.up.type, isa_, xn, h.n_embd, x_up_.data());
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
  const SparseWeights::Layer& y = weights_->layer(layer);
  const SparseLayerPlan& p = plan()[layer];
  ThreadPool& pool = *e.pool;
  if (!have_act) {
    const WeightView& gate = y.gate;
    const WeightView& up = y.up;
    const void* x_up = up.type == gate.type ? x_gate_.data() : x_up_.data();
    if (GateDecides(model_.hparams().activation)) {
      // ReLU family: a neuron whose gate is <= 0 is zero whatever its up, so up (and down)
      // rows are read only for the neurons whose gate fired.
      SparseMatVec(pool, isa_, gate, x_gate_.data(), e.idx.data(), n, e.gate.data());
      n = KeepWhere(e.idx.data(), e.gate.data(), n, [](float g) { return g > 0.0f; });
      SparseMatVec(pool, isa_, up, x_up, e.idx.data(), n, e.up.data());
    } else {
      SparseGateUp(pool, isa_, gate, x_gate_.data(), up, x_up, e.idx.data(), n, e.gate.data(),
                   e.up.data());
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
  SparseAxpy(pool, isa_, y.down_t.view, e.idx.data(), e.gate.data(), n, e.out.data(), e.scratch);
}

double SparseFfn::NonFfnBytesPerToken() const {
  double bytes = static_cast<double>(model_.output().row_bytes) * model_.output().rows;
  for (const LayerWeights& L : model_.layers()) {
    for (const WeightView* w : {&L.wq, &L.wk, &L.wv, &L.wo}) {
      bytes += static_cast<double>(w->row_bytes) * w->rows;
    }
  }
  return bytes;
}

double SparseFfn::DenseBytesPerToken() const {
  double bytes = NonFfnBytesPerToken();
  for (const LayerWeights& L : model_.layers()) {
    for (const WeightView* w : {&L.ffn_gate, &L.ffn_up, &L.ffn_down}) {
      bytes += static_cast<double>(w->row_bytes) * w->rows;
    }
  }
  return bytes;
}

double SparseFfn::PredictorBytesPerToken() const {
  if (options_.oracle) return 0;
  double bytes = 0;
  for (const SparseLayerPlan& p : plan()) {
    if (p.rank == 0) continue;
    bytes += static_cast<double>(p.fc1.view.row_bytes) * p.fc1.view.rows +
             static_cast<double>(p.fc2.view.row_bytes) * p.fc2.view.rows +
             4.0 * (p.rank + p.b2.size());
  }
  return bytes;
}

double SparseFfn::SparseBytesPerToken() const {
  double bytes = NonFfnBytesPerToken();
  const double predicted_per_layer = stats_.predicted / std::max<int64_t>(1, stats_.layer_tokens);
  const double fired_per_layer = stats_.fired / std::max<int64_t>(1, stats_.layer_tokens);
  for (size_t l = 0; l < plan().size(); ++l) {
    const LayerWeights& L = model_.layers()[l];
    // Up rows are read for the predicted neurons, or (ReLU family) those whose gate fired.
    const double up_rows =
        GateDecides(model_.hparams().activation) ? fired_per_layer : predicted_per_layer;
    const double gu =
        options_.oracle ? (L.ffn_gate.row_bytes + L.ffn_up.row_bytes) * L.ffn_gate.rows
                        : L.ffn_gate.row_bytes * predicted_per_layer + L.ffn_up.row_bytes * up_rows;
    bytes += gu + weights_->layer(static_cast<int>(l)).down_t.view.row_bytes * fired_per_layer;
  }
  return bytes + PredictorBytesPerToken();
}

}  // namespace thermocline
