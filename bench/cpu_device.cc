#include "bench/cpu_device.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <numeric>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/gpu/device_memory.h"
#include "engine/model/cpu_ops.h"
#include "engine/ops/kernels.h"
#include "engine/ops/matmul.h"
#include "engine/sparse/sparse_ops.h"

namespace thermocline {

void ColumnMatVecOnHost(const gpu::ColumnLayout& c, const float* x, float threshold, float* y) {
  std::fill_n(y, c.out, 0.0f);
  auto kept = [threshold](float v) { return std::fabs(v) > threshold && v != 0.0f; };
  if (c.form == gpu::ColumnLayout::Form::kRows) {
    std::vector<float> row(c.out);
    for (int64_t i = 0; i < c.in; ++i) {
      if (!kept(x[i])) continue;
      KernelsFor(c.rows.type, Isa::kScalar)->to_float(c.rows.row(i), row.data(), c.out);
      for (int64_t o = 0; o < c.out; ++o) y[o] += x[i] * row[o];
    }
    return;
  }
  const bool int4 = c.form == gpu::ColumnLayout::Form::kInt4;
  std::vector<int32_t> acc(c.out_pad);
  for (int64_t b = 0; b < c.in / 32; ++b) {
    float amax = 0.0f;
    for (int64_t i = 32 * b; i < 32 * b + 32; ++i) {
      if (kept(x[i])) amax = std::max(amax, std::fabs(x[i]));
    }
    if (amax == 0.0f) continue;
    const float d = amax / 127.0f;
    const float id = d >= FLT_MIN ? 1.0f / d : 0.0f;  // as ColumnInput
    std::fill(acc.begin(), acc.end(), 0);
    int32_t qsum = 0;
    for (int64_t i = 32 * b; i < 32 * b + 32; ++i) {
      if (!kept(x[i])) continue;
      const int32_t q = static_cast<int32_t>(std::nearbyint(x[i] * id));
      qsum += q;
      const uint8_t* row = c.values + i * c.row_bytes;
      for (size_t at = 0; at < c.row_bytes; ++at) {
        const int64_t line = static_cast<int64_t>(at / 64);
        const int byte = static_cast<int>(at % 64);
        if (int4) {
          acc[line * 128 + gpu::OutputOfByte4(byte, false)] += q * (row[at] & 0x0F);
          acc[line * 128 + gpu::OutputOfByte4(byte, true)] += q * (row[at] >> 4);
        } else {
          acc[line * 64 + gpu::OutputOfByte8(byte)] += q * row[at];
        }
      }
    }
    for (int64_t o = 0; o < c.out; ++o) {
      const float a = static_cast<float>(acc[o] - c.offset * qsum);
      y[o] = std::fma(HalfToFloat(c.scales[b * c.out_pad + o]), a * d, y[o]);
      if (c.mins != nullptr) {
        y[o] =
            std::fma(-HalfToFloat(c.mins[b * c.out_pad + o]), d * static_cast<float>(qsum), y[o]);
      }
    }
  }
}
namespace {

// Holds a reservation in a budget (the spec's, or one of its own) for the object's life.
class Reservation {
 public:
  Reservation(gpu::MemoryBudget* shared, uint64_t cap)
      : own_(cap), budget_(shared != nullptr ? shared : &own_) {}
  ~Reservation() {
    if (bytes_ > 0) budget_->Release(bytes_);
  }
  absl::Status Reserve(uint64_t bytes, std::string_view what) {
    absl::Status s = budget_->Reserve(bytes, what);
    if (s.ok()) bytes_ += gpu::MemoryBudget::Rounded(bytes);
    return s;
  }
  uint64_t bytes() const { return bytes_; }

