// SparseFfn: predictor → active set → neuron-aware operators, optionally split between a host
// and a device executor that run concurrently and meet in one sum.
#include "engine/sparse/sparse_ffn.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "engine/model/cpu_ops.h"
#include "engine/model/model_support.h"

namespace thermocline {

namespace {
double Seconds(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// Keeps the (idx[j], value[j]) with keep(value[j]), in order, at the front; returns how many.
template <class Keep>
int64_t KeepWhere(int32_t* idx, float* value, int64_t n, Keep keep) {
  int64_t m = 0;
  for (int64_t j = 0; j < n; ++j) {  // without a branch on the data, as PredictSlots
    const int32_t i = idx[j];
    const float v = value[j];
    idx[m] = i;
    value[m] = v;
    m += keep(v) ? 1 : 0;
  }
  return m;
}
}  // namespace

GgmlType InputSparseTType(const WeightView& w) {
  const GgmlType type = DownTType(w);
  if (type == GgmlType::kQ4_0 && w.rows % TypeInfo(GgmlType::kQ8_0).block_size == 0) {
    return GgmlType::kQ8_0;
  }
  return type;
}

namespace {
// An input-sparse layer's copies (SparseWeights::Layer): every projection but o laid out for the
// column-sparse mat-vec, in the model's neuron order, no device part; gate and up view the
// model's matrices.
absl::StatusOr<SparseWeights::Layer> BuildInputSparseLayer(const LayerWeights& L,
                                                           const LlamaHparams& h,
                                                           ThreadPool& pool) {
  SparseWeights::Layer y;
  y.neuron_of.resize(h.n_ff);
  for (int32_t i = 0; i < h.n_ff; ++i) y.neuron_of[i] = i;
  y.gate = L.ffn_gate;
  y.up = L.ffn_up;
  struct Copy {
    const WeightView* from;
    ColumnWeight* to;
  };
  std::vector<Copy> copies = {Copy{&L.ffn_gate, &y.gate_c}, Copy{&L.ffn_up, &y.up_c},
                              Copy{&L.ffn_down, &y.down_c}};
  // q, k and v stacked where BuildStacked takes them (one type, the integer form); else apart,
  // where Build reports what is wrong with any of them.
  const WeightView* qkv[] = {&L.wq, &L.wk, &L.wv};
  if (absl::StatusOr<ColumnWeight> stacked = ColumnWeight::BuildStacked(pool, qkv, BestIsa());
      stacked.ok()) {
    y.qkv_c = *std::move(stacked);
  } else {
    copies.insert(copies.begin(), {Copy{&L.wq, &y.q_c}, Copy{&L.wk, &y.k_c}, Copy{&L.wv, &y.v_c}});
  }
  for (const Copy& c : copies) {
    absl::StatusOr<ColumnWeight> t = ColumnWeight::Build(pool, *c.from, BestIsa());
    if (!t.ok()) return t.status();
    *c.to = *std::move(t);
  }
  return y;
}

// Bounds of part `part` of `parts` over [0, n), on multiples of kColumnChunk (whole blocks of
// down's inputs when the parts are slices of the neurons, so that their quantization does not
// depend on the thread count; a multiple of every block a float-form copy has) but for the last.
int64_t SliceBound(int64_t n, int part, int parts) {
  if (part >= parts) return n;
  return std::min(n, n * part / parts / kColumnChunk * kColumnChunk);
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

absl::StatusOr<std::shared_ptr<const SparseWeights>> SparseWeights::Build(
    const LlamaModel& model, std::vector<SparseLayerPlan> plan, ThreadPool& pool) {
  const LlamaHparams& h = model.hparams();
  if (absl::Status s = RequireGatedFfn(model, "the sparse FFN"); !s.ok()) return s;
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
    if (p.method != SparseMethod::kPredicted && (GateDecides(h.activation) || p.rank > 0)) {
      return absl::InvalidArgumentError(
          absl::StrCat("layer ", l, ": ", SparseMethodName(p.method),
                       " is for SwiGLU/GeGLU layers without a predictor (",
                       ActivationName(h.activation), ", rank ", p.rank, ")"));
    }
    for (int32_t i : p.device_neurons) {
      if (i < 0 || i >= h.n_ff) {
        return absl::InvalidArgumentError(absl::StrCat("layer ", l, ": neuron ", i));
      }
    }
    if (!p.gate_scale.empty() && static_cast<int64_t>(p.gate_scale.size()) != h.n_ff) {
      return absl::InvalidArgumentError(absl::StrCat("layer ", l, ": ", p.gate_scale.size(),
                                                     " gate scales for ", h.n_ff, " neurons"));
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
    if (p.method == SparseMethod::kInputSparse) {
      absl::StatusOr<Layer> y = BuildInputSparseLayer(L, h, pool);
      if (!y.ok()) return y.status();
      w->layers_.push_back(*std::move(y));
      continue;
    }
    Layer y;
    // The placement's device neurons first, then the rest; hottest first within each; ties (and
    // a plan without a profile) keep the model's order. The device part is then the slots
    // [0, n_device) and the host's a contiguous range after it.
    std::vector<uint8_t> device(h.n_ff, 0);
    for (int32_t i : p.device_neurons) device[i] = 1;
    y.n_device = std::count(device.begin(), device.end(), 1);
    y.neuron_of.resize(h.n_ff);
    for (int32_t i = 0; i < h.n_ff; ++i) y.neuron_of[i] = i;
    std::stable_sort(y.neuron_of.begin(), y.neuron_of.end(), [&](int32_t a, int32_t b) {
      if (device[a] != device[b]) return device[a] > device[b];
      return !p.fire_count.empty() && p.fire_count[a] > p.fire_count[b];
    });
    const int32_t* order = y.neuron_of.data();
    // A PowerInfer file's own ffn_down_t is gathered as it is; else down is transposed.
    absl::StatusOr<OwnedWeight> down_t = L.ffn_down_t.data != nullptr
                                             ? GatherRows(pool, L.ffn_down_t, order, h.n_ff)
                                             : TransposeWeight(pool, L.ffn_down, order);
    if (!down_t.ok()) return down_t.status();
    // A neuron's gate, up and down_t rows side by side (InterleaveGateUp): a fired neuron is
    // then one contiguous read, which the hardware prefetchers follow from its gate row on,
    // rather than two scattered ones (docs/sparse.md, "Measured effects the design rests on").
    // Gate-first layers read every gate row and few up rows: kept apart, gate is one stream.
    absl::StatusOr<InterleavedGateUp> gu =
        absl::FailedPreconditionError("gate-first: gate and up apart");
    if (p.method != SparseMethod::kGateFirst) {
      gu = InterleaveGateUp(pool, L.ffn_gate, L.ffn_up, order, &down_t->view);
    }
    if (gu.ok()) {  // all three in gate_rows; down_t's own copy is dropped here
      y.gate_rows = std::move(gu->storage);
      y.gate = gu->gate;
      y.up = gu->up;
      y.down_t = gu->down_t;
    } else {
      y.gate_rows = GatherRows(pool, L.ffn_gate, order, h.n_ff);
      y.up_rows = GatherRows(pool, L.ffn_up, order, h.n_ff);
      y.down_t_rows = *std::move(down_t);
      y.gate = y.gate_rows.view;
      y.up = y.up_rows.view;
      y.down_t = y.down_t_rows.view;
    }
    if (p.rank > 0) {
      const OwnedWeight fc2 = GatherRows(pool, p.fc2.view, order, h.n_ff);  // (n_ff, rank)
      absl::StatusOr<OwnedWeight> fc2_t = TransposeWeight(pool, fc2.view);  // (rank, n_ff)
      if (!fc2_t.ok()) return fc2_t.status();
      y.fc2_t = *std::move(fc2_t);
      y.b2.resize(h.n_ff);
      for (int32_t s = 0; s < h.n_ff; ++s) y.b2[s] = p.b2[order[s]];
    }
    if (!p.gate_scale.empty()) {
      y.gate_scale.resize(h.n_ff);
      for (int32_t s = 0; s < h.n_ff; ++s) y.gate_scale[s] = p.gate_scale[order[s]];
    }
    w->layers_.push_back(std::move(y));
    // The copies replace the file's FFN of this layer (SparseWeights' comment).
    const GgufFile& file = model.gguf();
    for (const WeightView* v : {&L.ffn_gate, &L.ffn_up, &L.ffn_down, &L.ffn_down_t}) {
      if (v->data != nullptr) {
        w->released_file_bytes_ += file.ReleasePages(v->data, v->rows * v->row_bytes);
      }
    }
  }
  return std::shared_ptr<const SparseWeights>(std::move(w));
}

uint64_t SparseWeights::bytes() const {
  uint64_t total = 0;
  for (const Layer& y : layers_) {
    total += y.gate_rows.data.size() + y.up_rows.data.size() + y.down_t_rows.data.size() +
             y.fc2_t.data.size();
    for (const ColumnWeight* c :
         {&y.qkv_c, &y.q_c, &y.k_c, &y.v_c, &y.gate_c, &y.up_c, &y.down_c}) {
      total += c->bytes();
    }
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
  spec.budget = options_.gpu_budget;
  spec.queue = options_.gpu_queue;
  // Read while the executor uploads: the device slots and fc2 in slot order.
  std::vector<std::vector<int32_t>> device_slots(plan().size());
  std::vector<OwnedWeight> fc2_slots(plan().size());
  for (size_t l = 0; l < plan().size(); ++l) {
    const SparseLayerPlan& p = plan()[l];
    const SparseWeights::Layer& y = weights_->layer(static_cast<int>(l));
    gpu::GpuFfnLayerSpec layer;
    layer.gate = y.gate;
    layer.up = y.up;
    layer.down_t = y.down_t;
    device_slots[l].resize(y.n_device);
    for (int32_t s = 0; s < y.n_device; ++s) device_slots[l][s] = s;
    layer.device_neurons = device_slots[l];
    layer.magnitude_threshold = p.magnitude_threshold;
    // A gate-first layer's device neurons are computed whole (the device has the arithmetic to
    // spare; its magnitude threshold is 0): gate-first skips work on the host's only.
    if (p.rank > 0 && y.n_device > 0 && !options_.oracle) {
      // The predictor on the device: it picks its own neurons, and in resident mode the host's.
      fc2_slots[l] = GatherRows(*pool_, p.fc2.view, y.neuron_of.data(), h.n_ff);
      layer.rank = p.rank;
      layer.fc1 = p.fc1.view;
      layer.b1 = p.b1;
      layer.fc2 = fc2_slots[l].view;
      layer.b2 = y.b2;
      layer.threshold = p.threshold;
    }
    spec.layers.push_back(layer);
  }
  const gpu::Device& device = options_.device != nullptr ? *options_.device : gpu::CudaDevice();
  absl::StatusOr<std::unique_ptr<gpu::GpuFfnExecutor>> e = device.CreateFfnExecutor(spec);
  if (e.ok()) {
    gpu_ = *std::move(e);
    gpu_status_ = absl::OkStatus();
  } else if (absl::IsUnavailable(e.status())) {
    gpu_status_ = e.status();  // no device: the device part runs on the CPU
  } else {
    return e.status();
  }
  return absl::OkStatus();
}

void SparseFfn::LoseGpu(const absl::Status& why) {
  gpu_status_ = absl::Status(why.code(), absl::StrCat("the device part failed and runs on the CPU "
                                                      "from now on: ",
                                                      why.message()));
  gpu_failed_ = true;  // the executor stays: GPU layers in resident mode may hold it
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
  logits_.resize(h.n_ff);
  device_out_.resize(h.n_embd);
  for (size_t l = 0; l < plan().size(); ++l) {
    const SparseLayerPlan& p = plan()[l];
    const SparseWeights::Layer& y = weights_->layer(static_cast<int>(l));
    PredictorView v;
    v.rank = p.rank;
    v.fc1 = &p.fc1.view;
    v.b1 = p.b1.data();
    v.fc2_t = &y.fc2_t.view;
    v.b2 = y.b2.data();
    v.threshold = p.threshold;
    predictors_.push_back(v);
  }
  dense_gate_.resize(h.n_ff);
  dense_up_.resize(h.n_ff);
  const int64_t batch = options_.dense_prefill ? std::max<int64_t>(1, options_.max_batch) : 1;
  matmul_scratch_.Reserve(batch, std::max(h.n_embd, std::max<int64_t>(max_rank, 1)));
  if (batch > 1) {
    prefill_gate_.resize(batch * h.n_ff);
    prefill_up_.resize(batch * h.n_ff);
    prefill_axpy_.Reserve(batch, h.n_ff);
  }
  host_ = std::make_unique<Executor>(pool_, h.n_embd, h.n_ff);
  device_ = std::make_unique<Executor>(pool_, h.n_embd, h.n_ff);
  hidden_idx_.resize(std::max<int64_t>(max_rank, 1));
  hidden_val_.resize(std::max<int64_t>(max_rank, 1));
  hidden_nz_.idx = hidden_idx_.data();
  hidden_nz_.value = hidden_val_.data();
  lanes_.resize(pool_->size());
  for (Lane& lane : lanes_) {
    lane.idx.resize(h.n_ff);
    lane.gate.resize(h.n_ff);
    lane.up.resize(h.n_ff);
    lane.seen_predicted.resize(h.n_ff);
    lane.seen_up.resize(h.n_ff);
  }
  all_chunks_ = PlanChunks(/*after_device_part=*/false);
  host_chunks_ = PlanChunks(/*after_device_part=*/true);
  size_t max_chunks = 1;
  for (const auto* plans : {&all_chunks_, &host_chunks_}) {
    for (const ChunkBounds& b : *plans) max_chunks = std::max(max_chunks, b.size() - 1);
  }
  // The fused path's chunks, or an input-sparse layer's per-thread partial sums.
  max_chunks = std::max<size_t>(max_chunks, pool_->size());
  chunk_out_.assign(max_chunks * h.n_embd, 0.0f);
  in_idx_.resize(h.n_embd);
  in_val_.resize(h.n_embd);
  for (Lane& lane : lanes_) {
    lane.kept_in.Reserve(h.n_embd);
    lane.fired_in.Reserve(h.n_ff);
  }
  bool any_input_sparse = false;
  for (int l = 0; l < h.n_layer; ++l) any_input_sparse |= weights_->input_sparse(l);
  if (any_input_sparse) {
    split_stride_ = std::max(2 * h.n_ff, h.q_dim() + h.kv_dim() + h.v_dim());
    split_sums_.assign(pool_->size() * split_stride_, 0.0f);
  }
  ResetStats();
}

std::vector<SparseFfn::ChunkBounds> SparseFfn::PlanChunks(bool after_device_part) const {
  // Chunks that the threads claim as they come (a token's active set varies, and a static split
  // waited ≈ 20 µs per layer for the slower half), in guided sizes: each 1 / (4 · threads) of
  // the expected work left, down to kMinChunkWork of it, so that the last ones are short and the
  // threads finish together (equal chunks, 4 per thread, left one thread alone for 22 µs per
  // layer on average). A slot weighs its firing count plus the mean count (gate rows of
  // predicted neurons that do not fire; the colder slots' scattered rows cost more per row than
  // the hot block's stream). The estimate undervalues the first, hottest chunk: at 1 / (2 ·
  // threads) the thread that took it ended 30-40 µs after the other on a 1.1B ReLU layer (of
  // 120); a chunk half that size lets the others absorb it. One thread has nothing to balance:
  // halves, the fewest chunks. Bounds are multiples of kChunkAlign slots, so that a chunk of a
  // quantized fc2ᵀ row starts on a block.
  constexpr int64_t kChunkAlign = 64;
  constexpr double kMinChunkWork = 0.025;
  const LlamaHparams& h = model_.hparams();
  const int n_lanes = static_cast<int>(lanes_.size());
  std::vector<ChunkBounds> out;
  for (size_t l = 0; l < plan().size(); ++l) {
    const std::vector<int32_t>& count = plan()[l].fire_count;
    const SparseWeights::Layer& y = weights_->layer(static_cast<int>(l));
    // The host's slots start after the device part, on a block (the few device slots before
    // the boundary are skipped there by the chunk's own bound).
    const int64_t first = after_device_part ? y.n_device : 0;
    std::vector<double> cum(h.n_ff + 1, 0.0);
    double mean = 0;
    for (int32_t c : count) mean += c;
    mean = count.empty() ? 1.0 : mean / h.n_ff;
    for (int64_t s = 0; s < h.n_ff; ++s) {
      const double c = s < first ? 0.0 : (count.empty() ? 1.0 : count[y.neuron_of[s]]) + mean;
      cum[s + 1] = cum[s] + c;
    }
    ChunkBounds bounds = {first};
    if (first >= h.n_ff || cum[h.n_ff] == 0) {
      bounds.push_back(h.n_ff);
      out.push_back(std::move(bounds));
      continue;
    }
    for (double done = 0; bounds.back() < h.n_ff;) {
      done += std::max(kMinChunkWork, (1.0 - done) / (n_lanes == 1 ? 2 : 4 * n_lanes));
      int64_t b = std::lower_bound(cum.begin(), cum.end(), cum[h.n_ff] * done) - cum.begin();
      b = done >= 1.0 ? h.n_ff : (b + kChunkAlign / 2) / kChunkAlign * kChunkAlign;
      b = std::min<int64_t>(b, h.n_ff);
      if (b > bounds.back()) bounds.push_back(b);  // empty chunks dropped
    }
    out.push_back(std::move(bounds));
  }
  return out;
}

SparseFfn::~SparseFfn() = default;

void SparseFfn::ResetStats() {
  stats_ = {};
  const size_t n = plan().size();
  stats_.layer_host_s.assign(n, 0.0);
  stats_.layer_wait_s.assign(n, 0.0);
  stats_.layer_calls.assign(n, 0);
}

bool SparseFfn::TakesFfn(int layer, int64_t n_tokens) const {
  return !(weights_->input_sparse(layer) && n_tokens > 1 && options_.dense_prefill);
}

std::vector<gpu::InputSparseLayer> DeviceInputSparse(const SparseWeights& weights) {
  std::vector<gpu::InputSparseLayer> out;
  const int n_layer = static_cast<int>(weights.plan().size());
  for (int l = 0; l < n_layer; ++l) {
    if (!weights.input_sparse(l)) continue;
    out.resize(n_layer);
    const SparseWeights::Layer& y = weights.layer(l);
    const SparseLayerPlan& p = weights.plan()[l];
    gpu::InputSparseLayer& d = out[l];
    d.qkv = y.qkv_c.layout();
    d.q = y.q_c.layout();
    d.k = y.k_c.layout();
    d.v = y.v_c.layout();
    d.gate = y.gate_c.layout();
    d.up = y.up_c.layout();
    d.down = y.down_c.layout();
    d.attn_in_threshold = p.attn_in_threshold;
    d.ffn_in_threshold = p.ffn_in_threshold;
    d.magnitude_threshold = p.magnitude_threshold;
  }
  return out;
}

std::vector<gpu::GateFirstLayer> DeviceGateFirst(const SparseWeights& weights) {
  std::vector<gpu::GateFirstLayer> out;
  const int n_layer = static_cast<int>(weights.plan().size());
  for (int l = 0; l < n_layer; ++l) {
    const SparseLayerPlan& p = weights.plan()[l];
    if (p.method != SparseMethod::kGateFirst) continue;
    out.resize(n_layer);
    const SparseWeights::Layer& y = weights.layer(l);
    gpu::GateFirstLayer& d = out[l];
    d.gate = y.gate;
    d.up = y.up;
    d.down_t = y.down_t;
    d.gate_scale = y.gate_scale.empty() ? nullptr : y.gate_scale.data();
    d.gate_threshold = p.gate_threshold;
    d.magnitude_threshold = p.magnitude_threshold;
  }
  return out;
}

int64_t SparseFfn::KeepInputs(const float* x, int64_t n, float threshold) {
  int64_t m = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (std::fabs(x[i]) > threshold && x[i] != 0.0f) {
      in_idx_[m] = static_cast<int32_t>(i);
      in_val_[m++] = x[i];
    }
  }
  return m;
}

float* SparseFfn::ShareKeptInputs(int thread, int64_t m, int64_t n) {
  const int parts = pool_->size();
  const int64_t e0 = ColumnSplit(in_idx_.data(), m, thread, parts);
  const int64_t e1 = ColumnSplit(in_idx_.data(), m, thread + 1, parts);
  lanes_[thread].kept_in.Set(in_idx_.data() + e0, in_val_.data() + e0, e1 - e0);
  float* sum = split_sums_.data() + thread * split_stride_;
  std::fill_n(sum, n, 0.0f);
  return sum;
}

void SparseFfn::AddThreadSums(int64_t i0, int64_t i1, float* out) const {
  const int64_t stride = split_stride_;
  std::copy(split_sums_.data() + i0, split_sums_.data() + i1, out);
  for (int t = 1; t < pool_->size(); ++t) {
    const float* sum = split_sums_.data() + t * stride;
    for (int64_t i = i0; i < i1; ++i) out[i - i0] += sum[i];
  }
}

bool SparseFfn::ProjectQkv(int layer, const float* xn, int64_t n_tokens, float* q, float* k,
                           float* v) {
  if (!weights_->input_sparse(layer) || !TakesFfn(layer, n_tokens)) return false;
  const auto t0 = std::chrono::steady_clock::now();
  const LlamaHparams& h = model_.hparams();
  const SparseWeights::Layer& y = weights_->layer(layer);
  const float threshold = plan()[layer].attn_in_threshold;
  struct Part {
    const ColumnWeight* w;
    float* out;
    int64_t cols;
  };
  const int n_threads = pool_->size();
  for (int64_t t = 0; t < n_tokens; ++t) {
    const int64_t m = KeepInputs(xn + t * h.n_embd, h.n_embd, threshold);
    if (observer_ != nullptr) {
      observer_->OnColumns(layer, ColumnReads::kQkv, {in_idx_.data(), static_cast<size_t>(m)});
    }
    const Part parts[] = {{&y.q_c, q + t * h.q_dim(), h.q_dim()},
                          {&y.k_c, k + t * h.kv_dim(), h.kv_dim()},
                          {&y.v_c, v + t * h.v_dim(), h.v_dim()}};
    // Each thread a share of the kept inputs through all three (ColumnSplit), into its own sums
    // (q | k | v, as the stacked layout's outputs are).
    pool_->Run([&](int thread) {
      const int64_t n_out = h.q_dim() + h.kv_dim() + h.v_dim();
      float* sum = ShareKeptInputs(thread, m, n_out);
      if (y.qkv_c.out() > 0) {
        ColumnSparseAdd(isa_, y.qkv_c, lanes_[thread].kept_in, 0, n_out, sum);
        return;
      }
      for (const Part& p : parts) {
        ColumnSparseAdd(isa_, *p.w, lanes_[thread].kept_in, 0, p.cols, sum);
        sum += p.cols;
      }
    });
    // Then each a slice of the outputs, the threads' sums added in thread order.
    pool_->Run([&](int thread) {
      int64_t at = 0;
      for (const Part& p : parts) {
        const int64_t c0 = SliceBound(p.cols, thread, n_threads);
        const int64_t c1 = SliceBound(p.cols, thread + 1, n_threads);
        AddThreadSums(at + c0, at + c1, p.out + c0);
        at += p.cols;
      }
    });
    stats_.attn_in_tokens += 1;
    stats_.attn_in_kept += static_cast<double>(m);
  }
  stats_.total_s += Seconds(t0, std::chrono::steady_clock::now());
  return true;
}

void SparseFfn::ForwardTokenInputSparse(int layer, const float* xn, float* out) {
  const auto t0 = std::chrono::steady_clock::now();
  const LlamaHparams& h = model_.hparams();
  const SparseWeights::Layer& y = weights_->layer(layer);
  const SparseLayerPlan& p = plan()[layer];
  const int64_t m = KeepInputs(xn, h.n_embd, p.ffn_in_threshold);
  if (observer_ != nullptr) {
    observer_->OnColumns(layer, ColumnReads::kGateUp, {in_idx_.data(), static_cast<size_t>(m)});
  }
  const int n_threads = pool_->size();
  // Gate and up: each thread a share of the kept inputs through every neuron, into its sums.
  pool_->Run([&](int thread) {
    float* sum = ShareKeptInputs(thread, m, 2 * h.n_ff);
    ColumnSparseAdd(isa_, y.gate_c, lanes_[thread].kept_in, 0, h.n_ff, sum);
    ColumnSparseAdd(isa_, y.up_c, lanes_[thread].kept_in, 0, h.n_ff, sum + h.n_ff);
  });
  // Then each a slice of the neurons: the sums added in thread order, the activation, and the
  // down columns of the neurons that fire into its own partial output.
  pool_->Run([&](int thread) {
    Lane& lane = lanes_[thread];
    const int64_t s0 = SliceBound(h.n_ff, thread, n_threads);
    const int64_t w = SliceBound(h.n_ff, thread + 1, n_threads) - s0;
    float* part = chunk_out_.data() + thread * h.n_embd;
    std::fill_n(part, h.n_embd, 0.0f);
    lane.fired = 0;
    if (w <= 0) return;
    float* g = lane.gate.data();
    float* u = lane.up.data();
    AddThreadSums(s0, s0 + w, g);
    AddThreadSums(h.n_ff + s0, h.n_ff + s0 + w, u);
    GatedActivation(h.activation, g, u, w);
    // Below the magnitude threshold: dropped before down reads their rows.
    int32_t* idx = lane.idx.data();
    int64_t n = 0;
    for (int64_t j = 0; j < w; ++j) {
      if (std::fabs(g[j]) > p.magnitude_threshold && g[j] != 0.0f) {
        idx[n] = static_cast<int32_t>(s0 + j);
        g[n++] = g[j];
      }
    }
    lane.fired_in.Set(idx, g, n);
    ColumnSparseAdd(isa_, y.down_c, lane.fired_in, 0, h.n_embd, part);
    lane.fired = n;
  });
  // In thread order: the same bits run to run.
  std::copy_n(chunk_out_.data(), h.n_embd, out);
  for (int t = 1; t < n_threads; ++t) {
    const float* part = chunk_out_.data() + t * h.n_embd;
    for (int64_t i = 0; i < h.n_embd; ++i) out[i] += part[i];
  }
  if (observer_ != nullptr) {  // the threads' slices in order: ascending
    for (int t = 0; t < n_threads; ++t) {
      observer_->OnColumns(layer, ColumnReads::kDown,
                           {lanes_[t].idx.data(), static_cast<size_t>(lanes_[t].fired)});
    }
  }
  stats_.ffn_in_tokens += 1;
  stats_.ffn_in_kept += static_cast<double>(m);
  for (int t = 0; t < n_threads; ++t) stats_.ffn_in_fired += static_cast<double>(lanes_[t].fired);
  stats_.total_s += Seconds(t0, std::chrono::steady_clock::now());
}

void SparseFfn::Forward(int layer, const float* x, const float* xn, int64_t n_tokens, float* out) {
  if (n_tokens > 1 && options_.dense_prefill && n_tokens <= options_.max_batch &&
      !weights_->input_sparse(layer)) {
    Prefill(layer, xn, n_tokens, out);
    return;
  }
  const int64_t d = model_.hparams().n_embd;
  for (int64_t t = 0; t < n_tokens; ++t) ForwardToken(layer, xn + t * d, out + t * d);
}

void SparseFfn::Prefill(int layer, const float* xn, int64_t n, float* out) {
  const LlamaHparams& h = model_.hparams();
  const SparseWeights::Layer& y = weights_->layer(layer);
  MatMul(*pool_, y.gate, xn, n, prefill_gate_.data(), matmul_scratch_);
  MatMul(*pool_, y.up, xn, n, prefill_up_.data(), matmul_scratch_);
  GatedActivation(h.activation, prefill_gate_.data(), prefill_up_.data(), n * h.n_ff);
  SparseAxpyTokens(*pool_, isa_, y.down_t, prefill_gate_.data(), n, out, prefill_axpy_);
}

void SparseFfn::ForwardToken(int layer, const float* xn, float* out) {
  if (weights_->input_sparse(layer)) {
    ForwardTokenInputSparse(layer, xn, out);
    return;
  }
  if (options_.oracle) {
    ForwardTokenOracle(layer, xn, out, /*host_only=*/false);
    return;
  }
  const int64_t n_embd = model_.hparams().n_embd;
  if (!device_part() || weights_->layer(layer).n_device == 0) {
    ForwardTokenFused(layer, xn, out, all_chunks_, nullptr, 0);
    return;
  }
  // The device predicts and computes its slots while the pool takes the host's through the
  // fused path; only the device's partial sum comes back.
  absl::Status st = gpu_->Launch(layer, xn, nullptr, 0);
  if (!st.ok()) {
    LoseGpu(st);
    ForwardTokenFused(layer, xn, out, all_chunks_, nullptr, 0);
    return;
  }
  const auto t0 = std::chrono::steady_clock::now();
  ForwardTokenFused(layer, xn, out, host_chunks_, nullptr, 0);
  const auto t1 = std::chrono::steady_clock::now();
  int64_t predicted = 0, fired = 0;
  st = gpu_->Wait(device_out_.data(), &predicted, &fired);
  stats_.layer_host_s[layer] += Seconds(t0, t1);
  stats_.layer_wait_s[layer] += Seconds(t1, std::chrono::steady_clock::now());
  stats_.layer_calls[layer] += 1;
  if (!st.ok()) {
    LoseGpu(st);
    ForwardTokenFused(layer, xn, out, all_chunks_, nullptr, 0);  // the whole layer again
    return;
  }
  for (int64_t i = 0; i < n_embd; ++i) out[i] += device_out_[i];
  stats_.predicted += static_cast<double>(predicted);
  stats_.fired += static_cast<double>(fired);
}

absl::Status SparseFfn::ForwardListed(int layer, const float* xn, const int32_t* active,
                                      int64_t n_active, float* out) {
  if (layer < 0 || layer >= static_cast<int>(plan().size()) || n_active < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("sparse FFN: layer ", layer, ", ", n_active, " listed neurons"));
  }
  if (options_.oracle) {
    ForwardTokenOracle(layer, xn, out, /*host_only=*/true);  // the exact set of the host's slots
    return absl::OkStatus();
  }
  const auto t0 = std::chrono::steady_clock::now();
  ForwardTokenFused(layer, xn, out, host_chunks_, active, n_active);
  stats_.layer_host_s[layer] += Seconds(t0, std::chrono::steady_clock::now());
  stats_.layer_calls[layer] += 1;
  return absl::OkStatus();
}

void SparseFfn::ForwardTokenFused(int layer, const float* xn, float* out,
                                  const std::vector<ChunkBounds>& chunks, const int32_t* listed,
                                  int64_t n_listed) {
  const auto t0 = std::chrono::steady_clock::now();
  const LlamaHparams& h = model_.hparams();
  const SparseWeights::Layer& y = weights_->layer(layer);
  listed_ = listed;
  n_listed_ = n_listed;
  if (listed == nullptr) {
    PredictHidden(*pool_, predictors_[layer], xn, hidden_.data(), &hidden_nz_, matmul_scratch_);
  }
  const auto t1 = std::chrono::steady_clock::now();
  PrepareActivations(y.gate.type, isa_, xn, h.n_embd, x_gate_.data());
  if (y.up.type != y.gate.type) {
    PrepareActivations(y.up.type, isa_, xn, h.n_embd, x_up_.data());
  }
  next_chunk_.store(0, std::memory_order_relaxed);
  if (observer_ != nullptr) observer_->OnLayer(layer);
  const ChunkBounds& bounds = chunks[layer];
  pool_->Run([&](int lane) { RunLane(layer, lane, bounds); });
  // In chunk order, whichever lanes took them: the same bits run to run.
  const int64_t n_chunks = static_cast<int64_t>(bounds.size()) - 1;
  std::copy_n(chunk_out_.data(), h.n_embd, out);
  for (int64_t c = 1; c < n_chunks; ++c) {
    const float* part = chunk_out_.data() + c * h.n_embd;
    for (int64_t i = 0; i < h.n_embd; ++i) out[i] += part[i];
  }
  const auto t2 = std::chrono::steady_clock::now();
  stats_.layer_tokens += 1;
  for (const Lane& lane : lanes_) {
    stats_.predicted += static_cast<double>(lane.predicted);
    stats_.up_rows += static_cast<double>(lane.up_rows);
    stats_.fired += static_cast<double>(lane.fired);
  }
  // fc1 before the lanes, fc2 and the threshold inside lane 0's chunks (the others run
  // alongside).
  const bool predicted_here = listed == nullptr && plan()[layer].rank > 0;
  stats_.predictor_s += predicted_here ? Seconds(t0, t1) + lanes_[0].predictor_s : 0.0;
  stats_.total_s += Seconds(t0, t2);
  listed_ = nullptr;
  n_listed_ = 0;
}

void SparseFfn::RunLane(int layer, int lane_index, const ChunkBounds& bounds) {
  Lane& lane = lanes_[lane_index];
  lane.predicted = lane.fired = lane.up_rows = 0;
  lane.predictor_s = 0;
  const int n_chunks = static_cast<int>(bounds.size()) - 1;
  const int64_t n_embd = model_.hparams().n_embd;
  for (int c = next_chunk_.fetch_add(1, std::memory_order_relaxed); c < n_chunks;
       c = next_chunk_.fetch_add(1, std::memory_order_relaxed)) {
    float* out = chunk_out_.data() + c * n_embd;
    std::fill_n(out, n_embd, 0.0f);
    RunChunk(layer, lane, bounds[c], bounds[c + 1], out, lane_index == 0);
  }
}

void SparseFfn::RunChunk(int layer, Lane& lane, int64_t begin, int64_t end, float* out,
                         bool time_it) {
  const auto t0 = std::chrono::steady_clock::now();
  const LlamaHparams& h = model_.hparams();
  const SparseWeights::Layer& y = weights_->layer(layer);
  const SparseLayerPlan& p = plan()[layer];
  int32_t* idx = lane.idx.data();
  float* gate = lane.gate.data();
  float* up = lane.up.data();
  int64_t n = 0;
  if (listed_ != nullptr) {
    // The listed slots of this chunk (the list is ascending).
    const int32_t* from = std::lower_bound(listed_, listed_ + n_listed_, begin);
    const int32_t* to = std::lower_bound(from, listed_ + n_listed_, end);
    n = to - from;
    std::copy(from, to, idx);
  } else {
    // This chunk's logits: fc2ᵀ rows of the hidden units that fired, restricted to its slots.
    n = PredictSlots(isa_, predictors_[layer], hidden_nz_, begin, end, logits_.data(), idx);
  }
  if (time_it) lane.predictor_s += Seconds(t0, std::chrono::steady_clock::now());
  lane.predicted += n;
  const int64_t n_predicted = n;
  if (observer_ != nullptr) std::copy_n(idx, n, lane.seen_predicted.data());
  const WeightView& gw = y.gate;
  const WeightView& uw = y.up;
  const void* x_up = uw.type == gw.type ? x_gate_.data() : x_up_.data();
  if (p.method == SparseMethod::kGateFirst) {  // no predictor: n is every slot (or the listed)
    int64_t n_up = 0;
    const int64_t m = GateFirstRows(
        isa_, h.activation, gw, x_gate_.data(), uw, x_up, y.down_t, idx, n, p.gate_threshold,
        y.gate_scale.empty() ? nullptr : y.gate_scale.data(), p.magnitude_threshold, gate, up, out,
        &n_up, observer_ != nullptr ? lane.seen_up.data() : nullptr);
    lane.up_rows += n_up;
    lane.fired += m;
    if (observer_ != nullptr) {
      observer_->OnChunk(layer, {lane.seen_predicted.data(), static_cast<size_t>(n_predicted)},
                         {lane.seen_up.data(), static_cast<size_t>(n_up)},
                         {idx, static_cast<size_t>(m)});
    }
    return;
  }
  SparseRowDots(isa_, gw, x_gate_.data(), idx, n, gate);
  // ReLU family: up rows only for the neurons whose gate fired.
  if (GateDecides(h.activation)) n = KeepWhere(idx, gate, n, [](float g) { return g > 0.0f; });
  if (observer_ != nullptr) std::copy_n(idx, n, lane.seen_up.data());
  lane.up_rows += n;
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
  SparseAxpyRows(isa_, y.down_t, 0, h.n_embd, idx, gate, m, out);
}

void SparseFfn::ForwardTokenOracle(int layer, const float* xn, float* out, bool host_only) {
  const auto t0 = std::chrono::steady_clock::now();
  const LlamaHparams& h = model_.hparams();
  const SparseWeights::Layer& y = weights_->layer(layer);
  const SparseLayerPlan& p = plan()[layer];
  // Exact active set: dense gate/up, the slots whose activation passes the threshold, split
  // between the device part (slots [0, n_device)) and the host.
  MatMul(*pool_, y.gate, xn, 1, dense_gate_.data(), matmul_scratch_);
  MatMul(*pool_, y.up, xn, 1, dense_up_.data(), matmul_scratch_);
  GatedActivation(h.activation, dense_gate_.data(), dense_up_.data(), h.n_ff);
  const bool split = (host_only || device_part()) && y.n_device > 0;
  Executor& host = *host_;
  Executor& device = *device_;
  int64_t n_host = 0, n_dev = 0;
  for (int32_t s = 0; s < h.n_ff; ++s) {
    const float a = dense_gate_[s];
    if (a == 0.0f || std::fabs(a) <= p.magnitude_threshold) continue;
    if (host_only && s < y.n_device) continue;  // the device computes its own part
    Executor& e = split && s < y.n_device ? device : host;
    int64_t& n = &e == &host ? n_host : n_dev;
    e.idx[n] = s;
    e.gate[n++] = a;
  }
  if (split && n_dev > 0 && !host_only) {
    absl::Status st = gpu_->Launch(layer, xn, device.idx.data(), n_dev);
    RunPart(layer, host, n_host);
    int64_t predicted = 0, fired = 0;
    if (st.ok()) st = gpu_->Wait(device.out.data(), &predicted, &fired);
    if (!st.ok()) {
      LoseGpu(st);
      RunPart(layer, device, n_dev);
    }
    for (int64_t i = 0; i < h.n_embd; ++i) out[i] = host.out[i] + device.out[i];
  } else {
    RunPart(layer, host, n_host);
    std::copy_n(host.out.data(), h.n_embd, out);
  }
  stats_.layer_tokens += 1;
  stats_.predicted += static_cast<double>(n_host + n_dev);
  stats_.fired += static_cast<double>(n_host + n_dev);
  stats_.total_s += Seconds(t0, std::chrono::steady_clock::now());
}

void SparseFfn::RunPart(int layer, Executor& e, int64_t n) {
  const SparseWeights::Layer& y = weights_->layer(layer);
  SparseAxpy(*e.pool, isa_, y.down_t, e.idx.data(), e.gate.data(), n, e.out.data(), e.scratch);
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
  // Input-sparse layers: rows of the transposed copies for the entries kept, in place of the
  // whole q/k/v that NonFfnBytesPerToken counts.
  const double attn_kept = stats_.attn_in_kept / std::max<int64_t>(1, stats_.attn_in_tokens);
  const double ffn_kept = stats_.ffn_in_kept / std::max<int64_t>(1, stats_.ffn_in_tokens);
  const double ffn_fired = stats_.ffn_in_fired / std::max<int64_t>(1, stats_.ffn_in_tokens);
  for (size_t l = 0; l < plan().size(); ++l) {
    const LayerWeights& L = model_.layers()[l];
    const SparseWeights::Layer& y = weights_->layer(static_cast<int>(l));
    if (weights_->input_sparse(static_cast<int>(l))) {
      for (const WeightView* w : {&L.wq, &L.wk, &L.wv}) {
        bytes -= static_cast<double>(w->row_bytes) * w->rows;
      }
      bytes += attn_kept * (y.qkv_c.bytes_per_input() + y.q_c.bytes_per_input() +
                            y.k_c.bytes_per_input() + y.v_c.bytes_per_input()) +
               ffn_kept * (y.gate_c.bytes_per_input() + y.up_c.bytes_per_input()) +
               ffn_fired * y.down_c.bytes_per_input();
      continue;
    }
    // Up rows are read for the neurons whose gate passed (counted on the host's fused path);
    // else for the predicted ones, or (ReLU family) those whose gate fired.
    const double up_rows = stats_.up_rows > 0
                               ? stats_.up_rows / std::max<int64_t>(1, stats_.layer_tokens)
                           : GateDecides(model_.hparams().activation) ? fired_per_layer
                                                                      : predicted_per_layer;
    const double gu =
        options_.oracle ? (L.ffn_gate.row_bytes + L.ffn_up.row_bytes) * L.ffn_gate.rows
                        : L.ffn_gate.row_bytes * predicted_per_layer + L.ffn_up.row_bytes * up_rows;
    // A row's bytes, not the stride of the interleaved copy.
    const WeightView& down_t = weights_->layer(static_cast<int>(l)).down_t;
    bytes += gu + RowBytes(down_t.type, down_t.cols) * fired_per_layer;
  }
  return bytes + PredictorBytesPerToken();
}

}  // namespace thermocline
