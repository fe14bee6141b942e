// GpuOps on CUDA: each call uploads its inputs into a call-scoped DeviceArena (accounted against
// the ops' budget), runs the kernels of cuda_kernels.h on the ops' stream and copies back.
#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bench/gpu_ops.h"
#include "engine/cuda/cublas_loader.h"
#include "engine/cuda/cuda_common.h"
#include "engine/cuda/device_arena.h"
#include "engine/gpu/gpu_backend.h"

namespace thermocline::gpu {
namespace {

using cuda::DeviceArena;
using cuda::DevMatrix;
using cuda::KType;
using cuda::UploadRows;

absl::Status CublasStatus(const cuda::CublasApi& api, cublasStatus_t s, std::string_view what) {
  if (s == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  return absl::InternalError(
      absl::StrCat("cuBLAS error in ", std::string(what), ": ", api.status_string(s)));
}

class CudaOps : public GpuOps {
 public:
  explicit CudaOps(uint64_t cap) : budget_(cap), persistent_(&budget_) {}
  ~CudaOps() override {
    if (cublas_ != nullptr) api_->destroy(cublas_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  absl::Status Init() {
    TC_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking),
                            "cudaStreamCreate");
    persistent_.set_stream(stream_);
    absl::StatusOr<const cuda::CublasApi*> api = cuda::Cublas();
    if (!api.ok()) return api.status();
    api_ = *api;
    TC_RETURN_IF_ERROR(CublasStatus(*api_, api_->create(&cublas_), "cublasCreate"));
    TC_RETURN_IF_ERROR(CublasStatus(*api_, api_->set_stream(cublas_, stream_), "cublasSetStream"));
    // cuBLAS's workspace comes from the arena, so it counts against the cap.
    const uint64_t ws_bytes = budget_.cap() >= (uint64_t{1} << 30) ? (32u << 20) : (4u << 20);
    absl::StatusOr<void*> ws = persistent_.Allocate(ws_bytes, "the cuBLAS workspace");
    if (!ws.ok()) return ws.status();
    TC_RETURN_IF_ERROR(
        CublasStatus(*api_, api_->set_workspace(cublas_, *ws, ws_bytes), "cublasSetWorkspace"));
    // A first launch proves the kernels have an image for this device.
    absl::StatusOr<int32_t*> probe = persistent_.AllocateArray<int32_t>(2, "a probe");
    if (!probe.ok()) return probe.status();
    cuda::Iota(*probe, 1, *probe + 1, stream_);
    return Sync(
        "the first kernel launch (no kernel image for this GPU? rebuild with "
        "-DCMAKE_CUDA_ARCHITECTURES=native)");
  }

  const MemoryBudget& budget() const override { return budget_; }

  absl::Status MatVec(const WeightView& w, const float* x, float* y) override {
    DeviceArena arena(&budget_);
    arena.set_stream(stream_);  // uploads ordered before the kernels that read them
    absl::StatusOr<DevMatrix> m = UploadRows(arena, w, {}, "weights");
    if (!m.ok()) return m.status();
    absl::StatusOr<const void*> dx = Activations(arena, *m, x);
    if (!dx.ok()) return dx.status();
    absl::StatusOr<float*> dy = arena.AllocateArray<float>(w.rows, "y");
    if (!dy.ok()) return dy.status();
    cuda::MatVec(*m, *dx, nullptr, nullptr, w.rows, *dy, stream_);
    return Download(*dy, y, w.rows);
  }

  absl::Status Gemm(const WeightView& w, const float* x, int64_t n_tokens, float* y) override {
    if (n_tokens <= 0) return absl::OkStatus();
    DeviceArena arena(&budget_);
    arena.set_stream(stream_);  // uploads ordered before the kernels that read them
    absl::StatusOr<DevMatrix> m = UploadRows(arena, w, {}, "weights");
    if (!m.ok()) return m.status();
    absl::StatusOr<void*> dx = arena.Upload(x, n_tokens * w.cols * sizeof(float), "x");
    absl::StatusOr<float*> dy = arena.AllocateArray<float>(n_tokens * w.rows, "y");
    if (!dx.ok() || !dy.ok()) return !dx.ok() ? dx.status() : dy.status();
    const float alpha = 1.0f, beta = 0.0f;
    const void* a = m->data;
    const void* b = *dx;
    cudaDataType_t ab_type = CUDA_R_32F;
    if (m->type != KType::kF32) {
      // cuBLAS has no quantized types: w dequantized to F16, x rounded to F16.
      absl::StatusOr<void*> wh = arena.Allocate(w.rows * w.cols * 2, "F16 weights");
      absl::StatusOr<void*> xh = arena.Allocate(n_tokens * w.cols * 2, "F16 x");
      if (!wh.ok() || !xh.ok()) return !wh.ok() ? wh.status() : xh.status();
      cuda::DequantizeToF16(*m, *wh, stream_);
      cuda::F32ToF16(static_cast<const float*>(*dx), n_tokens * w.cols, *xh, stream_);
      a = *wh;
      b = *xh;
      ab_type = CUDA_R_16F;
    }
    // Column-major view: y (rows × n) = wᵀ-as-stored (cols × rows)ᵀ · x (cols × n).
    TC_RETURN_IF_ERROR(CublasStatus(
        *api_,
        api_->gemm_ex(cublas_, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(w.rows),
                      static_cast<int>(n_tokens), static_cast<int>(w.cols), &alpha, a, ab_type,
                      static_cast<int>(w.cols), b, ab_type, static_cast<int>(w.cols), &beta, *dy,
                      CUDA_R_32F, static_cast<int>(w.rows), CUBLAS_COMPUTE_32F,
                      CUBLAS_GEMM_DEFAULT),
        "cublasGemmEx"));
    return Download(*dy, y, n_tokens * w.rows);
  }

  absl::Status SparseMatVec(const WeightView& w, absl::Span<const int32_t> table,
                            absl::Span<const int32_t> active, const float* x, float* y) override {
    if (active.empty()) return absl::OkStatus();
    DeviceArena arena(&budget_);
    arena.set_stream(stream_);  // uploads ordered before the kernels that read them
    absl::StatusOr<DevMatrix> m = UploadRows(arena, w, table, "compact rows");
    if (!m.ok()) return m.status();
    absl::StatusOr<const int32_t*> list = ActiveList(arena, active, m->rows);
    if (!list.ok()) return list.status();
    absl::StatusOr<const void*> dx = Activations(arena, *m, x);
    if (!dx.ok()) return dx.status();
    const int64_t n = static_cast<int64_t>(active.size());
    absl::StatusOr<float*> dy = arena.AllocateArray<float>(n, "y");
    if (!dy.ok()) return dy.status();
    cuda::MatVec(*m, *dx, *list, *list + n, n, *dy, stream_);
    return Download(*dy, y, n);
  }

  absl::Status SparseAxpy(const WeightView& w_t, absl::Span<const int32_t> table,
                          absl::Span<const int32_t> active, const float* act, float* out) override {
    DeviceArena arena(&budget_);
    arena.set_stream(stream_);  // uploads ordered before the kernels that read them
    absl::StatusOr<DevMatrix> m = UploadRows(arena, w_t, table, "compact down_t rows");
    if (!m.ok()) return m.status();
    absl::StatusOr<const int32_t*> list = ActiveList(arena, active, m->rows);
    if (!list.ok()) return list.status();
    const int64_t n = static_cast<int64_t>(active.size());
    absl::StatusOr<void*> da = arena.Upload(act, n * sizeof(float), "activations");
    absl::StatusOr<float*> partial =
        arena.AllocateArray<float>(cuda::AxpySplits(n) * w_t.cols, "axpy partial sums");
    absl::StatusOr<float*> dout = arena.AllocateArray<float>(w_t.cols, "out");
    if (!da.ok() || !partial.ok() || !dout.ok()) {
      return !da.ok() ? da.status() : (!partial.ok() ? partial.status() : dout.status());
    }
    cuda::SparseAxpy(*m, *list, static_cast<const float*>(*da), *list + n, n, *partial, *dout,
                     stream_);
    return Download(*dout, out, w_t.cols);
  }

  absl::Status ColumnMatVec(const ColumnLayout& c, const float* x, float threshold,
                            float* y) override {
    DeviceArena arena(&budget_);
    absl::StatusOr<ColumnCall> call = UploadColumnCall(arena, c, x);
    if (!call.ok()) return call.status();
    Launch(*call, threshold);
    return Download(call->y, y, c.out);
  }

  absl::StatusOr<GateFirstList> GateFirstCompact(absl::Span<const float> gate,
                                                 absl::Span<const float> scale,
                                                 float threshold) override {
    const int64_t n = static_cast<int64_t>(gate.size());
    if (!scale.empty() && scale.size() != gate.size()) {
      return absl::InvalidArgumentError("gate-first: a scale per gate value, or none");
    }
    GateFirstList out;
    if (n == 0) return out;
    DeviceArena arena(&budget_);
    arena.set_stream(stream_);  // uploads ordered before the kernel that reads them
    absl::StatusOr<void*> dgate = arena.Upload(gate.data(), n * 4, "gate");
    absl::StatusOr<void*> dscale =
        scale.empty() ? absl::StatusOr<void*>(nullptr) : arena.Upload(scale.data(), n * 4, "scale");
    absl::StatusOr<int32_t*> idx = arena.AllocateArray<int32_t>(n + 1, "kept slots");
    absl::StatusOr<float*> kept = arena.AllocateArray<float>(n, "kept gate values");
    for (const absl::Status& s : {dgate.status(), dscale.status(), idx.status(), kept.status()}) {
      if (!s.ok()) return s;
    }
    cuda::GateFirstCompact(static_cast<const float*>(*dgate), static_cast<const float*>(*dscale), n,
                           threshold, *idx, *kept, *idx + n, stream_);
    std::vector<int32_t> all(n + 1);
    TC_RETURN_IF_ERROR(Download(*idx, all.data(), n + 1));
    const int32_t count = all[n];
    if (count < 0 || count > n) return absl::InternalError("gate-first: a count out of range");
    out.idx.assign(all.begin(), all.begin() + count);
    out.gate.resize(count);
    if (count > 0) TC_RETURN_IF_ERROR(Download(*kept, out.gate.data(), count));
    return out;
  }

  absl::StatusOr<std::vector<int32_t>> Predict(const WeightView& fc1, absl::Span<const float> b1,
                                               const WeightView& fc2, absl::Span<const float> b2,
                                               absl::Span<const int32_t> table, float threshold,
                                               const float* x) override {
    if (fc2.cols != fc1.rows || static_cast<int64_t>(b1.size()) != fc1.rows ||
        static_cast<int64_t>(b2.size()) != fc2.rows) {
      return absl::InvalidArgumentError("predictor shapes do not chain (fc1, b1, fc2, b2)");
    }
    for (int32_t n : table) {
      if (n < 0 || n >= fc2.rows) return absl::InvalidArgumentError("table entry out of range");
    }
    const int64_t n_dev = static_cast<int64_t>(table.size());
    if (n_dev == 0) return std::vector<int32_t>();
    DeviceArena arena(&budget_);
    arena.set_stream(stream_);  // uploads ordered before the kernels that read them
    absl::StatusOr<DevMatrix> m1 = UploadRows(arena, fc1, {}, "fc1");
    absl::StatusOr<DevMatrix> m2 = UploadRows(arena, fc2, {}, "fc2");
    if (!m1.ok() || !m2.ok()) return !m1.ok() ? m1.status() : m2.status();
    absl::StatusOr<void*> db1 = arena.Upload(b1.data(), b1.size() * 4, "b1");
    absl::StatusOr<void*> db2 = arena.Upload(b2.data(), b2.size() * 4, "b2");
    absl::StatusOr<void*> dtable = arena.Upload(table.data(), n_dev * 4, "table");
    absl::StatusOr<float*> hidden = arena.AllocateArray<float>(fc1.rows, "hidden");
    absl::StatusOr<float*> logits = arena.AllocateArray<float>(n_dev, "logits");
    absl::StatusOr<int32_t*> idx = arena.AllocateArray<int32_t>(n_dev + 1, "active list");
    for (const absl::Status& s : {db1.status(), db2.status(), dtable.status(), hidden.status(),
                                  logits.status(), idx.status()}) {
      if (!s.ok()) return s;
    }
    absl::StatusOr<const void*> dx = Activations(arena, *m1, x);
    if (!dx.ok()) return dx.status();
    cuda::MatVec(*m1, *dx, nullptr, nullptr, fc1.rows, *hidden, stream_);
    cuda::BiasRelu(*hidden, static_cast<const float*>(*db1), fc1.rows, stream_);
    const void* h = *hidden;
    if (cuda::UsesQ8Activations(m2->type)) {
      absl::StatusOr<void*> hq = arena.Allocate(fc1.rows / 32 * cuda::kQ8BlockBytes, "hidden q8");
      if (!hq.ok()) return hq.status();
      cuda::QuantizeQ8_0(*hidden, fc1.rows, *hq, stream_);
      h = *hq;
    }
    const int32_t* dt = static_cast<const int32_t*>(*dtable);
    cuda::MatVec(*m2, h, dt, nullptr, n_dev, *logits, stream_);
    cuda::ThresholdCompact(*logits, static_cast<const float*>(*db2), dt, n_dev, threshold, *idx,
                           *idx + n_dev, stream_);
    std::vector<int32_t> all(n_dev + 1);
    TC_RETURN_IF_ERROR(Download(*idx, all.data(), n_dev + 1));
    const int32_t count = all[n_dev];
    all.resize(std::clamp<int64_t>(count, 0, n_dev));
    return all;
  }

  absl::Status RmsNorm(const float* x, const float* weight, int64_t n, float eps,
                       float* out) override {
    DeviceArena arena(&budget_);
    arena.set_stream(stream_);  // uploads ordered before the kernels that read them
    absl::StatusOr<void*> dx = arena.Upload(x, n * 4, "x");
    absl::StatusOr<void*> dw = arena.Upload(weight, n * 4, "weight");
    absl::StatusOr<float*> dout = arena.AllocateArray<float>(n, "out");
    if (!dx.ok() || !dw.ok() || !dout.ok()) return absl::ResourceExhaustedError("RmsNorm buffers");
    cuda::RmsNorm(static_cast<const float*>(*dx), static_cast<const float*>(*dw), n, eps, *dout,
                  stream_);
    return Download(*dout, out, n);
  }

  absl::Status Rope(float* x, int64_t n_heads, int64_t head_dim, int64_t rope_dim,
                    const float* cos_sin) override {
    DeviceArena arena(&budget_);
    arena.set_stream(stream_);  // uploads ordered before the kernels that read them
    absl::StatusOr<void*> dx = arena.Upload(x, n_heads * head_dim * 4, "x");
    absl::StatusOr<void*> dcs = arena.Upload(cos_sin, rope_dim * 4, "cos_sin");
    if (!dx.ok() || !dcs.ok()) return !dx.ok() ? dx.status() : dcs.status();
    cuda::Rope(static_cast<float*>(*dx), n_heads, head_dim, rope_dim,
               static_cast<const float*>(*dcs), stream_);
    return Download(static_cast<float*>(*dx), x, n_heads * head_dim);
  }

  absl::Status GatedActivation(FfnActivation act, float* gate, const float* up,
                               int64_t n) override {
    DeviceArena arena(&budget_);
    arena.set_stream(stream_);  // uploads ordered before the kernels that read them
    absl::StatusOr<void*> dg = arena.Upload(gate, n * 4, "gate");
    absl::StatusOr<void*> du = arena.Upload(up, n * 4, "up");
    if (!dg.ok() || !du.ok()) return !dg.ok() ? dg.status() : du.status();
    cuda::GatedActivation(static_cast<int>(act), static_cast<float*>(*dg),
                          static_cast<const float*>(*du), nullptr, n, 0.0f, nullptr, stream_);
    return Download(static_cast<float*>(*dg), gate, n);
  }

  absl::Status Attention(const float* q, const float* k_cache, const float* v_cache, int64_t n_kv,
                         int64_t n_head, int64_t n_head_kv, int64_t head_dim, float* out) override {
    if (n_head_kv <= 0 || n_head % n_head_kv != 0 || n_kv <= 0) {
      return absl::InvalidArgumentError("attention: n_head must be a multiple of n_head_kv > 0");
    }
    DeviceArena arena(&budget_);
    arena.set_stream(stream_);  // uploads ordered before the kernels that read them
    const int64_t kv = n_kv * n_head_kv * head_dim;
    absl::StatusOr<void*> dq = arena.Upload(q, n_head * head_dim * 4, "q");
    absl::StatusOr<void*> dk = arena.Upload(k_cache, kv * 4, "k cache");
    absl::StatusOr<void*> dv = arena.Upload(v_cache, kv * 4, "v cache");
    absl::StatusOr<float*> scores = arena.AllocateArray<float>(n_head * n_kv, "scores");
    absl::StatusOr<float*> dout = arena.AllocateArray<float>(n_head * head_dim, "out");
    for (const absl::Status& s :
         {dq.status(), dk.status(), dv.status(), scores.status(), dout.status()}) {
      if (!s.ok()) return s;
    }
    cuda::Attention(static_cast<const float*>(*dq), static_cast<const float*>(*dk),
                    static_cast<const float*>(*dv), n_kv, n_head, n_head_kv, head_dim, *scores,
                    *dout, stream_);
    return Download(*dout, out, n_head * head_dim);
  }

  absl::StatusOr<double> TimeMatVec(const WeightView& w, int iters) override {
    return TimeRows(w, 1, iters, false);
  }
  absl::StatusOr<double> TimeSparseMatVec(const WeightView& w, int stride, int iters) override {
    return TimeRows(w, stride, iters, false);
  }
  absl::StatusOr<double> TimeSparseAxpy(const WeightView& w_t, int stride, int iters) override {
    return TimeRows(w_t, stride, iters, true);
  }
  absl::StatusOr<double> TimeColumnMatVec(const ColumnLayout& c, const float* x, float threshold,
                                          int iters) override {
    DeviceArena arena(&budget_);
    absl::StatusOr<ColumnCall> call = UploadColumnCall(arena, c, x);
    if (!call.ok()) return call.status();
    return TimeLaunches(iters, [&] { Launch(*call, threshold); });
  }

 private:
  // A column mat-vec's operands on the device: the layout, x, the partial sums and y.
  struct ColumnCall {
    cuda::DevColumn c;
    const float* x;
    float* partial;
    float* y;
  };
  absl::StatusOr<ColumnCall> UploadColumnCall(DeviceArena& arena, const ColumnLayout& c,
                                              const float* x) {
    arena.set_stream(stream_);  // uploads ordered before the kernels that read them
    absl::StatusOr<cuda::DevColumn> d = cuda::UploadColumn(arena, c, "column layout");
    if (!d.ok()) return d.status();
    absl::StatusOr<void*> dx = arena.Upload(x, c.in * sizeof(float), "x");
    absl::StatusOr<float*> partial =
        arena.AllocateArray<float>(d->grid.splits * c.out, "column partial sums");
    absl::StatusOr<float*> y = arena.AllocateArray<float>(c.out, "y");
    if (!dx.ok() || !partial.ok() || !y.ok()) {
      return !dx.ok() ? dx.status() : (!partial.ok() ? partial.status() : y.status());
    }
    return ColumnCall{*d, static_cast<const float*>(*dx), *partial, *y};
  }
  void Launch(const ColumnCall& call, float threshold) {
    cuda::ColumnMatVec(call.c, call.x, threshold, call.partial, call.y, stream_);
  }

  // The launches' own errors (a bad launch configuration is not reported by the sync), then the
  // stream's.
  absl::Status Sync(std::string_view what) {
    if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) {
      cudaStreamSynchronize(stream_);
      return cuda::CudaStatus(e, what);
    }
    return cuda::CudaStatus(cudaStreamSynchronize(stream_), what);
  }

  template <class T>
  absl::Status Download(const T* device, T* host, int64_t n) {
    TC_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(host, device, n * sizeof(T), cudaMemcpyDeviceToHost, stream_), "download");
    return Sync("a kernel or the download");
  }

