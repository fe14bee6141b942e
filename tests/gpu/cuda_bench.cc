// thermocline_cuda_bench: the CUDA kernels' speed on this GPU, for tests/gpu/run.sh.
//   1. dense decode mat-vec per weight type: time and weight-read bandwidth (GB/s);
//   2. the neuron-aware kernels at 10% active vs the dense kernel on the same matrix;
//   3. the hybrid FFN executor: one layer's device part per token (Launch + Wait), 7B shape;
//   4. the column-sparse mat-vec of input-sparse layers at half the inputs kept vs dense, on
//      gate's and down's shapes.
// Shapes default to a 7B llama FFN (n_embd 4096, n_ff 11008); --small runs a quick shape.
// Exits non-zero on any error, 77 (skip) without a CUDA device.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "bench/gpu_ops.h"
#include "engine/gpu/gpu_backend.h"
#include "engine/gpu/gpu_ffn_executor.h"
#include "engine/ops/kernels.h"
#include "engine/sparse/column_sparse.h"
#include "engine/sparse/sparse_ops.h"

namespace thermocline {
namespace {

// Uniform(-1, 1) weights quantized to `type`, rows split among the machine's threads (the
// K-quant and IQ4 quantizers search scales: seconds per matrix on one thread).
OwnedWeight RandomWeight(GgmlType type, int64_t rows, int64_t cols, uint32_t seed) {
  OwnedWeight w;
  w.view = {type, rows, cols, nullptr, RowBytes(type, cols)};
  w.data.resize(w.view.row_bytes * rows);
  w.view.data = w.data.data();
  const TypeKernels& k = *KernelsFor(type);
  const int64_t n_threads = std::max<int64_t>(1, std::thread::hardware_concurrency());
  std::vector<std::thread> threads;
  for (int64_t t = 0; t < n_threads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(seed * 1000003u + static_cast<uint32_t>(t));
      std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
      std::vector<float> row(cols);
      for (int64_t r = t; r < rows; r += n_threads) {
        for (float& f : row) f = dist(rng);
        k.from_float(row.data(), w.data.data() + r * w.view.row_bytes, cols);
      }
    });
  }
  for (std::thread& th : threads) th.join();
  return w;
}

int Fail(const absl::Status& s, const char* what) {
  std::fprintf(stderr, "cuda_bench: %s failed: %s\n", what, s.ToString().c_str());
  return 1;
}

