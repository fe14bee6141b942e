// Micro-benchmarks of the CPU kernels and MatMul (Google Benchmark):
//   vec_dot/<type>/<isa>      one 4096-element row, in cache: kernel speed (bytes of weights/s).
//                             For Q8_0 / Q4_0 this public entry point re-lays the Q8_0
//                             activations on every call; MatMul does that once per call, so
//                             the matmul figures are the ones decode and prefill see.
//   vec_dot_multi8/<type>/<isa>  the same row against 8 activation rows
//   matmul/<type>/<isa>/<rows>x<cols>/tokens:<n>/threads:<t>   over the file's rows, and
//   matmul/<type>-groups/...  over the row groups that load builds for Q4_0 and the K-quants
//                             (weight_layout.h): the layout the dense CPU path reads
//   model/llama1.1b/q4_0/tokens:<n>/threads:<t>   all the products of one forward pass
// MatMul cycles through copies of the weights totalling more than the last-level cache, so
// decode (1 token) figures are memory-bound like a real forward pass: GB/s is weight bytes
// streamed per second, and "flops" counts 2 * rows * cols * tokens per call.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "engine/ops/kernels.h"
#include "engine/ops/matmul.h"
#include "engine/ops/weight_layout.h"
#include "engine/util/thread_pool.h"

namespace thermocline {
namespace {

constexpr size_t kColdBytes = size_t{640} << 20;  // more than any last-level cache we run on

std::vector<float> RandomFloats(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& f : v) f = dist(rng);
  return v;
}

std::vector<uint8_t> RandomRow(GgmlType type, int64_t n, uint32_t seed) {
  std::vector<uint8_t> row(RowBytes(type, n));
  KernelsFor(type)->from_float(RandomFloats(n, seed).data(), row.data(), n);
  return row;
}

ThreadPool& Pool(int threads) {
  static std::map<int, std::unique_ptr<ThreadPool>> pools;
  auto& pool = pools[threads];
  if (pool == nullptr) pool = std::make_unique<ThreadPool>(threads);
  return *pool;
}

void VecDot(benchmark::State& state, GgmlType type, Isa isa, int k) {
  constexpr int64_t n = 4096;
  const TypeKernels& kernels = *KernelsFor(type, isa);
  const std::vector<uint8_t> w = RandomRow(type, n, 1);
  const size_t x_bytes = RowBytes(kernels.vec_dot_type, n);
  std::vector<uint8_t> x(x_bytes * k);
  for (int j = 0; j < k; ++j) {
    const std::vector<uint8_t> row = RandomRow(kernels.vec_dot_type, n, 2 + j);
    std::copy(row.begin(), row.end(), x.begin() + j * x_bytes);
  }
  float out[8];
  for (auto _ : state) {
    if (k == 1) {
      out[0] = kernels.vec_dot(n, w.data(), x.data());
    } else {
      kernels.vec_dot_multi(n, w.data(), x.data(), static_cast<int64_t>(x_bytes), k, out);
    }
    benchmark::DoNotOptimize(out);
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * w.size()));
  state.counters["flops"] =
      benchmark::Counter(2.0 * n * k * state.iterations(), benchmark::Counter::kIsRate);
}

// Copies of a rows x cols matrix, enough of them to spill the caches; with `groups`, each copy
// re-laid in row groups as load does.
struct ColdWeights {
  std::vector<std::vector<uint8_t>> copies;
  std::vector<OwnedWeight> packed;
  std::vector<WeightView> views;
};

const ColdWeights& Weights(GgmlType type, int64_t rows, int64_t cols, bool groups = false) {
  static std::map<std::tuple<GgmlType, int64_t, int64_t, bool>, ColdWeights> cache;
  ColdWeights& cold = cache[{type, rows, cols, groups}];
  if (!cold.views.empty()) return cold;
  const size_t row_bytes = RowBytes(type, cols);
  std::vector<uint8_t> first(row_bytes * rows);
  for (int64_t r = 0; r < rows; ++r) {
    const std::vector<uint8_t> row = RandomRow(type, cols, static_cast<uint32_t>(r));
    std::copy(row.begin(), row.end(), first.begin() + r * row_bytes);
  }
  const size_t n_copies = std::max<size_t>(1, kColdBytes / first.size());
  if (groups) {
    const WeightView rows_view{type, rows, cols, first.data(), row_bytes};
    for (size_t i = 0; i < n_copies; ++i) {
      cold.packed.push_back(PackRowGroups(Pool(2), rows_view));
      cold.views.push_back(cold.packed.back().view);
    }
    return cold;
  }
  cold.copies.assign(n_copies, first);
  for (const auto& copy : cold.copies)
    cold.views.push_back({type, rows, cols, copy.data(), row_bytes});
  return cold;
}

void MatMulBench(benchmark::State& state, GgmlType type, bool groups, Isa isa, int64_t rows,
                 int64_t cols, int64_t tokens, int threads) {
  const ColdWeights& w = Weights(type, rows, cols, groups);
  const std::vector<float> x = RandomFloats(tokens * cols, 3);
  std::vector<float> y(static_cast<size_t>(tokens * rows));
  MatMulScratch scratch;
  scratch.Reserve(tokens, cols);
  ThreadPool& pool = Pool(threads);
  size_t i = 0;
  for (auto _ : state) {
    MatMul(pool, w.views[i], x.data(), tokens, y.data(), scratch, isa);
    benchmark::DoNotOptimize(y.data());
    i = (i + 1) % w.views.size();
  }
  // The file's bytes of the matrix: the groups' few bytes of padding and unpacked scales are
  // not counted as work.
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * RowBytes(type, cols) * rows));
  state.counters["flops"] = benchmark::Counter(2.0 * rows * cols * tokens * state.iterations(),
                                               benchmark::Counter::kIsRate);
  state.counters["tokens/s"] = benchmark::Counter(static_cast<double>(tokens * state.iterations()),
                                                  benchmark::Counter::kIsRate);
}

