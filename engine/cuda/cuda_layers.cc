// GpuLayers on CUDA (engine/gpu/gpu_layers.h): the weights, norms and KV cache of the GPU layers
// (and the output head) resident in device memory, one stream, pinned host buffers for the
// residual stream, the FFN's host round trip and the logits. Every buffer is sized in Init from
// ScratchOf / ComputeGpuLayersMemory, so Forward allocates nothing per token (a decode step's
// graph is instantiated the first time that step runs). Tokens of a batch go through
// the mat-vec kernels one at a time (prefill correctness first; no cuBLAS here). Attention reads
// each token's position from device memory, so a decode step's launches are the same at every
// position and run as CUDA graphs (cuda_graph.h): whole layers as one graph per range of layers,
// a resident hybrid layer as one graph for its attention and one for the executor's half. An
// input-sparse layer (spec.input_sparse) holds its q, k, v, gate, up and down as column layouts
// and reads, per decode token, only the columns of the inputs past its thresholds; a gate-first
// layer (spec.gate_first) reads every gate row, then the up and down_t rows of the slots that fire.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/cuda/cuda_common.h"
#include "engine/cuda/cuda_graph.h"
#include "engine/cuda/device_arena.h"
#include "engine/gpu/gpu_backend.h"
#include "engine/gpu/gpu_layers.h"
#include "engine/model/model_support.h"

namespace thermocline::gpu {
namespace {

using cuda::DevColumn;
using cuda::DeviceArena;
using cuda::DevMatrix;
using cuda::StreamGraph;
using cuda::UsesQ8Activations;

struct DevLayer {
  bool on = false;
  DevMatrix wq, wk, wv, wo, gate, up, down;
  // Input-sparse: the column layouts (qkv stacked, or q, k, v) and the thresholds.
  bool input_sparse = false;
  DevColumn qkv_c, q_c, k_c, v_c, gate_c, up_c, down_c;
  InputSparseLayer thresholds;  // its thresholds only (the layouts are above)
  // Gate-first: the sparse copies' gate, up and down_t rows, the gate scale (null: 1), thresholds.
  bool gate_first = false;
  DevMatrix gf_gate, gf_up, gf_down_t;
  const float* gf_scale = nullptr;
  float gf_gate_threshold = 0, gf_magnitude_threshold = 0;
  const float* attn_norm = nullptr;  // (n_embd)
  const float* ffn_norm = nullptr;   // (n_embd)
  void* k_cache = nullptr;           // (n_ctx, kv_dim) of spec.kv_type
  void* v_cache = nullptr;           // (n_ctx, kv_dim) of spec.kv_type
};

class CudaGpuLayers : public GpuLayers {
 public:
  explicit CudaGpuLayers(const GpuLayersSpec& spec)
      : spec_(spec),
        h_(spec.model->hparams()),
        budget_(spec.memory_cap),
        arena_(spec.budget != nullptr ? spec.budget : &budget_) {}
  ~CudaGpuLayers() override {
    cudaSetDevice(spec_.device);
    if (stream_ != nullptr) cudaStreamSynchronize(stream_);
    if (staged_ != nullptr) cudaEventDestroy(staged_);
    if (stream_ != nullptr && own_stream_) cudaStreamDestroy(stream_);
    for (void* p :
         {static_cast<void*>(h_in_), static_cast<void*>(h_xn_), static_cast<void*>(h_out_),
          static_cast<void*>(h_logits_), static_cast<void*>(h_pos_)}) {
      if (p != nullptr) cudaFreeHost(p);
    }
  }

  absl::Status Init();
  bool Owns(int64_t layer) const override {
    if (layer == h_.n_layer) return output_;
    return layer >= 0 && layer < h_.n_layer && layers_[layer].on;
  }
  absl::Status Forward(int64_t first, int64_t last, float* x, int64_t n, int64_t pos,
                       const float* cos_sin, float* logits, bool all_rows) override;
  uint64_t device_bytes() const override { return arena_.bytes(); }
  const std::vector<double>& resident_wait_seconds() const override { return waits_; }