 private:
  gpu::MemoryBudget own_;
  gpu::MemoryBudget* budget_;
  uint64_t bytes_ = 0;
};

class CpuLayers : public gpu::GpuLayers {
 public:
  CpuLayers(const gpu::GpuLayersSpec& spec, std::atomic<int64_t>* calls,
            std::atomic<int64_t>* resident_calls, std::atomic<int64_t>* input_sparse_tokens,
            std::atomic<int64_t>* gate_first_tokens)
      : resident_calls_(resident_calls),
        input_sparse_tokens_(input_sparse_tokens),
        gate_first_tokens_(gate_first_tokens),
        spec_(spec),
        m_(*spec.model),
        h_(spec.model->hparams()),
        pool_(1),
        calls_(calls),
        reservation_(spec.budget, spec.memory_cap) {
    k_.assign(h_.n_layer * spec.n_ctx * h_.kv_dim(), 0.0f);
    v_.assign(k_.size(), 0.0f);
    scratch_.Reserve(std::max<int64_t>(spec.max_batch, 1),
                     std::max({h_.n_embd, h_.n_ff, h_.q_dim()}));
    n_gpu_layers_ = std::count(spec.layers.begin(), spec.layers.end(), 1);
    output_ = spec.output;
  }

  absl::Status Init() {
    // What the CUDA backend allocates for this spec, reserved as it would be.
    return reservation_.Reserve(gpu::ComputeGpuLayersMemory(spec_).Total(spec_),
                                "the stand-in device's layers");
  }

  bool Owns(int64_t l) const override {
    return l == h_.n_layer ? output_ : (l >= 0 && l < h_.n_layer && spec_.layers[l] != 0);
  }
  uint64_t device_bytes() const override { return reservation_.bytes(); }

