// The device memory of whole GPU layers and the -ngl plan: plain arithmetic, no CUDA.
#include "engine/gpu/gpu_layers.h"

#include <algorithm>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "engine/gpu/axpy_splits.h"
#include "engine/model/model_support.h"
#include "engine/ops/ggml_types.h"
#include "engine/ops/type_table.h"
#include "engine/util/status_macros.h"

namespace thermocline::gpu {
namespace {

// What DeviceArena accounts for an allocation of `bytes` (0 bytes still takes one granule).
uint64_t Granules(uint64_t bytes) { return MemoryBudget::Rounded(std::max<uint64_t>(bytes, 1)); }

uint64_t MatrixBytes(const WeightView& w) {
  return Granules(static_cast<uint64_t>(w.rows) * RowBytes(w.type, w.cols));
}

// The types engine/cuda has kernels for (the weight-type table's device column; gpu_backend.h's
// TypeSupported needs the backend), in rows of whole blocks.
bool HasKernels(const WeightView& w) {
  const WeightTypeRow* row = FindWeightType(w.type);
  return row != nullptr && row->device != DeviceKernel::kNone &&
         w.cols % TypeInfo(w.type).block_size == 0;
}

// The layouts of an input-sparse layer.
std::vector<const ColumnLayout*> LayoutsOf(const InputSparseLayer& y) {
  return {&y.qkv, &y.q, &y.k, &y.v, &y.gate, &y.up, &y.down};
}

}  // namespace

GpuLayersScratch ScratchOf(const GpuLayersSpec& spec) {
  const LlamaHparams& h = spec.model->hparams();
  const int64_t b = std::max<int64_t>(spec.max_batch, 1);
  GpuLayersScratch s;
  s.x = b * h.n_embd;
  s.rope = b * std::max<int64_t>(h.rope_dim, 1);
  s.xn = b * h.n_embd;
  s.q = h.q_dim();
  s.att = h.q_dim();
  s.tmp = h.n_embd;
  s.gate = spec.host_ffn == nullptr ? h.n_ff : 0;
  s.up = s.gate;
  s.scores = h.n_head * spec.n_ctx;
  s.k = h.kv_dim();
  s.v = h.kv_dim();
  s.pos = b;
  s.xq_bytes = std::max({h.n_embd, h.q_dim(), h.n_ff}) / 32 * 34;
  s.logits = spec.output ? h.n_vocab : 0;
  for (size_t l = 0; l < spec.layers.size(); ++l) {
    if (!spec.layers[l] || !spec.input_sparse_on(static_cast<int64_t>(l))) continue;
    for (const ColumnLayout* c : LayoutsOf(spec.input_sparse[l])) {
      s.column_partial = std::max(s.column_partial, ColumnGridOf(*c).splits * c->out);
    }
    // A stacked q | k | v lands in gate's scratch first.
    s.gate = std::max(s.gate, h.q_dim() + h.kv_dim() + h.v_dim());
  }
  for (size_t l = 0; l < spec.layers.size(); ++l) {
    if (!spec.layers[l] || !spec.gate_first_on(static_cast<int64_t>(l))) continue;
    s.fired = h.n_ff + 1;
    s.fired_act = h.n_ff;
    s.axpy_partial = static_cast<int64_t>(AxpyPartialSplits(h.n_ff)) * h.n_embd;
  }
  return s;
}

uint64_t GpuLayersMemory::Total(const GpuLayersSpec& spec) const {
  uint64_t total = scratch + (spec.output ? output : 0);
  for (size_t l = 0; l < layer.size() && l < spec.layers.size(); ++l) {
    if (spec.layers[l]) total += layer[l];
  }
  return total;
}

GpuLayersMemory ComputeGpuLayersMemory(const GpuLayersSpec& spec) {
  const LlamaModel& m = *spec.model;
  const LlamaHparams& h = m.hparams();
  const GpuLayersScratch s = ScratchOf(spec);
  GpuLayersMemory mem;
  for (int64_t n : {s.x, s.rope, s.xn, s.q, s.att, s.tmp, s.gate, s.up, s.scores, s.k, s.v}) {
    mem.scratch += Granules(n * sizeof(float));
  }
  if (s.column_partial > 0) mem.scratch += Granules(s.column_partial * sizeof(float));
  if (s.fired > 0) {
    mem.scratch += Granules(s.fired * sizeof(int32_t)) + Granules(s.fired_act * sizeof(float)) +
                   Granules(s.axpy_partial * sizeof(float));
  }
  mem.scratch += Granules(s.pos * sizeof(int32_t));
  mem.scratch += Granules(s.xq_bytes);
  const uint64_t norm = Granules(h.n_embd * sizeof(float));
  const uint64_t element = spec.kv_type == KvType::kF16 ? sizeof(uint16_t) : sizeof(float);
  const uint64_t kv = Granules(static_cast<uint64_t>(spec.n_ctx) * h.kv_dim() * element);
  for (int64_t l = 0; l < h.n_layer; ++l) {
    const LayerWeights& L = m.layers()[l];
    uint64_t bytes = 2 * norm + 2 * kv + MatrixBytes(L.wo);
    if (spec.input_sparse_on(l)) {
      for (const ColumnLayout* c : LayoutsOf(spec.input_sparse[l])) {
        bytes += ColumnLayoutDeviceBytes(*c);
      }
    } else if (spec.gate_first_on(l)) {
      const GateFirstLayer& y = spec.gate_first[l];
      for (const WeightView* w : {&L.wq, &L.wk, &L.wv, &y.gate, &y.up, &y.down_t}) {
        bytes += MatrixBytes(*w);
      }
      if (y.gate_scale != nullptr) bytes += Granules(h.n_ff * sizeof(float));
    } else {
      for (const WeightView* w : {&L.wq, &L.wk, &L.wv}) bytes += MatrixBytes(*w);
      if (spec.host_ffn == nullptr) {
        for (const WeightView* w : {&L.ffn_gate, &L.ffn_up, &L.ffn_down}) bytes += MatrixBytes(*w);
      }
    }
    mem.layer.push_back(bytes);
  }
  mem.output = norm + MatrixBytes(m.output()) + Granules(h.n_vocab * sizeof(float));
  return mem;
}

absl::Status CheckInputSparseLayer(const InputSparseLayer& y, const LlamaHparams& h,
                                   int64_t layer) {
  auto is = [](const ColumnLayout& c, int64_t out, int64_t in) {
    return c.out == out && c.in == in && ColumnLayoutConsistent(c);
  };
  const bool qkv = y.qkv.empty() ? is(y.q, h.q_dim(), h.n_embd) && is(y.k, h.kv_dim(), h.n_embd) &&
                                       is(y.v, h.v_dim(), h.n_embd)
                                 : is(y.qkv, h.q_dim() + h.kv_dim() + h.v_dim(), h.n_embd) &&
                                       y.q.empty() && y.k.empty() && y.v.empty();
  if (!qkv || !is(y.gate, h.n_ff, h.n_embd) || !is(y.up, h.n_ff, h.n_embd) ||
      !is(y.down, h.n_embd, h.n_ff)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "GPU layers: layer ", layer, "'s input-sparse layouts do not have the model's shapes"));
  }
  return absl::OkStatus();
}