 private:
  // The activations a mat-vec of m reads: x itself, or x quantized to Q8_0 into xq_ (launched
  // here, so call it right before the mat-vecs that read it).
  const void* Input(const DevMatrix& m, const float* x, int64_t n) {
    if (!UsesQ8Activations(m.type)) return x;
    if (quantized_ != x) cuda::QuantizeQ8_0(x, n, d_xq_, stream_);
    quantized_ = x;
    return d_xq_;
  }
  void MatVec(const DevMatrix& m, const float* x, float* y) {
    cuda::MatVec(m, Input(m, x, m.cols), nullptr, nullptr, m.rows, y, stream_);
  }
  // y = c's column-sparse mat-vec of x, reading the entries with |x| > threshold.
  void ColumnMatVec(const DevColumn& c, const float* x, float threshold, float* y) {
    cuda::ColumnMatVec(c, x, threshold, d_partial_, y, stream_);
  }
  // Token t of the chunk: x_t += attention(norm(x_t)); K, V stored at row d_pos_[t]. sparse: an
  // input-sparse layer reads only the columns past its thresholds (else every column).
  void Attention(const DevLayer& L, int64_t t, bool sparse);
  // x_t += FFN(norm(x_t)) on the device: dense, or input-sparse as Attention.
  void DenseFfn(const DevLayer& L, int64_t t, bool sparse);
  // The FFN of tokens 0..m-1 through spec_.host_ffn: x and xn down, the output back up.
  absl::Status HostFfn(int layer, const DevLayer& L, int64_t m);
  // One decode token through whole layers [first, last) and `tail`, as one graph.
  enum class Tail { kNone, kX, kLogits };  // then: nothing, x down to h_in_, logits to h_logits_
  absl::Status DecodeStep(int64_t first, int64_t last, Tail tail);
  // Token 0's layer `layer` in resident mode (spec_.device_ffn): attention and ffn_norm as one
  // graph; xn stays here, the executor predicts and adds its part into the residual, the host
  // computes its listed part, and only that partial sum comes back. One host sync.
  absl::Status ResidentLayer(int layer, const DevLayer& L);
  // This call's launch errors, without waiting (a capture may be open).
  static absl::Status LaunchError(std::string_view what) {
    return cuda::CudaStatus(cudaGetLastError(), what);
  }
  // After queueing work: this call's launch errors, the stream drained on error.
  absl::Status CheckLaunches(std::string_view what);
  // Logits of token t into host row out.
  absl::Status Head(int64_t t, float* out);

  GpuLayersSpec spec_;
  const LlamaHparams& h_;
  MemoryBudget budget_;
  DeviceArena arena_;
  std::vector<DevLayer> layers_;
  const float* out_norm_ = nullptr;
  DevMatrix output_w_;
  int64_t batch_ = 1;
  const bool half_kv_ = spec_.kv_type == KvType::kF16;
  const float* quantized_ = nullptr;  // whose Q8_0 copy d_xq_ holds (stream order)
  struct StepGraph {
    int64_t first, last;
    Tail tail;
    StreamGraph graph;
  };
  std::vector<StepGraph> step_graphs_;         // DecodeStep's, one per (first, last, tail) seen
  std::vector<StreamGraph> attention_graphs_;  // (n_layer) ResidentLayer's

