// GpuFfnExecutor on CUDA (engine/gpu/gpu_ffn_executor.h): per layer the device neurons' gate/up
// rows, down_t rows, the compact-row → neuron table, the neuron → compact-row map and the
// predictor (fc2 of every neuron) live on the GPU; the session's stream (or one of its own),
// pinned host buffers for xn, the active lists and the partial sums. Every buffer is sized in
// Create, so no call allocates (a resident layer's CUDA graph is instantiated at its first
// EnqueueResident and replayed after). Every call first makes the executor's device current (a
// launching thread may not have it) and checks its own launches before returning, so an error is
// reported by the call that caused it; a call that fails after queueing work waits for the stream
// first, so no pinned buffer is left in flight.
#include <algorithm>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/cuda/cuda_common.h"
#include "engine/cuda/cuda_graph.h"
#include "engine/cuda/device_arena.h"
#include "engine/gpu/gpu_backend.h"
#include "engine/gpu/gpu_ffn_executor.h"

namespace thermocline::gpu {
namespace {

using cuda::DeviceArena;
using cuda::DevMatrix;

static_assert(static_cast<int>(FfnActivation::kSilu) == 0 &&
                  static_cast<int>(FfnActivation::kRelu) == 1 &&
                  static_cast<int>(FfnActivation::kDRelu) == 2,
              "cuda::GatedActivation numbers activations in FfnActivation's order");

struct DeviceLayer {
  int64_t n_dev = 0;
  const int32_t* compact = nullptr;  // (n_ff) neuron id → compact row, -1 on the host (resident)
  DevMatrix gate, up, down_t;        // compact rows (n_dev, n_embd)
  const int32_t* table = nullptr;    // (n_dev) compact row → neuron id
  int32_t* all = nullptr;            // (n_dev + 1): 0..n_dev-1, then n_dev (the rank-0 list)
  int64_t rank = 0;
  DevMatrix fc1, fc2;         // (rank, n_embd), (n_ff, rank)
  const float* b1 = nullptr;  // (rank)
  const float* b2 = nullptr;  // (n_ff)
  float threshold = 0.0f;
  float magnitude_threshold = 0.0f;
  std::vector<int32_t> compact_of;  // host: neuron id → compact row, -1 when on the host
};

class CudaFfnExecutor : public GpuFfnExecutor {
 public:
  explicit CudaFfnExecutor(const GpuFfnSpec& spec)
      : n_embd_(spec.n_embd),
        n_ff_(spec.n_ff),
        device_(spec.device),
        activation_(spec.activation),
        budget_(spec.memory_cap),
        arena_(spec.budget != nullptr ? spec.budget : &budget_) {}

  ~CudaFfnExecutor() override {
    cudaSetDevice(device_);
    if (stream_ != nullptr) cudaStreamSynchronize(stream_);
    for (cudaEvent_t e : {done_, host_ready_}) {
      if (e != nullptr) cudaEventDestroy(e);
    }
    if (stream_ != nullptr && own_stream_) cudaStreamDestroy(stream_);
    for (void* p :
         {static_cast<void*>(h_x_), static_cast<void*>(h_idx_), static_cast<void*>(h_out_),
          static_cast<void*>(h_counts_), static_cast<void*>(h_res_xn_),
          static_cast<void*>(h_res_idx_), static_cast<void*>(h_res_partial_)}) {
      if (p != nullptr) cudaFreeHost(p);
    }
  }

  absl::Status Init(const GpuFfnSpec& spec);

  absl::Status Launch(int layer, const float* xn, const int32_t* active, int64_t n_active) override;
  absl::Status Wait(float* out, int64_t* n_predicted, int64_t* n_fired) override;
  uint64_t device_bytes() const override { return arena_.bytes(); }
  bool RunsResident(int layer) const override {
    return layer >= 0 && layer < static_cast<int>(layers_.size()) &&
           layers_[layer].compact != nullptr;
  }
  absl::Status EnqueueResident(int layer, const float* xn, float* x) override;
  absl::StatusOr<HostPart> WaitHostPart() override;
  absl::Status EnqueueAddHostPart(float* x) override;