// The matrix products of one forward pass of a 1.1B llama (TinyLlama shapes: embd 2048, ff
// 5632, kv 256, 22 layers, vocab 32000) in Q4_0, every matrix its own memory (580 MB), so that
// tokens/s is what MatMul allows a real model: decode streams all weights once per token.
// The weights are random bytes with a sane scale, not a quantized model: speed is all we want.
void ModelBench(benchmark::State& state, int64_t tokens, int threads) {
  struct Shape {
    int64_t rows, cols;
  };
  const Shape layer[] = {{2048, 2048}, {256, 2048},  {256, 2048}, {2048, 2048},
                         {5632, 2048}, {5632, 2048}, {2048, 5632}};
  constexpr int kLayers = 22;
  static std::vector<std::vector<uint8_t>> storage;
  static std::vector<WeightView> mats;
  if (mats.empty()) {
    std::mt19937_64 rng(7);
    auto add = [&](int64_t rows, int64_t cols) {
      const size_t row_bytes = RowBytes(GgmlType::kQ4_0, cols);
      std::vector<uint8_t> data(row_bytes * rows);
      for (size_t i = 0; i + 8 <= data.size(); i += 8) {
        const uint64_t v = rng();
        std::memcpy(&data[i], &v, 8);
      }
      for (size_t b = 0; b < data.size(); b += sizeof(BlockQ4_0)) {
        const uint16_t d = 0x2C00;  // 1/16
        std::memcpy(&data[b], &d, 2);
      }
      storage.push_back(std::move(data));
      mats.push_back({GgmlType::kQ4_0, rows, cols, storage.back().data(), row_bytes});
    };
    for (int l = 0; l < kLayers; ++l) {
      for (const Shape& m : layer) add(m.rows, m.cols);
    }
    add(32000, 2048);  // output
  }
  const std::vector<float> x = RandomFloats(tokens * 5632, 3);
  std::vector<float> y(static_cast<size_t>(tokens * 32000));
  MatMulScratch scratch;
  scratch.Reserve(tokens, 5632);
  ThreadPool& pool = Pool(threads);
  for (auto _ : state) {
    for (size_t m = 0; m + 1 < mats.size(); ++m) {
      MatMul(pool, mats[m], x.data(), tokens, y.data(), scratch);
    }
    MatMul(pool, mats.back(), x.data(), 1, y.data(), scratch);  // logits of the last token
    benchmark::DoNotOptimize(y.data());
  }
  state.counters["tokens/s"] = benchmark::Counter(static_cast<double>(tokens * state.iterations()),
                                                  benchmark::Counter::kIsRate);
}

void RegisterAll() {
  const GgmlType types[] = {GgmlType::kF32, GgmlType::kF16, GgmlType::kBF16, GgmlType::kQ8_0,
                            GgmlType::kQ4_0};
  for (Isa isa : AvailableIsas()) {
    for (GgmlType type : types) {
      const std::string suffix = std::string(TypeName(type)) + "/" + IsaName(isa);
      benchmark::RegisterBenchmark(("vec_dot/" + suffix).c_str(), VecDot, type, isa, 1);
      benchmark::RegisterBenchmark(("vec_dot_multi8/" + suffix).c_str(), VecDot, type, isa, 8);
    }
  }
  for (int64_t tokens : {1, 64}) {
    for (int threads : {1, 2}) {
      const std::string name = "model/llama1.1b/q4_0/tokens:" + std::to_string(tokens) +
                               "/threads:" + std::to_string(threads);
      benchmark::RegisterBenchmark(name.c_str(), ModelBench, tokens, threads)
          ->UseRealTime()
          ->MinTime(1.0);
    }
  }
  const Isa best = BestIsa();
  const std::pair<GgmlType, bool> matrices[] = {
      {GgmlType::kQ4_0, false}, {GgmlType::kQ4_0, true},  {GgmlType::kQ4_K, false},
      {GgmlType::kQ4_K, true},  {GgmlType::kQ6_K, true},  {GgmlType::kQ5_K, false},
      {GgmlType::kQ5_K, true},  {GgmlType::kQ3_K, false}, {GgmlType::kQ3_K, true},
      {GgmlType::kQ2_K, false}, {GgmlType::kQ2_K, true},  {GgmlType::kF16, false},
      {GgmlType::kQ8_0, false}};
  for (const auto& [type, groups] : matrices) {
    for (Isa isa : AvailableIsas()) {
      if (isa == Isa::kScalar) continue;
      for (int64_t rows : {2048, 5632}) {
        for (int64_t tokens : {1, 64}) {
          for (int threads : {1, 2}) {
            if (isa != best && (tokens != 1 || rows != 5632)) continue;  // keep the run short
            const std::string name =
                "matmul/" + std::string(TypeName(type)) + (groups ? "-groups/" : "/") +
                IsaName(isa) + "/" + std::to_string(rows) + "x2048" +
                "/tokens:" + std::to_string(tokens) + "/threads:" + std::to_string(threads);
            benchmark::RegisterBenchmark(name.c_str(), MatMulBench, type, groups, isa, rows, 2048,
                                         tokens, threads)
                ->UseRealTime()
                ->MinTime(0.3);
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace thermocline

int main(int argc, char** argv) {
  thermocline::RegisterAll();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