  // Device scratch (ScratchOf).
  float *d_x_ = nullptr, *d_rope_ = nullptr, *d_xn_ = nullptr, *d_q_ = nullptr, *d_att_ = nullptr;
  float *d_tmp_ = nullptr, *d_gate_ = nullptr, *d_up_ = nullptr, *d_scores_ = nullptr;
  float *d_logits_ = nullptr, *d_k_ = nullptr, *d_v_ = nullptr;
  float* d_partial_ = nullptr;  // the column-sparse mat-vec's partial sums (input-sparse layers)
  // Gate-first layers: the fired slots (n_ff, then their count), their gate values, and the
  // down_t axpy's partial sums.
  int32_t* d_fired_ = nullptr;
  float *d_fired_act_ = nullptr, *d_axpy_partial_ = nullptr;
  int32_t* d_pos_ = nullptr;  // (batch) the chunk's positions
  void* d_xq_ = nullptr;
  // Pinned host buffers: x in and out plus the RoPE table, (batch, n_embd + rope_dim); the host
  // FFN's xn and output, (batch, n_embd) each; logits (n_vocab).
  float *h_in_ = nullptr, *h_xn_ = nullptr, *h_out_ = nullptr, *h_logits_ = nullptr;
  int32_t* h_pos_ = nullptr;       // (batch), uploaded to d_pos_ with x
  cudaStream_t stream_ = nullptr;  // the session's (spec.queue), or the layers' own
  bool own_stream_ = false;
  cudaEvent_t staged_ = nullptr;  // h_in_'s and h_pos_'s uploads have been read
  std::vector<double> waits_;     // (n_layer) resident_wait_seconds
};

absl::Status CudaGpuLayers::Init() {
  TC_CUDA_RETURN_IF_ERROR(cudaSetDevice(spec_.device), "cudaSetDevice");
  stream_ = cuda::StreamOf(spec_.queue);
  if (stream_ == nullptr) {
    TC_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking),
                            "cudaStreamCreate");
    own_stream_ = true;
  }
  arena_.set_stream(stream_);  // uploads ordered before the kernels that read them
  if (spec_.device_ffn != nullptr) waits_.assign(h_.n_layer, 0.0);
  TC_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&staged_, cudaEventDisableTiming),
                          "cudaEventCreate");
  const LlamaModel& m = *spec_.model;
  const int64_t kv_elems = spec_.n_ctx * h_.kv_dim();
  const int64_t kv_element = half_kv_ ? 2 : 4;
  layers_.resize(h_.n_layer);
  for (int64_t l = 0; l < h_.n_layer; ++l) {
    if (!spec_.layers[l]) continue;
    const LayerWeights& W = m.layers()[l];
    DevLayer& L = layers_[l];
    const std::string name = absl::StrCat("layer ", l, " ");
    struct Item {
      const WeightView* w;
      DevMatrix* d;
      const char* what;
    };
    L.input_sparse = spec_.input_sparse_on(l);
    if (L.input_sparse) TC_RETURN_IF_ERROR(CheckInputSparseLayer(spec_.input_sparse[l], h_, l));
    L.gate_first = spec_.gate_first_on(l);
    if (L.gate_first) TC_RETURN_IF_ERROR(CheckGateFirstLayer(spec_.gate_first[l], h_, l));
    std::vector<Item> items = {{&W.wo, &L.wo, "wo"}};
    if (!L.input_sparse) {
      items.insert(items.end(), {{&W.wq, &L.wq, "wq"}, {&W.wk, &L.wk, "wk"}, {&W.wv, &L.wv, "wv"}});
    }
    if (L.gate_first) {
      const GateFirstLayer& y = spec_.gate_first[l];
      items.push_back({&y.gate, &L.gf_gate, "gate-first gate rows"});
      items.push_back({&y.up, &L.gf_up, "gate-first up rows"});
      items.push_back({&y.down_t, &L.gf_down_t, "gate-first down_t rows"});
      L.gf_gate_threshold = y.gate_threshold;
      L.gf_magnitude_threshold = y.magnitude_threshold;
      if (y.gate_scale != nullptr) {
        absl::StatusOr<void*> sc = arena_.Upload(y.gate_scale, h_.n_ff * 4, name + "gate scale");
        if (!sc.ok()) return sc.status();
        L.gf_scale = static_cast<const float*>(*sc);
      }
    } else if (spec_.host_ffn == nullptr && !L.input_sparse) {
      items.push_back({&W.ffn_gate, &L.gate, "ffn_gate"});
      items.push_back({&W.ffn_up, &L.up, "ffn_up"});
      items.push_back({&W.ffn_down, &L.down, "ffn_down"});
    }
    for (const Item& it : items) {
      absl::StatusOr<DevMatrix> d = cuda::UploadRows(arena_, *it.w, {}, name + it.what);
      if (!d.ok()) return d.status();
      *it.d = *d;
    }
    if (L.input_sparse) {
      const InputSparseLayer& y = spec_.input_sparse[l];
      struct Column {
        const ColumnLayout* c;
        DevColumn* d;
        const char* what;
      };
      for (const Column& c :
           {Column{&y.qkv, &L.qkv_c, "q|k|v columns"}, Column{&y.q, &L.q_c, "wq columns"},
            Column{&y.k, &L.k_c, "wk columns"}, Column{&y.v, &L.v_c, "wv columns"},
            Column{&y.gate, &L.gate_c, "ffn_gate columns"},
            Column{&y.up, &L.up_c, "ffn_up columns"},
            Column{&y.down, &L.down_c, "ffn_down columns"}}) {
        if (c.c->empty()) continue;
        absl::StatusOr<DevColumn> d = cuda::UploadColumn(arena_, *c.c, name + c.what);
        if (!d.ok()) return d.status();
        *c.d = *d;
      }
      L.thresholds.attn_in_threshold = y.attn_in_threshold;
      L.thresholds.ffn_in_threshold = y.ffn_in_threshold;
      L.thresholds.magnitude_threshold = y.magnitude_threshold;
    }
    absl::StatusOr<void*> an = arena_.Upload(W.attn_norm.data(), h_.n_embd * 4, name + "norm");
    if (!an.ok()) return an.status();
    absl::StatusOr<void*> fn = arena_.Upload(W.ffn_norm.data(), h_.n_embd * 4, name + "norm");
    if (!fn.ok()) return fn.status();
    absl::StatusOr<void*> k = arena_.Allocate(kv_elems * kv_element, name + "K cache");
    if (!k.ok()) return k.status();
    absl::StatusOr<void*> v = arena_.Allocate(kv_elems * kv_element, name + "V cache");
    if (!v.ok()) return v.status();
    L.attn_norm = static_cast<const float*>(*an);
    L.ffn_norm = static_cast<const float*>(*fn);
    L.k_cache = *k;
    L.v_cache = *v;
    L.on = true;
    ++n_gpu_layers_;
  }
  const GpuLayersScratch s = ScratchOf(spec_);
  if (spec_.output) {
    absl::StatusOr<void*> on = arena_.Upload(m.output_norm().data(), h_.n_embd * 4, "output norm");
    if (!on.ok()) return on.status();
    absl::StatusOr<DevMatrix> w = cuda::UploadRows(arena_, m.output(), {}, "output head");
    if (!w.ok()) return w.status();
    absl::StatusOr<float*> lg = arena_.AllocateArray<float>(s.logits, "logits");
    if (!lg.ok()) return lg.status();
    out_norm_ = static_cast<const float*>(*on);
    output_w_ = *w;
    d_logits_ = *lg;
    output_ = true;
  }
  struct Buf {
    float** p;
    int64_t n;
    const char* what;
  };
  for (const Buf& b :
       {Buf{&d_x_, s.x, "x"}, Buf{&d_rope_, s.rope, "rope"}, Buf{&d_xn_, s.xn, "xn"},
        Buf{&d_q_, s.q, "q"}, Buf{&d_att_, s.att, "att"}, Buf{&d_tmp_, s.tmp, "tmp"},
        Buf{&d_gate_, s.gate, "gate"}, Buf{&d_up_, s.up, "up"}, Buf{&d_scores_, s.scores, "scores"},
        Buf{&d_k_, s.k, "k"}, Buf{&d_v_, s.v, "v"}}) {
    absl::StatusOr<float*> p =
        arena_.AllocateArray<float>(b.n, absl::StrCat("GPU layers scratch (", b.what, ")"));
    if (!p.ok()) return p.status();
    *b.p = *p;
  }
  if (s.fired > 0) {
    absl::StatusOr<int32_t*> fired =
        arena_.AllocateArray<int32_t>(s.fired, "GPU layers scratch (gate-first slots)");
    if (!fired.ok()) return fired.status();
    d_fired_ = *fired;
    absl::StatusOr<float*> act =
        arena_.AllocateArray<float>(s.fired_act, "GPU layers scratch (gate-first activations)");
    if (!act.ok()) return act.status();
    d_fired_act_ = *act;
    absl::StatusOr<float*> partial =
        arena_.AllocateArray<float>(s.axpy_partial, "GPU layers scratch (down_t partial sums)");
    if (!partial.ok()) return partial.status();
    d_axpy_partial_ = *partial;
  }
  if (s.column_partial > 0) {
    absl::StatusOr<float*> partial =
        arena_.AllocateArray<float>(s.column_partial, "GPU layers scratch (column partial sums)");
    if (!partial.ok()) return partial.status();
    d_partial_ = *partial;
  }
  absl::StatusOr<int32_t*> positions =
      arena_.AllocateArray<int32_t>(s.pos, "GPU layers scratch (positions)");
  if (!positions.ok()) return positions.status();
  d_pos_ = *positions;
  absl::StatusOr<void*> xq = arena_.Allocate(s.xq_bytes, "GPU layers scratch (q8 activations)");
  if (!xq.ok()) return xq.status();
  d_xq_ = *xq;
  TC_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_), "the upload of the GPU layers");

  batch_ = std::max<int64_t>(spec_.max_batch, 1);
  const int64_t rope = std::max<int64_t>(h_.rope_dim, 1);
  TC_CUDA_RETURN_IF_ERROR(
      cudaHostAlloc(&h_in_, batch_ * (h_.n_embd + rope) * 4, cudaHostAllocDefault), "pinned x");
  TC_CUDA_RETURN_IF_ERROR(cudaHostAlloc(&h_pos_, batch_ * 4, cudaHostAllocDefault),
                          "pinned positions");
  attention_graphs_.resize(h_.n_layer);
  if (spec_.host_ffn != nullptr) {
    TC_CUDA_RETURN_IF_ERROR(cudaHostAlloc(&h_xn_, batch_ * h_.n_embd * 4, cudaHostAllocDefault),
                            "pinned xn");
    TC_CUDA_RETURN_IF_ERROR(cudaHostAlloc(&h_out_, batch_ * h_.n_embd * 4, cudaHostAllocDefault),
                            "pinned FFN output");
  }
  if (output_) {
    TC_CUDA_RETURN_IF_ERROR(cudaHostAlloc(&h_logits_, h_.n_vocab * 4, cudaHostAllocDefault),
                            "pinned logits");
  }
  return absl::OkStatus();
}