  // x uploaded, and quantized to Q8_0 on the device when m's dots need it.
  absl::StatusOr<const void*> Activations(DeviceArena& arena, const DevMatrix& m, const float* x) {
    absl::StatusOr<void*> dx = arena.Upload(x, m.cols * 4, "x");
    if (!dx.ok() || !cuda::UsesQ8Activations(m.type)) return dx;
    absl::StatusOr<void*> q = arena.Allocate(m.cols / 32 * cuda::kQ8BlockBytes, "x as q8_0");
    if (!q.ok()) return q.status();
    cuda::QuantizeQ8_0(static_cast<const float*>(*dx), m.cols, *q, stream_);
    return const_cast<const void*>(*q);
  }

  // The active list followed by its length (one upload).
  absl::StatusOr<const int32_t*> ActiveList(DeviceArena& arena, absl::Span<const int32_t> active,
                                            int64_t rows) {
    std::vector<int32_t> list(active.begin(), active.end());
    for (int32_t k : list) {
      if (k < 0 || k >= rows) {
        return absl::InvalidArgumentError(
            absl::StrCat("active row ", k, " is not in [0, ", rows, ")"));
      }
    }
    list.push_back(static_cast<int32_t>(active.size()));
    absl::StatusOr<void*> d = arena.Upload(list.data(), list.size() * 4, "active list");
    if (!d.ok()) return d.status();
    return static_cast<const int32_t*>(*d);
  }