 private:
  // The activations a mat-vec of m reads: x itself, or its Q8_0 copy in d_xq_.
  const void* ActivationsFor(const DevMatrix& m, const float* x) const {
    return cuda::UsesQ8Activations(m.type) ? static_cast<const void*>(d_xq_) : x;
  }
  // The device part's FFN over list (count on the device, at most max_n) from x into d_out_.
  void DevicePart(const DeviceLayer& L, const float* x, const int32_t* list, const int32_t* count,
                  int64_t max_n, cudaStream_t s);
  // After queueing work: this call's launch errors, the stream drained on error.
  absl::Status CheckLaunches(std::string_view what);
  // EnqueueResident's stream work (captured as a graph): no synchronization in it.
  absl::Status QueueResident(const DeviceLayer& L, const float* xn, float* x);

  int64_t n_embd_;
  int64_t n_ff_;
  int device_;
  FfnActivation activation_;
  MemoryBudget budget_;
  DeviceArena arena_;
  std::vector<DeviceLayer> layers_;
  int64_t max_dev_ = 0;
  bool need_q8_ = false;

  // Device scratch.
  float* d_x_ = nullptr;        // (n_embd)
  void* d_xq_ = nullptr;        // (n_embd / 32) Q8_0 blocks
  float* d_hidden_ = nullptr;   // (max rank)
  void* d_hq_ = nullptr;        // (max rank / 32) Q8_0 blocks
  float* d_logits_ = nullptr;   // (max_dev)
  int32_t* d_idx_ = nullptr;    // (max_dev + 1): the active list; its count at [max_dev]
  float* d_gate_ = nullptr;     // (max_dev) per list entry: gate, then the activation
  float* d_up_ = nullptr;       // (max_dev)
  float* d_partial_ = nullptr;  // (AxpySplits(max_dev), n_embd)
  float* d_out_ = nullptr;      // (n_embd)
  int32_t* d_fired_ = nullptr;  // (1)
  // Resident mode: the predictor's logits over every neuron, the host's active list (count at
  // [n_ff]) and the host's partial sum on its way up.
  float* d_res_logits_ = nullptr;     // (n_ff)
  int32_t* d_res_idx_ = nullptr;      // (n_ff + 1)
  float* d_res_partial_ = nullptr;    // (n_embd)
  float* h_res_xn_ = nullptr;         // pinned (n_embd)
  int32_t* h_res_idx_ = nullptr;      // pinned (n_ff + 1)
  float* h_res_partial_ = nullptr;    // pinned (n_embd)
  cudaEvent_t host_ready_ = nullptr;  // the host's half has landed
  bool resident_pending_ = false;     // EnqueueResident without WaitHostPart yet
  // (n_layers) EnqueueResident's launches as one CUDA graph per layer, for the xn and x it was
  // captured with (the GPU layers always pass the same two).
  struct ResidentGraph {
    const float* xn = nullptr;
    float* x = nullptr;
    cuda::StreamGraph graph;
  };
  std::vector<ResidentGraph> resident_graphs_;
  // Pinned host buffers.
  float* h_x_ = nullptr;         // (n_embd)
  int32_t* h_idx_ = nullptr;     // (max_dev + 1)
  float* h_out_ = nullptr;       // (n_embd)
  int32_t* h_counts_ = nullptr;  // (2): predicted, fired
  cudaStream_t stream_ = nullptr;
  bool own_stream_ = false;
  cudaEvent_t done_ = nullptr;
  int launched_ = -1;  // the layer in flight, -1: none
  bool launched_empty_ = false;
};

absl::Status CheckLayer(const GpuFfnSpec& spec, size_t l) {
  const GpuFfnLayerSpec& s = spec.layers[l];
  const std::string at = absl::StrCat("GPU FFN layer ", l, ": ");
  for (const WeightView* w : {&s.gate, &s.up, &s.down_t}) {
    if (w->rows != spec.n_ff || w->cols != spec.n_embd) {
      return absl::InvalidArgumentError(
          absl::StrCat(at, "gate/up/down_t must be (n_ff, n_embd) = (", spec.n_ff, ", ",
                       spec.n_embd, "), got (", w->rows, ", ", w->cols, ")"));
    }
    if (absl::StatusOr<cuda::KType> t = cuda::KernelType(*w); !t.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(at, t.status().message()));
    }
  }
  std::vector<uint8_t> seen(spec.n_ff, 0);
  for (int32_t n : s.device_neurons) {
    if (n < 0 || n >= spec.n_ff || seen[n]) {
      return absl::InvalidArgumentError(
          absl::StrCat(at, "device neuron ", n, " is out of range or listed twice"));
    }
    seen[n] = 1;
  }
  if (s.rank > 0) {
    if (s.fc1.rows != s.rank || s.fc1.cols != spec.n_embd || s.fc2.rows != spec.n_ff ||
        s.fc2.cols != s.rank || static_cast<int64_t>(s.b1.size()) != s.rank ||
        static_cast<int64_t>(s.b2.size()) != spec.n_ff) {
      return absl::InvalidArgumentError(absl::StrCat(at, "predictor shapes do not match"));
    }
    for (const WeightView* w : {&s.fc1, &s.fc2}) {
      if (absl::StatusOr<cuda::KType> t = cuda::KernelType(*w); !t.ok()) {
        return absl::InvalidArgumentError(absl::StrCat(at, "predictor: ", t.status().message()));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status CudaFfnExecutor::Init(const GpuFfnSpec& spec) {
  TC_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_), "cudaSetDevice");
  // The session's stream when there is one, so that the GPU layers' work and this executor's are
  // ordered on the device; uploads go on it too, before any kernel reads them.
  stream_ = cuda::StreamOf(spec.queue);
  if (stream_ == nullptr) {
    TC_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking),
                            "cudaStreamCreate");
    own_stream_ = true;
  }
  arena_.set_stream(stream_);
  int64_t max_rank = 0;
  bool any_predictor = false;
  for (size_t l = 0; l < spec.layers.size(); ++l) {
    const GpuFfnLayerSpec& s = spec.layers[l];
    DeviceLayer L;
    L.n_dev = static_cast<int64_t>(s.device_neurons.size());
    L.rank = s.rank;
    L.threshold = s.threshold;
    L.magnitude_threshold = s.magnitude_threshold;
    L.compact_of.assign(spec.n_ff, -1);
    for (int64_t k = 0; k < L.n_dev; ++k)
      L.compact_of[s.device_neurons[k]] = static_cast<int32_t>(k);
    max_dev_ = std::max(max_dev_, L.n_dev);
    if (L.n_dev > 0) {
      const std::string name = absl::StrCat("layer ", l, " ");
      absl::StatusOr<DevMatrix> gate = UploadRows(arena_, s.gate, s.device_neurons, name + "gate");
      if (!gate.ok()) return gate.status();
      absl::StatusOr<DevMatrix> up = UploadRows(arena_, s.up, s.device_neurons, name + "up");
      if (!up.ok()) return up.status();
      absl::StatusOr<DevMatrix> down =
          UploadRows(arena_, s.down_t, s.device_neurons, name + "down_t");
      if (!down.ok()) return down.status();
      L.gate = *gate;
      L.up = *up;
      L.down_t = *down;
      absl::StatusOr<void*> table =
          arena_.Upload(s.device_neurons.data(), L.n_dev * 4, name + "neuron table");
      if (!table.ok()) return table.status();
      L.table = static_cast<const int32_t*>(*table);
      absl::StatusOr<int32_t*> all = arena_.AllocateArray<int32_t>(L.n_dev + 1, name + "list");
      if (!all.ok()) return all.status();
      L.all = *all;
      cuda::Iota(L.all, L.n_dev, L.all + L.n_dev, stream_);
      need_q8_ =
          need_q8_ || cuda::UsesQ8Activations(L.gate.type) || cuda::UsesQ8Activations(L.up.type);
      if (s.rank > 0) {
        absl::StatusOr<DevMatrix> fc1 = UploadRows(arena_, s.fc1, {}, name + "fc1");
        if (!fc1.ok()) return fc1.status();
        absl::StatusOr<DevMatrix> fc2 = UploadRows(arena_, s.fc2, {}, name + "fc2");
        if (!fc2.ok()) return fc2.status();
        absl::StatusOr<void*> b1 = arena_.Upload(s.b1.data(), s.b1.size() * 4, name + "b1");
        if (!b1.ok()) return b1.status();
        absl::StatusOr<void*> b2 = arena_.Upload(s.b2.data(), s.b2.size() * 4, name + "b2");
        if (!b2.ok()) return b2.status();
        L.fc1 = *fc1;
        L.fc2 = *fc2;
        L.b1 = static_cast<const float*>(*b1);
        L.b2 = static_cast<const float*>(*b2);
        max_rank = std::max(max_rank, s.rank);
        need_q8_ = need_q8_ || cuda::UsesQ8Activations(L.fc1.type);
        any_predictor = true;
      }
      absl::StatusOr<void*> compact =
          arena_.Upload(L.compact_of.data(), spec.n_ff * 4, name + "neuron map");
      if (!compact.ok()) return compact.status();
      L.compact = static_cast<const int32_t*>(*compact);
    }
    layers_.push_back(std::move(L));
  }
  TC_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_), "the upload of the GPU FFN");

  const int64_t m = std::max<int64_t>(max_dev_, 1);
  auto alloc = [&](auto** p, int64_t n, const char* what) -> absl::Status {
    using T = std::remove_pointer_t<std::remove_reference_t<decltype(*p)>>;
    absl::StatusOr<void*> r = arena_.Allocate(static_cast<uint64_t>(n) * sizeof(T), what);
    if (!r.ok()) return r.status();
    *p = static_cast<T*>(*r);
    return absl::OkStatus();
  };
  TC_RETURN_IF_ERROR(alloc(&d_x_, n_embd_, "GPU FFN scratch (x)"));
  TC_RETURN_IF_ERROR(alloc(reinterpret_cast<uint8_t**>(&d_xq_),
                           n_embd_ / 32 * cuda::kQ8BlockBytes + 1, "GPU FFN scratch (x q8)"));
  TC_RETURN_IF_ERROR(alloc(&d_hidden_, std::max<int64_t>(max_rank, 1), "GPU FFN scratch"));
  TC_RETURN_IF_ERROR(alloc(reinterpret_cast<uint8_t**>(&d_hq_),
                           max_rank / 32 * cuda::kQ8BlockBytes + 1, "GPU FFN scratch"));
  TC_RETURN_IF_ERROR(alloc(&d_logits_, m, "GPU FFN scratch (logits)"));
  TC_RETURN_IF_ERROR(alloc(&d_idx_, m + 1, "GPU FFN scratch (active list)"));
  TC_RETURN_IF_ERROR(alloc(&d_gate_, m, "GPU FFN scratch (gate)"));
  TC_RETURN_IF_ERROR(alloc(&d_up_, m, "GPU FFN scratch (up)"));
  TC_RETURN_IF_ERROR(
      alloc(&d_partial_, cuda::AxpySplits(m) * n_embd_, "GPU FFN scratch (partial sums)"));
  TC_RETURN_IF_ERROR(alloc(&d_out_, n_embd_, "GPU FFN scratch (out)"));
  TC_RETURN_IF_ERROR(alloc(&d_fired_, 1, "GPU FFN scratch (fired)"));
  if (any_predictor || max_dev_ > 0) {
    TC_RETURN_IF_ERROR(alloc(&d_res_logits_, n_ff_, "GPU FFN scratch (resident logits)"));
    TC_RETURN_IF_ERROR(alloc(&d_res_idx_, n_ff_ + 1, "GPU FFN scratch (host's active list)"));
    TC_RETURN_IF_ERROR(alloc(&d_res_partial_, n_embd_, "GPU FFN scratch (host's partial sum)"));
    TC_CUDA_RETURN_IF_ERROR(cudaHostAlloc(&h_res_xn_, n_embd_ * 4, cudaHostAllocDefault),
                            "pinned resident xn");
    TC_CUDA_RETURN_IF_ERROR(cudaHostAlloc(&h_res_idx_, (n_ff_ + 1) * 4, cudaHostAllocDefault),
                            "pinned host's active list");
    TC_CUDA_RETURN_IF_ERROR(cudaHostAlloc(&h_res_partial_, n_embd_ * 4, cudaHostAllocDefault),
                            "pinned host's partial sum");
    TC_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&host_ready_, cudaEventDisableTiming),
                            "cudaEventCreate");
  }

  TC_CUDA_RETURN_IF_ERROR(cudaHostAlloc(&h_x_, n_embd_ * 4, cudaHostAllocDefault), "pinned xn");
  TC_CUDA_RETURN_IF_ERROR(cudaHostAlloc(&h_idx_, (m + 1) * 4, cudaHostAllocDefault),
                          "pinned active list");
  TC_CUDA_RETURN_IF_ERROR(cudaHostAlloc(&h_out_, n_embd_ * 4, cudaHostAllocDefault),
                          "pinned output");
  TC_CUDA_RETURN_IF_ERROR(cudaHostAlloc(&h_counts_, 2 * 4, cudaHostAllocDefault), "pinned counts");
  TC_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming),
                          "cudaEventCreate");
  resident_graphs_.resize(layers_.size());
  return absl::OkStatus();
}