void CudaGpuLayers::Attention(const DevLayer& L, int64_t t, bool sparse) {
  const int64_t d = h_.n_embd;
  float* x = d_x_ + t * d;
  float* xn = d_xn_ + t * d;
  const float* cs = d_rope_ + t * std::max<int64_t>(h_.rope_dim, 1);
  cuda::RmsNorm(x, L.attn_norm, d, h_.rms_eps, xn, stream_);
  quantized_ = nullptr;
  if (L.input_sparse) {
    // A negative threshold keeps every nonzero entry: the dense product.
    const float threshold = sparse ? L.thresholds.attn_in_threshold : -1.0f;
    if (L.qkv_c.out > 0) {
      // q | k | v into the FFN's gate scratch (sized for it), then each to its place.
      ColumnMatVec(L.qkv_c, xn, threshold, d_gate_);
      cudaMemcpyAsync(d_q_, d_gate_, h_.q_dim() * 4, cudaMemcpyDeviceToDevice, stream_);
      cudaMemcpyAsync(d_k_, d_gate_ + h_.q_dim(), h_.kv_dim() * 4, cudaMemcpyDeviceToDevice,
                      stream_);
      cudaMemcpyAsync(d_v_, d_gate_ + h_.q_dim() + h_.kv_dim(), h_.v_dim() * 4,
                      cudaMemcpyDeviceToDevice, stream_);
    } else {
      ColumnMatVec(L.q_c, xn, threshold, d_q_);
      ColumnMatVec(L.k_c, xn, threshold, d_k_);
      ColumnMatVec(L.v_c, xn, threshold, d_v_);
    }
  } else {
    MatVec(L.wq, xn, d_q_);
    MatVec(L.wk, xn, d_k_);
    MatVec(L.wv, xn, d_v_);
  }
  cuda::Rope(d_q_, h_.n_head, h_.head_dim, h_.rope_dim, cs, stream_);
  cuda::Rope(d_k_, h_.n_head_kv, h_.head_dim, h_.rope_dim, cs, stream_);
  cuda::StoreKv(d_k_, d_v_, L.k_cache, L.v_cache, half_kv_, h_.kv_dim(), d_pos_ + t, stream_);
  cuda::AttentionAt(d_q_, L.k_cache, L.v_cache, half_kv_, d_pos_ + t, spec_.n_ctx, h_.n_head,
                    h_.n_head_kv, h_.head_dim, d_scores_, d_att_, stream_);
  quantized_ = nullptr;
  MatVec(L.wo, d_att_, d_tmp_);
  cuda::Add(x, d_tmp_, d, stream_);
}