int Main(int argc, char** argv) {
  const bool small = argc > 1 && std::strcmp(argv[1], "--small") == 0;
  absl::StatusOr<gpu::DeviceInfo> info = gpu::Probe(0);
  if (!info.ok()) {
    std::printf("SKIPPED: %s\n", info.status().ToString().c_str());
    return 77;
  }
  std::printf("device: %s (compute %d.%d, %d SMs, %.1f GiB)\n", info->name.c_str(),
              info->compute_major, info->compute_minor, info->multiprocessors,
              info->total_bytes / 1073741824.0);
  absl::StatusOr<std::unique_ptr<gpu::GpuOps>> ops = gpu::GpuOps::Create();
  if (!ops.ok()) return Fail(ops.status(), "GpuOps::Create");
  const int64_t n_embd = small ? 1024 : 4096, n_ff = small ? 2816 : 11008;
  const int iters = small ? 20 : 100;
  const GgmlType types[] = {GgmlType::kF32,  GgmlType::kF16,    GgmlType::kBF16,  GgmlType::kQ8_0,
                            GgmlType::kQ4_0, GgmlType::kQ4_1,   GgmlType::kQ5_0,  GgmlType::kQ5_1,
                            GgmlType::kQ2_K, GgmlType::kQ3_K,   GgmlType::kQ4_K,  GgmlType::kQ5_K,
                            GgmlType::kQ6_K, GgmlType::kIQ4_NL, GgmlType::kIQ4_XS};

  std::printf(
      "\n1-2. (%lld x %lld) per type: dense mat-vec; row-sparse mat-vec and axpy with 10%% "
      "of the rows active (GB/s: weight bytes read per second)\n",
      static_cast<long long>(n_ff), static_cast<long long>(n_embd));
  for (GgmlType type : types) {
    const OwnedWeight w = RandomWeight(type, n_ff, n_embd, 1);
    absl::StatusOr<double> dense = (*ops)->TimeMatVec(w.view, iters);
    if (!dense.ok()) return Fail(dense.status(), "TimeMatVec");
    absl::StatusOr<double> sparse = (*ops)->TimeSparseMatVec(w.view, 10, iters);
    if (!sparse.ok()) return Fail(sparse.status(), "TimeSparseMatVec");
    absl::StatusOr<double> axpy = (*ops)->TimeSparseAxpy(w.view, 10, iters);  // w as down_t
    if (!axpy.ok()) return Fail(axpy.status(), "TimeSparseAxpy");
    const double bytes = static_cast<double>(w.view.row_bytes) * n_ff;
    std::printf(
        "%-6s dense %8.1f us %7.1f GB/s | sparse %8.1f us (%.3fx dense) | axpy %8.1f us "
        "%7.1f GB/s (%.3fx dense)\n",
        TypeName(type), *dense * 1e6, bytes / *dense / 1e9, *sparse * 1e6, *sparse / *dense,
        *axpy * 1e6, bytes / 10 / *axpy / 1e9, *axpy / *dense);
  }

  std::printf("\n3. hybrid FFN executor, one layer's device part per token (Launch + Wait)\n");
  for (GgmlType type : {GgmlType::kF16, GgmlType::kQ4_0}) {
    const OwnedWeight gate = RandomWeight(type, n_ff, n_embd, 2);
    const OwnedWeight up = RandomWeight(type, n_ff, n_embd, 3);
    const OwnedWeight down_t = RandomWeight(type, n_ff, n_embd, 4);
    std::vector<int32_t> dev;  // 40% of the neurons on the GPU
    for (int32_t i = 0; i < n_ff; ++i) {
      if (i % 5 < 2) dev.push_back(i);
    }
    std::vector<int32_t> active;  // 10% of n_ff active, all among the device neurons
    for (size_t k = 0; k < dev.size(); k += 4) active.push_back(dev[k]);
    gpu::GpuFfnSpec spec;
    spec.n_embd = n_embd;
    spec.n_ff = n_ff;
    spec.activation = FfnActivation::kRelu;
    gpu::GpuFfnLayerSpec s;
    s.gate = gate.view;
    s.up = up.view;
    s.down_t = down_t.view;
    s.device_neurons = dev;
    spec.layers = {s};
    absl::StatusOr<std::unique_ptr<gpu::GpuFfnExecutor>> ex = gpu::CreateGpuFfnExecutor(spec);
    if (!ex.ok()) return Fail(ex.status(), "CreateGpuFfnExecutor");
    std::vector<float> xn(n_embd, 0.01f), out(n_embd);
    for (bool all : {false, true}) {
      std::vector<double> us;
      for (int i = 0; i < iters + 5; ++i) {
        const auto t0 = std::chrono::steady_clock::now();
        absl::Status st = (*ex)->Launch(0, xn.data(), all ? nullptr : active.data(),
                                        all ? 0 : static_cast<int64_t>(active.size()));
        if (st.ok()) st = (*ex)->Wait(out.data(), nullptr, nullptr);
        if (!st.ok()) return Fail(st, "executor Launch/Wait");
        const auto t1 = std::chrono::steady_clock::now();
        if (i >= 5) us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
      }
      std::nth_element(us.begin(), us.begin() + us.size() / 2, us.end());
      std::printf("%-6s %s: %zu neurons, %.1f us per layer-token (median), %.1f MiB on the GPU\n",
                  TypeName(type), all ? "all device neurons" : "10% active (given)",
                  all ? dev.size() : active.size(), us[us.size() / 2],
                  (*ex)->device_bytes() / 1048576.0);
    }
  }

  std::printf(
      "\n4. input-sparse: the column-sparse mat-vec with half of the inputs kept (uniform x, "
      "threshold 0.5) vs the dense mat-vec of the same matrix\n");
  ThreadPool pool(static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
  for (GgmlType type : {GgmlType::kQ4_0, GgmlType::kQ8_0, GgmlType::kQ4_K, GgmlType::kF16}) {
    for (auto [rows, cols] : {std::pair{n_ff, n_embd}, std::pair{n_embd, n_ff}}) {
      const OwnedWeight w = RandomWeight(type, rows, cols, 5);
      absl::StatusOr<ColumnWeight> c = ColumnWeight::Build(pool, w.view, BestIsa());
      if (!c.ok()) return Fail(c.status(), "ColumnWeight::Build");
      std::mt19937 rng(7);
      std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
      std::vector<float> x(cols);
      for (float& f : x) f = dist(rng);
      absl::StatusOr<double> dense = (*ops)->TimeMatVec(w.view, iters);
      if (!dense.ok()) return Fail(dense.status(), "TimeMatVec");
      absl::StatusOr<double> all = (*ops)->TimeColumnMatVec(c->layout(), x.data(), -1.0f, iters);
      if (!all.ok()) return Fail(all.status(), "TimeColumnMatVec");
      absl::StatusOr<double> half = (*ops)->TimeColumnMatVec(c->layout(), x.data(), 0.5f, iters);
      if (!half.ok()) return Fail(half.status(), "TimeColumnMatVec");
      const double bytes = c->bytes_per_input() * cols;
      std::printf(
          "%-6s %6lld x %-6lld dense %8.1f us | columns, all kept %8.1f us %7.1f GB/s | half "
          "kept %8.1f us (%.2fx dense)\n",
          TypeName(type), static_cast<long long>(rows), static_cast<long long>(cols), *dense * 1e6,
          *all * 1e6, bytes / *all / 1e9, *half * 1e6, *dense / *half);
    }
  }
  return 0;
}

}  // namespace
}  // namespace thermocline

int main(int argc, char** argv) { return thermocline::Main(argc, argv); }