absl::Status CudaFfnExecutor::CheckLaunches(std::string_view what) {
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) {
    cudaStreamSynchronize(stream_);  // nothing of this call left in flight
    return cuda::CudaStatus(e, what);
  }
  return absl::OkStatus();
}

void CudaFfnExecutor::DevicePart(const DeviceLayer& L, const float* x, const int32_t* list,
                                 const int32_t* count, int64_t max_n, cudaStream_t s) {
  cudaMemsetAsync(d_fired_, 0, sizeof(int32_t), s);
  cuda::MatVec(L.gate, ActivationsFor(L.gate, x), list, count, max_n, d_gate_, s);
  cuda::MatVec(L.up, ActivationsFor(L.up, x), list, count, max_n, d_up_, s);
  cuda::GatedActivation(static_cast<int>(activation_), d_gate_, d_up_, count, max_n,
                        L.magnitude_threshold, d_fired_, s);
  cuda::SparseAxpy(L.down_t, list, d_gate_, count, max_n, d_partial_, d_out_, s);
}

absl::Status CudaFfnExecutor::Launch(int layer, const float* xn, const int32_t* active,
                                     int64_t n_active) {
  if (launched_ >= 0) {
    return absl::FailedPreconditionError("GPU FFN: Launch called twice without Wait");
  }
  if (layer < 0 || layer >= static_cast<int>(layers_.size())) {
    return absl::InvalidArgumentError(absl::StrCat("GPU FFN: no layer ", layer));
  }
  const DeviceLayer& L = layers_[layer];
  if (active != nullptr && (n_active < 0 || n_active > L.n_dev)) {
    return absl::InvalidArgumentError(absl::StrCat("GPU FFN layer ", layer, ": ", n_active,
                                                   " active neurons, ", L.n_dev, " on the GPU"));
  }
  if (L.n_dev == 0 || (active != nullptr && n_active == 0)) {
    launched_ = layer;
    launched_empty_ = true;
    return absl::OkStatus();
  }
  TC_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_), "cudaSetDevice");
  // The previous Wait has drained the stream's use of the pinned buffers written below.
  const cudaStream_t s = stream_;
  const int32_t* list = nullptr;  // set by one of the three cases below
  const int32_t* count = nullptr;
  int64_t max_n = 0;
  if (active != nullptr) {
    for (int64_t j = 0; j < n_active; ++j) {
      const int32_t n = active[j];
      const int32_t c =
          (n >= 0 && n < static_cast<int32_t>(L.compact_of.size())) ? L.compact_of[n] : -1;
      if (c < 0) {
        return absl::InvalidArgumentError(absl::StrCat("GPU FFN layer ", layer, ": neuron ", n,
                                                       " is not one of its device neurons"));
      }
      h_idx_[j] = c;
    }
    h_idx_[n_active] = static_cast<int32_t>(n_active);
    cudaMemcpyAsync(d_idx_, h_idx_, (n_active + 1) * 4, cudaMemcpyHostToDevice, s);
    list = d_idx_;
    count = d_idx_ + n_active;
    max_n = n_active;
  }
  std::memcpy(h_x_, xn, n_embd_ * sizeof(float));
  cudaMemcpyAsync(d_x_, h_x_, n_embd_ * sizeof(float), cudaMemcpyHostToDevice, s);
  if (need_q8_) cuda::QuantizeQ8_0(d_x_, n_embd_, d_xq_, s);
  if (active == nullptr && L.rank > 0) {
    // Predictor: logits of the device neurons only (fc2 rows through the table).
    cuda::MatVec(L.fc1, ActivationsFor(L.fc1, d_x_), nullptr, nullptr, L.rank, d_hidden_, s);
    cuda::BiasRelu(d_hidden_, L.b1, L.rank, s);
    const void* h = d_hidden_;
    if (cuda::UsesQ8Activations(L.fc2.type)) {
      cuda::QuantizeQ8_0(d_hidden_, L.rank, d_hq_, s);
      h = d_hq_;
    }
    cuda::MatVec(L.fc2, h, L.table, nullptr, L.n_dev, d_logits_, s);
    cuda::ThresholdCompact(d_logits_, L.b2, L.table, L.n_dev, L.threshold, d_idx_,
                           d_idx_ + max_dev_, s);
    list = d_idx_;
    count = d_idx_ + max_dev_;
    max_n = L.n_dev;
  } else if (active == nullptr) {
    list = L.all;
    count = L.all + L.n_dev;
    max_n = L.n_dev;
  }
  DevicePart(L, d_x_, list, count, max_n, s);
  cudaMemcpyAsync(h_out_, d_out_, n_embd_ * sizeof(float), cudaMemcpyDeviceToHost, s);
  cudaMemcpyAsync(h_counts_, count, sizeof(int32_t), cudaMemcpyDeviceToHost, s);
  cudaMemcpyAsync(h_counts_ + 1, d_fired_, sizeof(int32_t), cudaMemcpyDeviceToHost, s);
  cudaEventRecord(done_, s);
  TC_RETURN_IF_ERROR(CheckLaunches("the GPU FFN's launches"));
  launched_ = layer;
  launched_empty_ = false;
  return absl::OkStatus();
}