void CudaGpuLayers::DenseFfn(const DevLayer& L, int64_t t, bool sparse) {
  const int64_t d = h_.n_embd;
  float* x = d_x_ + t * d;
  float* xn = d_xn_ + t * d;
  cuda::RmsNorm(x, L.ffn_norm, d, h_.rms_eps, xn, stream_);
  quantized_ = nullptr;
  if (L.input_sparse) {
    const InputSparseLayer& th = L.thresholds;
    ColumnMatVec(L.gate_c, xn, sparse ? th.ffn_in_threshold : -1.0f, d_gate_);
    ColumnMatVec(L.up_c, xn, sparse ? th.ffn_in_threshold : -1.0f, d_up_);
    cuda::GatedActivation(static_cast<int>(h_.activation), d_gate_, d_up_, nullptr, h_.n_ff, -1.0f,
                          nullptr, stream_);
    // Down reads the activations past the magnitude threshold.
    ColumnMatVec(L.down_c, d_gate_, sparse ? th.magnitude_threshold : -1.0f, d_tmp_);
    cuda::Add(x, d_tmp_, d, stream_);
    return;
  }
  if (L.gate_first) {
    // Every gate row; the slots whose |silu(g)| · scale passes (all for a dense prompt) with
    // their g; up rows of those; act(g) · u past the magnitude threshold; the down_t axpy.
    const int32_t* count = d_fired_ + h_.n_ff;
    MatVec(L.gf_gate, xn, d_gate_);
    cuda::GateFirstCompact(d_gate_, L.gf_scale, h_.n_ff, sparse ? L.gf_gate_threshold : -1.0f,
                           d_fired_, d_fired_act_, d_fired_ + h_.n_ff, stream_);
    cuda::MatVec(L.gf_up, Input(L.gf_up, xn, d), d_fired_, count, h_.n_ff, d_up_, stream_);
    cuda::GatedActivation(static_cast<int>(h_.activation), d_fired_act_, d_up_, count, h_.n_ff,
                          sparse ? L.gf_magnitude_threshold : -1.0f, nullptr, stream_);
    cuda::SparseAxpy(L.gf_down_t, d_fired_, d_fired_act_, count, h_.n_ff, d_axpy_partial_, d_tmp_,
                     stream_);
    cuda::Add(x, d_tmp_, d, stream_);
    return;
  }
  MatVec(L.gate, xn, d_gate_);
  MatVec(L.up, xn, d_up_);
  cuda::GatedActivation(static_cast<int>(h_.activation), d_gate_, d_up_, nullptr, h_.n_ff, 0.0f,
                        nullptr, stream_);
  quantized_ = nullptr;
  MatVec(L.down, d_gate_, d_tmp_);
  cuda::Add(x, d_tmp_, d, stream_);
}