  absl::Status Forward(int64_t first, int64_t last, float* x, int64_t n, int64_t pos,
                       const float* cs, float* logits, bool all_rows) override {
    calls_->fetch_add(1);
    const int64_t d = h_.n_embd, kvd = h_.kv_dim(), qd = h_.q_dim();
    // An F16 cache as the CUDA layers keep it: K, V, q and the softmax weights in half.
    const bool half = spec_.kv_type == KvType::kF16;
    auto operand = [half](float f) { return half ? HalfToFloat(FloatToHalf(f)) : f; };
    std::vector<float> xb(n * d), xn(n * d), q(n * qd), k(n * kvd), v(n * kvd), att(n * qd),
        g(n * h_.n_ff), u(n * h_.n_ff), scores(spec_.n_ctx);
    for (int64_t l = first; l < last; ++l) {
      const LayerWeights& L = m_.layers()[l];
      for (int64_t t = 0; t < n; ++t) {
        RmsNorm(x + t * d, L.attn_norm.data(), d, h_.rms_eps, &xb[t * d]);
      }
      // An input-sparse layer reads its layouts: a decode token (or every token without
      // dense_prefill) only the columns past its thresholds, a prompt's tokens every column.
      const bool input_sparse = spec_.input_sparse_on(l);
      const float off = -1.0f;  // a negative threshold keeps every nonzero entry
      const bool sparse = n == 1 || !spec_.dense_prefill;
      if (input_sparse) {
        const gpu::InputSparseLayer& y = spec_.input_sparse[l];
        const float th = sparse ? y.attn_in_threshold : off;
        std::vector<float> qkv(qd + 2 * kvd);
        for (int64_t t = 0; t < n; ++t) {
          if (!y.qkv.empty()) {
            ColumnMatVecOnHost(y.qkv, &xb[t * d], th, qkv.data());
            std::copy_n(qkv.data(), qd, &q[t * qd]);
            std::copy_n(qkv.data() + qd, kvd, &k[t * kvd]);
            std::copy_n(qkv.data() + qd + kvd, kvd, &v[t * kvd]);
          } else {
            ColumnMatVecOnHost(y.q, &xb[t * d], th, &q[t * qd]);
            ColumnMatVecOnHost(y.k, &xb[t * d], th, &k[t * kvd]);
            ColumnMatVecOnHost(y.v, &xb[t * d], th, &v[t * kvd]);
          }
        }
      } else {
        MatMul(pool_, L.wq, xb.data(), n, q.data(), scratch_);
        MatMul(pool_, L.wk, xb.data(), n, k.data(), scratch_);
        MatMul(pool_, L.wv, xb.data(), n, v.data(), scratch_);
      }
      float* kc = k_.data() + l * spec_.n_ctx * kvd;
      float* vc = v_.data() + l * spec_.n_ctx * kvd;
      for (int64_t t = 0; t < n; ++t) {
        ApplyRope(&q[t * qd], h_.n_head, h_.head_dim, h_.rope_dim, cs + t * h_.rope_dim);
        ApplyRope(&k[t * kvd], h_.n_head_kv, h_.head_dim, h_.rope_dim, cs + t * h_.rope_dim);
        for (int64_t i = 0; i < kvd; ++i) {
          kc[(pos + t) * kvd + i] = operand(k[t * kvd + i]);
          vc[(pos + t) * kvd + i] = operand(v[t * kvd + i]);
        }
      }
      const int64_t group = h_.n_head / h_.n_head_kv;
      const float scale = 1.0f / std::sqrt(static_cast<float>(h_.head_dim));
      for (int64_t t = 0; t < n; ++t) {
        for (int64_t head = 0; head < h_.n_head; ++head) {
          const int64_t off = (head / group) * h_.head_dim, n_kv = pos + t + 1;
          const float* qh = &q[t * qd + head * h_.head_dim];
          for (int64_t j = 0; j < n_kv; ++j) {
            float dot = 0.0f;
            for (int64_t i = 0; i < h_.head_dim; ++i) {
              dot += operand(qh[i]) * kc[j * kvd + off + i];
            }
            scores[j] = dot * scale;
          }
          Softmax(scores.data(), n_kv);
          float* o = &att[t * qd + head * h_.head_dim];
          std::fill_n(o, h_.head_dim, 0.0f);
          for (int64_t j = 0; j < n_kv; ++j) {
            const float p = operand(scores[j]);
            for (int64_t i = 0; i < h_.head_dim; ++i) o[i] += p * vc[j * kvd + off + i];
          }
        }
      }
      MatMul(pool_, L.wo, att.data(), n, xb.data(), scratch_);
      for (int64_t i = 0; i < n * d; ++i) x[i] += xb[i];
      for (int64_t t = 0; t < n; ++t) {
        RmsNorm(x + t * d, L.ffn_norm.data(), d, h_.rms_eps, &xn[t * d]);
      }
      if (spec_.host_ffn != nullptr && spec_.device_ffn != nullptr && n == 1 &&
          spec_.device_ffn->RunsResident(static_cast<int>(l))) {
        // Resident: the device predicts and computes its part into the residual, the host its
        // listed part; only the host's partial sum comes back.
        if (absl::Status st = spec_.device_ffn->EnqueueResident(static_cast<int>(l), xn.data(), x);
            !st.ok()) {
          return st;
        }
        absl::StatusOr<gpu::HostPart> host = spec_.device_ffn->WaitHostPart();
        if (!host.ok()) return host.status();
        if (absl::Status st = spec_.host_ffn->ForwardListed(
                static_cast<int>(l), host->xn, host->active, host->n_active, host->partial);
            !st.ok()) {
          return st;
        }
        if (absl::Status st = spec_.device_ffn->EnqueueAddHostPart(x); !st.ok()) return st;
        resident_calls_->fetch_add(1);
        continue;
      }
      if (spec_.host_ffn != nullptr) {
        // The hybrid layer on a batch (prefill): x and xn "down" to the host FFN, its output
        // back.
        spec_.host_ffn->Forward(static_cast<int>(l), x, xn.data(), n, xb.data());
      } else if (input_sparse) {
        const gpu::InputSparseLayer& y = spec_.input_sparse[l];
        const int64_t f = h_.n_ff;
        for (int64_t t = 0; t < n; ++t) {
          ColumnMatVecOnHost(y.gate, &xn[t * d], sparse ? y.ffn_in_threshold : off, &g[t * f]);
          ColumnMatVecOnHost(y.up, &xn[t * d], sparse ? y.ffn_in_threshold : off, &u[t * f]);
          GatedActivation(h_.activation, &g[t * f], &u[t * f], f);
          ColumnMatVecOnHost(y.down, &g[t * f], sparse ? y.magnitude_threshold : off, &xb[t * d]);
        }
        input_sparse_tokens_->fetch_add(n);
      } else if (spec_.gate_first_on(l)) {
        // The CPU's gate-first rows over the sparse copies (the same ISA: the same dots, so the
        // same slots fire), every slot a candidate; a prompt's tokens dense.
        const gpu::GateFirstLayer& y = spec_.gate_first[l];
        const int64_t f = h_.n_ff;
        std::vector<int32_t> idx(f);
        std::vector<uint8_t> xg(PreparedBytes(y.gate.type, d)), xu(PreparedBytes(y.up.type, d));
        for (int64_t t = 0; t < n; ++t) {
          PrepareActivations(y.gate.type, BestIsa(), &xn[t * d], d, xg.data());
          PrepareActivations(y.up.type, BestIsa(), &xn[t * d], d, xu.data());
          std::iota(idx.begin(), idx.end(), 0);
          std::fill_n(&xb[t * d], d, 0.0f);
          GateFirstRows(BestIsa(), h_.activation, y.gate, xg.data(), y.up, xu.data(), y.down_t,
                        idx.data(), f, sparse ? y.gate_threshold : off, y.gate_scale,
                        sparse ? y.magnitude_threshold : off, &g[t * f], &u[t * f], &xb[t * d]);
        }
        gate_first_tokens_->fetch_add(n);
      } else {
        MatMul(pool_, L.ffn_gate, xn.data(), n, g.data(), scratch_);
        MatMul(pool_, L.ffn_up, xn.data(), n, u.data(), scratch_);
        GatedActivation(h_.activation, g.data(), u.data(), n * h_.n_ff);
        MatMul(pool_, L.ffn_down, g.data(), n, xb.data(), scratch_);
      }
      for (int64_t i = 0; i < n * d; ++i) x[i] += xb[i];
    }
    if (logits != nullptr) {
      const int64_t from = all_rows ? 0 : n - 1;
      for (int64_t t = from; t < n; ++t) {
        RmsNorm(x + t * d, m_.output_norm().data(), d, h_.rms_eps, &xb[t * d]);
      }
      MatMul(pool_, m_.output(), &xb[from * d], n - from, logits, scratch_);
    }
    return absl::OkStatus();
  }