absl::Status CheckGateFirstLayer(const GateFirstLayer& y, const LlamaHparams& h, int64_t layer) {
  auto is = [](const WeightView& w, int64_t rows, int64_t cols) {
    return w.data != nullptr && w.rows == rows && w.cols == cols;
  };
  if (!is(y.gate, h.n_ff, h.n_embd) || !is(y.up, h.n_ff, h.n_embd) ||
      !is(y.down_t, h.n_ff, h.n_embd)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "GPU layers: layer ", layer, "'s gate-first rows do not have the model's shapes"));
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> ParseGpuLayers(const std::string& text) {
  if (text == "auto") return kAutoLayers;
  int64_t n = 0;
  if (!absl::SimpleAtoi(text, &n) || n < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--gpu-layers ", text, ": use a number of layers (0 or more) or auto (as many as fit)"));
  }
  return n;
}

absl::StatusOr<GpuLayersSpec> PlanWholeLayers(const LlamaModel& model, int64_t requested,
                                              int64_t n_ctx, int64_t max_batch, uint64_t memory_cap,
                                              KvType kv_type,
                                              std::vector<InputSparseLayer> input_sparse,
                                              std::vector<GateFirstLayer> gate_first) {
  const int64_t n_layer = model.hparams().n_layer;
  if (absl::Status s = RequireLlamaLayers(model, "--gpu-layers"); !s.ok()) return s;
  if (!input_sparse.empty() && static_cast<int64_t>(input_sparse.size()) != n_layer) {
    return absl::InvalidArgumentError(absl::StrCat("--gpu-layers: ", input_sparse.size(),
                                                   " input-sparse layer entries for ", n_layer,
                                                   " layers"));
  }
  if (!gate_first.empty() && static_cast<int64_t>(gate_first.size()) != n_layer) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--gpu-layers: ", gate_first.size(), " gate-first layer entries for ", n_layer, " layers"));
  }
  for (int64_t l = 0; l < n_layer; ++l) {
    const LayerWeights& L = model.layers()[l];
    std::vector<const WeightView*> matrices = {&L.wo};
    if (l < static_cast<int64_t>(input_sparse.size()) && input_sparse[l].on()) {
      TC_RETURN_IF_ERROR(CheckInputSparseLayer(input_sparse[l], model.hparams(), l));
      // The layouts' float form holds rows of a float type or Q8_0, which the kernels read.
      for (const ColumnLayout* c : LayoutsOf(input_sparse[l])) {
        if (c->form == ColumnLayout::Form::kRows) matrices.push_back(&c->rows);
      }
    } else if (l < static_cast<int64_t>(gate_first.size()) && gate_first[l].on()) {
      TC_RETURN_IF_ERROR(CheckGateFirstLayer(gate_first[l], model.hparams(), l));
      const GateFirstLayer& y = gate_first[l];
      matrices.insert(matrices.end(), {&L.wq, &L.wk, &L.wv, &y.gate, &y.up, &y.down_t});
    } else {
      matrices.insert(matrices.end(), {&L.wq, &L.wk, &L.wv, &L.ffn_gate, &L.ffn_up, &L.ffn_down});
    }
    for (const WeightView* w : matrices) {
      if (!HasKernels(*w)) {
        return absl::InvalidArgumentError(
            absl::StrCat("--gpu-layers: layer ", l, " has ", TypeName(w->type),
                         " weights, which have no CUDA kernels (", WeightTypeNames(), " do)"));
      }
    }
  }
  GpuLayersSpec spec;
  spec.model = &model;
  spec.layers.assign(n_layer, 0);
  spec.n_ctx = n_ctx;
  spec.max_batch = max_batch;
  spec.memory_cap = memory_cap;
  spec.kv_type = kv_type;
  spec.input_sparse = std::move(input_sparse);
  spec.gate_first = std::move(gate_first);
  // What the first n layers (and the head) take: the scratch is sized for the kinds of the
  // layers on (an input-sparse or gate-first layer needs more than a dense one).
  auto put_on = [&](int64_t n, bool output) {
    std::fill(spec.layers.begin(), spec.layers.end(), 0);
    std::fill_n(spec.layers.begin(), n, 1);
    spec.output = output;
  };
  auto total_of = [&](int64_t n, bool output) {
    put_on(n, output);
    return ComputeGpuLayersMemory(spec).Total(spec);
  };
  int64_t n = 0;
  bool output = false;
  if (requested == kAutoLayers) {
    while (n < n_layer && total_of(n + 1, false) <= memory_cap) ++n;
    output = n == n_layer && HasKernels(model.output()) && total_of(n, true) <= memory_cap;
  } else {
    n = std::min(requested, n_layer);
    output = n > 0 && n == n_layer && HasKernels(model.output());
  }
  put_on(n, output);
  const GpuLayersMemory mem = ComputeGpuLayersMemory(spec);
  const uint64_t total = n == 0 ? 0 : mem.Total(spec);
  if (total > memory_cap) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "--gpu-layers ", n, " needs ", total >> 20, " MiB of GPU memory (", mem.layer[0] >> 20,
        " MiB per layer with its KV cache of ", n_ctx, " positions, ", mem.scratch >> 20,
        " MiB scratch), more than the --gpu-memory cap of ", memory_cap >> 20,
        " MiB; use fewer layers, auto, or a shorter context"));
  }
  return spec;
}

}  // namespace thermocline::gpu