absl::Status CudaGpuLayers::HostFfn(int layer, const DevLayer& L, int64_t m) {
  const int64_t d = h_.n_embd;
  for (int64_t t = 0; t < m; ++t) {
    cuda::RmsNorm(d_x_ + t * d, L.ffn_norm, d, h_.rms_eps, d_xn_ + t * d, stream_);
  }
  cudaMemcpyAsync(h_in_, d_x_, m * d * 4, cudaMemcpyDeviceToHost, stream_);
  cudaMemcpyAsync(h_xn_, d_xn_, m * d * 4, cudaMemcpyDeviceToHost, stream_);
  TC_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_), "the GPU layers (FFN input)");
  spec_.host_ffn->Forward(layer, h_in_, h_xn_, m, h_out_);
  cudaMemcpyAsync(d_xn_, h_out_, m * d * 4, cudaMemcpyHostToDevice, stream_);
  cuda::Add(d_x_, d_xn_, m * d, stream_);
  return absl::OkStatus();
}

absl::Status CudaGpuLayers::DecodeStep(int64_t first, int64_t last, Tail tail) {
  StepGraph* g = nullptr;
  for (StepGraph& s : step_graphs_) {
    if (s.first == first && s.last == last && s.tail == tail) g = &s;
  }
  if (g == nullptr) g = &step_graphs_.emplace_back(StepGraph{first, last, tail, StreamGraph()});
  return g->graph.Run(stream_, [&]() -> absl::Status {
    for (int64_t l = first; l < last; ++l) {
      Attention(layers_[l], 0, /*sparse=*/true);
      DenseFfn(layers_[l], 0, /*sparse=*/true);
    }
    if (tail == Tail::kLogits) {
      cuda::RmsNorm(d_x_, out_norm_, h_.n_embd, h_.rms_eps, d_xn_, stream_);
      quantized_ = nullptr;
      MatVec(output_w_, d_xn_, d_logits_);
      cudaMemcpyAsync(h_logits_, d_logits_, h_.n_vocab * 4, cudaMemcpyDeviceToHost, stream_);
    } else if (tail == Tail::kX) {
      cudaMemcpyAsync(h_in_, d_x_, h_.n_embd * 4, cudaMemcpyDeviceToHost, stream_);
    }
    return LaunchError("the GPU layers' decode step");
  });
}