absl::Status CudaFfnExecutor::Wait(float* out, int64_t* n_predicted, int64_t* n_fired) {
  if (launched_ < 0) return absl::FailedPreconditionError("GPU FFN: Wait without Launch");
  launched_ = -1;
  if (launched_empty_) {
    std::fill_n(out, n_embd_, 0.0f);
    if (n_predicted != nullptr) *n_predicted = 0;
    if (n_fired != nullptr) *n_fired = 0;
    return absl::OkStatus();
  }
  TC_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(done_), "the GPU FFN");
  std::memcpy(out, h_out_, n_embd_ * sizeof(float));
  if (n_predicted != nullptr) *n_predicted = h_counts_[0];
  if (n_fired != nullptr) *n_fired = h_counts_[1];
  return absl::OkStatus();
}

absl::Status CudaFfnExecutor::EnqueueResident(int layer, const float* xn, float* x) {
  if (layer < 0 || layer >= static_cast<int>(layers_.size()) || d_res_idx_ == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("GPU FFN: no resident layer ", layer, " (a layer with device neurons)"));
  }
  if (resident_pending_) {
    return absl::FailedPreconditionError("GPU FFN: EnqueueResident twice without WaitHostPart");
  }
  const DeviceLayer& L = layers_[layer];
  if (L.compact == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("GPU FFN layer ", layer, " has no device neurons to run resident"));
  }
  TC_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_), "cudaSetDevice");
  ResidentGraph& g = resident_graphs_[layer];
  if (g.xn != xn || g.x != x) g = ResidentGraph{xn, x, cuda::StreamGraph()};
  const absl::Status queued = g.graph.Run(stream_, [&] { return QueueResident(L, xn, x); });
  if (!queued.ok()) {
    cudaStreamSynchronize(stream_);  // nothing of this call left in flight
    return queued;
  }
  resident_pending_ = true;
  return absl::OkStatus();
}