 private:
  std::atomic<int64_t>* resident_calls_;
  std::atomic<int64_t>* input_sparse_tokens_;
  std::atomic<int64_t>* gate_first_tokens_;
  gpu::GpuLayersSpec spec_;
  const LlamaModel& m_;
  const LlamaHparams& h_;
  ThreadPool pool_;
  std::atomic<int64_t>* calls_;
  Reservation reservation_;
  std::vector<float> k_, v_;
  MatMulScratch scratch_;
};

// A copy of a weight matrix (the spec's views need only live through Create).
OwnedWeight CopyOf(const WeightView& w) {
  OwnedWeight c = OwnedWeight::Allocate(w.type, w.rows, w.cols);
  for (int64_t r = 0; r < w.rows; ++r) {
    std::copy_n(w.row(r), c.view.row_bytes, c.data.data() + r * c.view.row_bytes);
  }
  return c;
}

// The device part of a hybrid FFN through the scalar references, in host memory: the listed (or
// predicted) device neurons, and in resident mode the predictor over every neuron.
class CpuFfnExecutor : public gpu::GpuFfnExecutor {
 public:
  CpuFfnExecutor(const gpu::GpuFfnSpec& spec, std::atomic<int64_t>* launches)
      : spec_(spec), launches_(launches), reservation_(spec.budget, spec.memory_cap) {
    for (const gpu::GpuFfnLayerSpec& l : spec.layers) {
      Layer& y = layers_.emplace_back();
      y.table.assign(l.device_neurons.begin(), l.device_neurons.end());
      y.on_device.assign(spec.n_ff, 0);
      for (int32_t i : y.table) y.on_device[i] = 1;
      if (l.rank > 0) {
        y.fc1 = CopyOf(l.fc1);
        y.fc2 = CopyOf(l.fc2);
        y.b1.assign(l.b1.begin(), l.b1.end());
        y.b2.assign(l.b2.begin(), l.b2.end());
      }
    }
    idx_.resize(spec.n_ff);
    host_idx_.resize(spec.n_ff);
    gate_.resize(spec.n_ff);
    up_.resize(spec.n_ff);
    logits_.resize(spec.n_ff);
    out_.resize(spec.n_embd);
    xn_.resize(spec.n_embd);
    partial_.resize(spec.n_embd);
  }