absl::Status CudaGpuLayers::ResidentLayer(int layer, const DevLayer& L) {
  const int64_t d = h_.n_embd;
  TC_RETURN_IF_ERROR(attention_graphs_[layer].Run(stream_, [&]() -> absl::Status {
    Attention(L, 0, /*sparse=*/true);
    cuda::RmsNorm(d_x_, L.ffn_norm, d, h_.rms_eps, d_xn_, stream_);
    return LaunchError("the GPU layers' attention");
  }));
  GpuFfnExecutor& device = *spec_.device_ffn;
  TC_RETURN_IF_ERROR(device.EnqueueResident(layer, d_xn_, d_x_));
  const auto t0 = std::chrono::steady_clock::now();
  absl::StatusOr<HostPart> host = device.WaitHostPart();
  if (!host.ok()) return host.status();
  waits_[layer] += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  TC_RETURN_IF_ERROR(
      spec_.host_ffn->ForwardListed(layer, host->xn, host->active, host->n_active, host->partial));
  return device.EnqueueAddHostPart(d_x_);
}

absl::Status CudaGpuLayers::CheckLaunches(std::string_view what) {
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) {
    cudaStreamSynchronize(stream_);  // nothing of this call left in flight
    return cuda::CudaStatus(e, what);
  }
  return absl::OkStatus();
}

absl::Status CudaGpuLayers::Head(int64_t t, float* out) {
  const int64_t d = h_.n_embd;
  cuda::RmsNorm(d_x_ + t * d, out_norm_, d, h_.rms_eps, d_xn_ + t * d, stream_);
  quantized_ = nullptr;
  MatVec(output_w_, d_xn_ + t * d, d_logits_);
  cudaMemcpyAsync(h_logits_, d_logits_, h_.n_vocab * 4, cudaMemcpyDeviceToHost, stream_);
  TC_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_), "the GPU output head");
  std::memcpy(out, h_logits_, h_.n_vocab * 4);
  return absl::OkStatus();
}