  // Median seconds of a (sparse) mat-vec or axpy over every stride-th row of w.
  absl::StatusOr<double> TimeRows(const WeightView& w, int stride, int iters, bool axpy) {
    DeviceArena arena(&budget_);
    arena.set_stream(stream_);  // uploads ordered before the kernels that read them
    absl::StatusOr<DevMatrix> m = UploadRows(arena, w, {}, "weights");
    if (!m.ok()) return m.status();
    std::vector<int32_t> active;
    for (int64_t r = 0; r < w.rows; r += std::max(1, stride)) active.push_back(r);
    const int64_t n = static_cast<int64_t>(active.size());
    absl::StatusOr<const int32_t*> list = ActiveList(arena, active, w.rows);
    if (!list.ok()) return list.status();
    std::vector<float> ones(std::max(w.cols, n), 1.0f);
    absl::StatusOr<void*> dx = arena.Upload(ones.data(), ones.size() * 4, "x");
    if (!dx.ok()) return dx.status();
    const void* x = *dx;
    if (!axpy && cuda::UsesQ8Activations(m->type)) {
      absl::StatusOr<void*> q = arena.Allocate(w.cols / 32 * cuda::kQ8BlockBytes, "x q8");
      if (!q.ok()) return q.status();
      cuda::QuantizeQ8_0(static_cast<const float*>(*dx), w.cols, *q, stream_);
      x = *q;
    }
    absl::StatusOr<float*> y = arena.AllocateArray<float>(std::max(w.rows, w.cols), "y");
    absl::StatusOr<float*> partial =
        arena.AllocateArray<float>(cuda::AxpySplits(n) * w.cols, "partial");
    if (!y.ok() || !partial.ok()) return !y.ok() ? y.status() : partial.status();
    return TimeLaunches(iters, [&] {
      if (axpy) {
        cuda::SparseAxpy(*m, *list, static_cast<const float*>(*dx), *list + n, n, *partial, *y,
                         stream_);
      } else if (stride == 1) {
        cuda::MatVec(*m, x, nullptr, nullptr, w.rows, *y, stream_);
      } else {
        cuda::MatVec(*m, x, *list, *list + n, n, *y, stream_);
      }
    });
  }