absl::Status CudaFfnExecutor::QueueResident(const DeviceLayer& L, const float* xn, float* x) {
  const cudaStream_t s = stream_;
  if (need_q8_) cuda::QuantizeQ8_0(xn, n_embd_, d_xq_, s);
  int32_t* dev_count = d_idx_ + max_dev_;
  int32_t* host_count = d_res_idx_ + n_ff_;
  if (L.rank > 0) {
    // The predictor over every neuron, split into the device's list and the host's.
    cuda::MatVec(L.fc1, ActivationsFor(L.fc1, xn), nullptr, nullptr, L.rank, d_hidden_, s);
    cuda::BiasRelu(d_hidden_, L.b1, L.rank, s);
    const void* h = d_hidden_;
    if (cuda::UsesQ8Activations(L.fc2.type)) {
      cuda::QuantizeQ8_0(d_hidden_, L.rank, d_hq_, s);
      h = d_hq_;
    }
    cuda::MatVec(L.fc2, h, nullptr, nullptr, n_ff_, d_res_logits_, s);
    cuda::SplitCompact(d_res_logits_, L.b2, L.compact, n_ff_, L.threshold, d_idx_, dev_count,
                       d_res_idx_, host_count, s);
  } else {
    cuda::SplitCompact(nullptr, nullptr, L.compact, n_ff_, 0.0f, d_idx_, dev_count, d_res_idx_,
                       host_count, s);
  }
  // One copy down: xn and the host's active list (its count last); then the event the host
  // waits on, while the device computes its part into the residual.
  cudaMemcpyAsync(h_res_xn_, xn, n_embd_ * 4, cudaMemcpyDeviceToHost, s);
  cudaMemcpyAsync(h_res_idx_, d_res_idx_, (n_ff_ + 1) * 4, cudaMemcpyDeviceToHost, s);
  // While capturing, an external record: a node that every replay records, so that the host's
  // wait in WaitHostPart waits for that replay's copies (the flag is refused outside capture).
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  cudaStreamIsCapturing(s, &capture);
  cudaEventRecordWithFlags(
      host_ready_, s,
      capture == cudaStreamCaptureStatusActive ? cudaEventRecordExternal : cudaEventRecordDefault);
  if (L.n_dev > 0) {
    DevicePart(L, xn, d_idx_, dev_count, L.n_dev, s);
    cuda::Add(x, d_out_, n_embd_, s);
  }
  return cuda::CudaStatus(cudaGetLastError(), "the GPU FFN's resident launches");
}