absl::Status CudaGpuLayers::Forward(int64_t first, int64_t last, float* x, int64_t n, int64_t pos,
                                    const float* cos_sin, float* logits, bool all_rows) {
  if (first < 0 || last > h_.n_layer || first >= last || n < 0 || pos < 0 ||
      pos + n > spec_.n_ctx || (logits != nullptr && (last != h_.n_layer || !output_))) {
    return absl::InvalidArgumentError(absl::StrCat("GPU layers: bad call: layers [", first, ", ",
                                                   last, "), ", n, " tokens at ", pos, ", context ",
                                                   spec_.n_ctx));
  }
  for (int64_t l = first; l < last; ++l) {
    if (!layers_[l].on) {
      return absl::InvalidArgumentError(
          absl::StrCat("GPU layers: layer ", l, " is not on the GPU"));
    }
  }
  // The launching thread may not have this device current (a slot's thread, a test's).
  TC_CUDA_RETURN_IF_ERROR(cudaSetDevice(spec_.device), "cudaSetDevice");
  const int64_t d = h_.n_embd, rope = std::max<int64_t>(h_.rope_dim, 1);
  // A call of one token is a decode step's: sparse, through the graph or the resident path. A
  // prompt's tokens are dense unless the spec asks every token sparse, in every chunk, its last
  // one-token chunk included, as the CPU and the stand-in decide per call.
  const bool decode = n == 1;
  const bool sparse = decode || !spec_.dense_prefill;
  for (int64_t c0 = 0; c0 < n; c0 += batch_) {
    const int64_t m = std::min(batch_, n - c0);
    // One pinned staging buffer: x rows, then the RoPE rows; the previous chunk's upload from
    // it must have been read before it is written again.
    if (c0 > 0) TC_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(staged_), "the GPU layers' staging");
    std::memcpy(h_in_, x + c0 * d, m * d * 4);
    std::memcpy(h_in_ + batch_ * d, cos_sin + c0 * h_.rope_dim, m * h_.rope_dim * 4);
    for (int64_t t = 0; t < m; ++t) h_pos_[t] = static_cast<int32_t>(pos + c0 + t);
    cudaMemcpyAsync(d_x_, h_in_, m * d * 4, cudaMemcpyHostToDevice, stream_);
    cudaMemcpyAsync(d_rope_, h_in_ + batch_ * d, m * rope * 4, cudaMemcpyHostToDevice, stream_);
    cudaMemcpyAsync(d_pos_, h_pos_, m * 4, cudaMemcpyHostToDevice, stream_);
    cudaEventRecord(staged_, stream_);
    float* const row_logits = logits == nullptr ? nullptr
                              : all_rows        ? logits + c0 * h_.n_vocab
                              : c0 + m == n     ? logits
                                                : nullptr;
    if (decode && spec_.host_ffn == nullptr) {
      // A decode token through whole layers: one graph.
      const Tail tail = logits == nullptr       ? Tail::kX
                        : row_logits != nullptr ? Tail::kLogits
                                                : Tail::kNone;
      if (absl::Status st = DecodeStep(first, last, tail); !st.ok()) {
        cudaStreamSynchronize(stream_);  // nothing of this call left in flight
        return st;
      }
      if (tail == Tail::kNone) continue;
      TC_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_), "the GPU layers");
      if (tail == Tail::kLogits) {
        std::memcpy(row_logits, h_logits_, h_.n_vocab * 4);
      } else {
        std::memcpy(x + c0 * d, h_in_, d * 4);
      }
      continue;
    }
    for (int64_t l = first; l < last; ++l) {
      const DevLayer& L = layers_[l];
      if (spec_.host_ffn != nullptr && spec_.device_ffn != nullptr && decode &&
          spec_.device_ffn->RunsResident(static_cast<int>(l))) {
        if (absl::Status st = ResidentLayer(static_cast<int>(l), L); !st.ok()) {
          cudaStreamSynchronize(stream_);
          return st;
        }
      } else if (spec_.host_ffn != nullptr) {
        for (int64_t t = 0; t < m; ++t) Attention(L, t, /*sparse=*/true);
        TC_RETURN_IF_ERROR(CheckLaunches("the GPU layers' attention"));
        TC_RETURN_IF_ERROR(HostFfn(static_cast<int>(l), L, m));
      } else {
        for (int64_t t = 0; t < m; ++t) {
          Attention(L, t, sparse);
          DenseFfn(L, t, sparse);
        }
      }
    }
    if (logits != nullptr) {
      for (int64_t t = 0; t < m; ++t) {
        if (all_rows) {
          TC_RETURN_IF_ERROR(Head(t, logits + (c0 + t) * h_.n_vocab));
        } else if (c0 + t == n - 1) {
          TC_RETURN_IF_ERROR(Head(t, logits));
        }
      }
    } else {
      cudaMemcpyAsync(h_in_, d_x_, m * d * 4, cudaMemcpyDeviceToHost, stream_);
      TC_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_), "the GPU layers");
      std::memcpy(x + c0 * d, h_in_, m * d * 4);
    }
  }
  return CheckLaunches("the GPU layers' launches");
}

}  // namespace

absl::StatusOr<std::unique_ptr<GpuLayers>> CreateGpuLayers(const GpuLayersSpec& spec) {
  if (spec.model == nullptr) return absl::InvalidArgumentError("GPU layers: no model");
  const LlamaHparams& h = spec.model->hparams();
  if (static_cast<int64_t>(spec.layers.size()) != h.n_layer || spec.n_ctx <= 0 ||
      spec.max_batch <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("GPU layers: need one flag per layer (",
                                                   h.n_layer, "), a positive context and batch"));
  }
  TC_RETURN_IF_ERROR(RequireLlamaLayers(*spec.model, "the GPU layers"));
  if (spec.output && (h.n_layer == 0 || !spec.layers[h.n_layer - 1])) {
    return absl::InvalidArgumentError(
        "GPU layers: the output head needs the last layer on the GPU");
  }
  absl::StatusOr<DeviceInfo> info = Probe(spec.device);
  if (!info.ok()) return info.status();
  auto layers = std::make_unique<CudaGpuLayers>(spec);
  TC_RETURN_IF_ERROR(layers->Init());
  return layers;
}

}  // namespace thermocline::gpu