  // What the CUDA executor allocates for this spec (device_memory.h), reserved as one block.
  absl::Status Init() {
    return reservation_.Reserve(gpu::ComputeGpuFfnMemory(spec_), "the stand-in's FFN part");
  }

  absl::Status Launch(int layer, const float* xn, const int32_t* active,
                      int64_t n_active) override {
    launches_->fetch_add(1);
    const Layer& y = layers_[layer];
    int64_t n = 0;
    if (active != nullptr) {
      std::copy_n(active, n_active, idx_.begin());
      n = n_active;
    } else if (spec_.layers[layer].rank > 0) {
      Predict(layer, xn);
      for (int32_t i : y.table) {
        if (Active(layer, i)) idx_[n++] = i;
      }
    } else {
      std::copy(y.table.begin(), y.table.end(), idx_.begin());
      n = static_cast<int64_t>(y.table.size());
    }
    DevicePart(layer, xn, n);
    return absl::OkStatus();
  }

  absl::Status Wait(float* out, int64_t* n_predicted, int64_t* n_fired) override {
    std::copy(out_.begin(), out_.end(), out);
    if (n_predicted != nullptr) *n_predicted = predicted_;
    if (n_fired != nullptr) *n_fired = fired_;
    return absl::OkStatus();
  }

  // As the CUDA executor: a layer without device neurons holds nothing there and is refused.
  bool RunsResident(int layer) const override {
    return layer >= 0 && layer < static_cast<int>(layers_.size()) && !layers_[layer].table.empty();
  }
  absl::Status EnqueueResident(int layer, const float* xn, float* x) override {
    if (!RunsResident(layer)) {
      return absl::InvalidArgumentError(
          absl::StrCat("stand-in FFN layer ", layer, " has no device neurons to run resident"));
    }
    launches_->fetch_add(1);
    const Layer& y = layers_[layer];
    const bool predict = spec_.layers[layer].rank > 0;
    if (predict) Predict(layer, xn);
    int64_t n_dev = 0;
    n_host_ = 0;
    for (int32_t i = 0; i < spec_.n_ff; ++i) {
      if (predict && !Active(layer, i)) continue;
      if (y.on_device[i]) {
        idx_[n_dev++] = i;
      } else {
        host_idx_[n_host_++] = i;
      }
    }
    std::copy_n(xn, spec_.n_embd, xn_.begin());  // "down" to the host
    DevicePart(layer, xn, n_dev);
    for (int64_t i = 0; i < spec_.n_embd; ++i) x[i] += out_[i];  // into the residual
    waiting_ = true;
    return absl::OkStatus();
  }

  absl::StatusOr<gpu::HostPart> WaitHostPart() override {
    if (!waiting_) return absl::FailedPreconditionError("WaitHostPart without EnqueueResident");
    waiting_ = false;
    gpu::HostPart h;
    h.xn = xn_.data();
    h.active = host_idx_.data();
    h.n_active = n_host_;
    h.partial = partial_.data();
    return h;
  }

  absl::Status EnqueueAddHostPart(float* x) override {
    for (int64_t i = 0; i < spec_.n_embd; ++i) x[i] += partial_[i];  // "up" into the residual
    return absl::OkStatus();
  }

  uint64_t device_bytes() const override { return reservation_.bytes(); }

 private:
  struct Layer {
    std::vector<int32_t> table;
    std::vector<uint8_t> on_device;
    OwnedWeight fc1, fc2;
    std::vector<float> b1, b2;
  };

  // logits_ = fc2 · relu(fc1 · xn + b1) over every neuron.
  void Predict(int layer, const float* xn) {
    const gpu::GpuFfnLayerSpec& s = spec_.layers[layer];
    const Layer& y = layers_[layer];
    std::vector<float> hidden(s.rank);
    MatMulReference(y.fc1.view, xn, 1, hidden.data());
    for (int64_t j = 0; j < s.rank; ++j) hidden[j] = std::max(0.0f, hidden[j] + y.b1[j]);
    MatMulReference(y.fc2.view, hidden.data(), 1, logits_.data());
  }
  bool Active(int layer, int32_t i) const {
    return logits_[i] + layers_[layer].b2[i] > spec_.layers[layer].threshold;
  }