absl::StatusOr<HostPart> CudaFfnExecutor::WaitHostPart() {
  if (!resident_pending_) {
    return absl::FailedPreconditionError("GPU FFN: WaitHostPart without EnqueueResident");
  }
  resident_pending_ = false;
  TC_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(host_ready_), "the GPU FFN's host half");
  HostPart h;
  h.xn = h_res_xn_;
  h.active = h_res_idx_;
  h.n_active = h_res_idx_[n_ff_];
  h.partial = h_res_partial_;
  return h;
}

absl::Status CudaFfnExecutor::EnqueueAddHostPart(float* x) {
  TC_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_), "cudaSetDevice");
  // Up and into the residual, on the stream. The host writes h_res_partial_ again only after
  // its next WaitHostPart, whose event this copy precedes.
  cudaMemcpyAsync(d_res_partial_, h_res_partial_, n_embd_ * 4, cudaMemcpyHostToDevice, stream_);
  cuda::Add(x, d_res_partial_, n_embd_, stream_);
  return CheckLaunches("adding the host's partial sum");
}

}  // namespace

absl::StatusOr<std::unique_ptr<GpuFfnExecutor>> CreateGpuFfnExecutor(const GpuFfnSpec& spec) {
  absl::StatusOr<DeviceInfo> info = Probe(spec.device);
  if (!info.ok()) return info.status();
  if (spec.n_embd <= 0 || spec.n_ff <= 0 || spec.n_embd % 32 != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "GPU FFN: n_embd (", spec.n_embd, ") must be a positive multiple of 32, n_ff positive"));
  }
  for (size_t l = 0; l < spec.layers.size(); ++l) TC_RETURN_IF_ERROR(CheckLayer(spec, l));
  auto executor = std::make_unique<CudaFfnExecutor>(spec);
  TC_RETURN_IF_ERROR(executor->Init(spec));
  return executor;
}

}  // namespace thermocline::gpu