  // Median seconds of `launch` (its kernels on stream_) over iters calls, after 3 warm-up calls.
  template <class Launch>
  absl::StatusOr<double> TimeLaunches(int iters, Launch&& launch) {
    cudaEvent_t start, stop;
    TC_CUDA_RETURN_IF_ERROR(cudaEventCreate(&start), "cudaEventCreate");
    TC_CUDA_RETURN_IF_ERROR(cudaEventCreate(&stop), "cudaEventCreate");
    std::vector<float> ms;
    absl::Status status;
    for (int i = 0; i < iters + 3 && status.ok(); ++i) {
      cudaEventRecord(start, stream_);
      launch();
      cudaEventRecord(stop, stream_);
      status = cuda::CudaStatus(cudaEventSynchronize(stop), "a timed kernel");
      float t = 0;
      cudaEventElapsedTime(&t, start, stop);
      if (i >= 3) ms.push_back(t);
    }
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
    if (!status.ok()) return status;
    if (ms.empty()) return absl::InvalidArgumentError("iters must be positive");
    std::nth_element(ms.begin(), ms.begin() + ms.size() / 2, ms.end());
    return ms[ms.size() / 2] * 1e-3;
  }

  MemoryBudget budget_;
  DeviceArena persistent_;
  cudaStream_t stream_ = nullptr;
  const cuda::CublasApi* api_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
};

}  // namespace

absl::StatusOr<std::unique_ptr<GpuOps>> GpuOps::Create(uint64_t memory_cap, int device) {
  absl::StatusOr<DeviceInfo> info = Probe(device);
  if (!info.ok()) return info.status();
  auto ops = std::make_unique<CudaOps>(memory_cap);
  TC_RETURN_IF_ERROR(ops->Init());
  return ops;
}

}  // namespace thermocline::gpu