  // out_ = the FFN of idx_[0, n) (device neurons).
  void DevicePart(int layer, const float* xn, int64_t n) {
    const gpu::GpuFfnLayerSpec& s = spec_.layers[layer];
    predicted_ = n;
    // Gate and up as the host's row dots compute them (xn quantized to the types' activation
    // format, as the CUDA kernels do too), so that a split changes no rounding: with float
    // dots a near-tie can part (a) from (c) in `bench --gpu-compare`.
    for (auto [w, y] : {std::pair{&s.gate, gate_.data()}, std::pair{&s.up, up_.data()}}) {
      prepared_.resize(PreparedBytes(w->type, w->cols));
      PrepareActivations(w->type, Isa::kScalar, xn, w->cols, prepared_.data());
      SparseRowDots(Isa::kScalar, *w, prepared_.data(), idx_.data(), n, y);
    }
    GatedActivation(spec_.activation, gate_.data(), up_.data(), n);
    int64_t m = 0;
    for (int64_t j = 0; j < n; ++j) {
      if (gate_[j] != 0.0f && std::fabs(gate_[j]) > s.magnitude_threshold) {
        idx_[m] = idx_[j];
        gate_[m++] = gate_[j];
      }
    }
    fired_ = m;
    std::fill(out_.begin(), out_.end(), 0.0f);
    SparseAxpyReference(s.down_t, idx_.data(), gate_.data(), m, out_.data());
  }

  gpu::GpuFfnSpec spec_;
  std::atomic<int64_t>* launches_;
  Reservation reservation_;
  std::vector<Layer> layers_;
  std::vector<int32_t> idx_, host_idx_;
  std::vector<float> gate_, up_, logits_, out_, xn_, partial_;
  std::vector<uint8_t> prepared_;  // xn for the row dots
  int64_t n_host_ = 0;
  int64_t predicted_ = 0, fired_ = 0;
  bool waiting_ = false;
};

class NoQueue : public gpu::Queue {};

}  // namespace

absl::StatusOr<gpu::DeviceInfo> CpuStandInDevice::Probe(int index) const {
  if (index != 0) return absl::NotFoundError("the CPU stand-in is device 0");
  gpu::DeviceInfo info;
  info.name = "CPU stand-in device";
  info.compute_major = 8;
  info.total_bytes = info.free_bytes = free_bytes_;
  info.multiprocessors = 1;
  return info;
}

absl::StatusOr<std::unique_ptr<gpu::Queue>> CpuStandInDevice::CreateQueue(int index) const {
  return std::unique_ptr<gpu::Queue>(new NoQueue());
}

absl::StatusOr<std::unique_ptr<gpu::GpuLayers>> CpuStandInDevice::CreateLayers(
    const gpu::GpuLayersSpec& spec) const {
  if (spec.model == nullptr ||
      static_cast<int64_t>(spec.layers.size()) != spec.model->hparams().n_layer) {
    return absl::InvalidArgumentError("stand-in layers: a spec of the model's layers");
  }
  for (int64_t l = 0; l < spec.model->hparams().n_layer; ++l) {
    if (!spec.layers[l]) continue;
    const LlamaHparams& h = spec.model->hparams();
    absl::Status s = spec.input_sparse_on(l)
                         ? gpu::CheckInputSparseLayer(spec.input_sparse[l], h, l)
                     : spec.gate_first_on(l) ? gpu::CheckGateFirstLayer(spec.gate_first[l], h, l)
                                             : absl::OkStatus();
    if (!s.ok()) return s;
  }
  auto layers = std::make_unique<CpuLayers>(spec, &layer_calls_, &resident_calls_,
                                            &input_sparse_tokens_, &gate_first_tokens_);
  if (absl::Status s = layers->Init(); !s.ok()) return s;
  return std::unique_ptr<gpu::GpuLayers>(std::move(layers));
}

absl::StatusOr<std::unique_ptr<gpu::GpuFfnExecutor>> CpuStandInDevice::CreateFfnExecutor(
    const gpu::GpuFfnSpec& spec) const {
  auto e = std::make_unique<CpuFfnExecutor>(spec, &ffn_launches_);
  if (absl::Status s = e->Init(); !s.ok()) return s;
  return std::unique_ptr<gpu::GpuFfnExecutor>(std::move(e));
}

}  // namespace thermocline
