// Neuron-aware operators against the dense operators restricted to the active set, for every
// computable FFN type, every ISA this CPU has, odd sizes, several thread counts, and empty,
// single, partial and full active sets.
#include "engine/sparse/sparse_ops.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "engine/ops/kernels.h"
#include "engine/ops/matmul.h"
#include "engine/util/thread_pool.h"

namespace thermocline {
namespace {

constexpr double kEps = std::numeric_limits<float>::epsilon();
const GgmlType kTypes[] = {GgmlType::kF32, GgmlType::kF16, GgmlType::kBF16, GgmlType::kQ8_0,
                           GgmlType::kQ4_0};

OwnedWeight RandomWeight(GgmlType type, int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(rows * cols));
  for (float& f : v) f = dist(rng);
  OwnedWeight w;
  w.view = {type, rows, cols, nullptr, RowBytes(type, cols)};
  w.data.resize(w.view.row_bytes * rows);
  w.view.data = w.data.data();
  for (int64_t r = 0; r < rows; ++r) {
    KernelsFor(type, Isa::kScalar)
        ->from_float(v.data() + r * cols, w.data.data() + r * w.view.row_bytes, cols);
  }
  return w;
}

std::vector<float> Dequantized(const WeightView& w) {
  std::vector<float> out(static_cast<size_t>(w.rows * w.cols));
  for (int64_t r = 0; r < w.rows; ++r)
    KernelsFor(w.type, Isa::kScalar)->to_float(w.row(r), out.data() + r * w.cols, w.cols);
  return out;
}

// Active sets: empty, one neuron, every 7th + a few random, all.
std::vector<std::vector<int32_t>> ActiveSets(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> single = {static_cast<int32_t>(n / 2)}, partial, all;
  for (int32_t i = 0; i < n; ++i) {
    all.push_back(i);
    if (i % 7 == 3 || rng() % 5 == 0) partial.push_back(i);
  }
  return {{}, single, partial, all};
}

// Error bound of a dot of n elements against the float reference: summation roundings (as in
// matmul_test: (n/8 + 32) · 2ε · Σ|w x|, block-wise SIMD sums) plus, for Q8_0 activations, the
// activation quantization: at most 0.6 d_x per element (half a step plus fp16 rounding of d_x).
double DotBound(const float* w, const float* x, int64_t n, bool quantized) {
  double abs_sum = 0, quant_err = 0;
  for (int64_t i = 0; i < n; ++i) abs_sum += std::fabs(static_cast<double>(w[i]) * x[i]);
  if (quantized) {
    for (int64_t b = 0; b < n; b += 32) {
      double amax = 0;
      for (int64_t i = b; i < b + 32; ++i)
        amax = std::max(amax, std::fabs(static_cast<double>(x[i])));
      for (int64_t i = b; i < b + 32; ++i) quant_err += 0.6 * amax / 127.0 * std::fabs(w[i]);
    }
  }
  return quant_err + (n / 8.0 + 32) * 2 * kEps * abs_sum + 1e-30;
}

void CheckMatVec(GgmlType type, int64_t rows, int64_t cols, ThreadPool& pool) {
  const OwnedWeight w = RandomWeight(type, rows, cols, 3);
  const std::vector<float> wf = Dequantized(w.view);
  std::mt19937 rng(9);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> x(cols);
  for (float& f : x) f = dist(rng);
  for (Isa isa : AvailableIsas()) {
    const TypeKernels* k = KernelsFor(type, isa);
    if (k == nullptr) continue;
    const bool quantized = k->vec_dot_type != GgmlType::kF32;
    std::vector<uint8_t> xc(ConvertedBytes(*k, cols));
    ConvertActivations(*k, isa, x.data(), cols, xc.data());
    std::vector<float> dense(rows);
    MatMulScratch scratch;
    scratch.Reserve(1, cols);
    MatMul(pool, w.view, x.data(), 1, dense.data(), scratch, isa);
    for (const std::vector<int32_t>& idx : ActiveSets(rows, 17)) {
      std::vector<float> y(idx.size() + 1, -1.0f), ref(idx.size() + 1);
      SparseMatVec(pool, *k, w.view, xc.data(), idx.data(), idx.size(), y.data());
      SparseMatVecReference(w.view, x.data(), idx.data(), idx.size(), ref.data());
      for (size_t j = 0; j < idx.size(); ++j) {
        const double bound = DotBound(wf.data() + idx[j] * cols, x.data(), cols, quantized);
        INFO(TypeName(type) << " " << IsaName(isa) << " rows " << rows << " cols " << cols
                            << " active " << idx.size() << " j " << j);
        REQUIRE(std::fabs(y[j] - ref[j]) <= bound);
        // Dense and sparse are each within `bound` of the reference.
        REQUIRE(std::fabs(y[j] - dense[idx[j]]) <= 2 * bound);
      }
      REQUIRE(y[idx.size()] == -1.0f);  // nothing written past the list
    }
  }
}

void CheckAxpy(GgmlType type, int64_t n_embd, int64_t n_ff, ThreadPool& pool) {
  const OwnedWeight down = RandomWeight(type, n_embd, n_ff, 5);  // (n_embd, n_ff)
  absl::StatusOr<OwnedWeight> dt = TransposeWeight(pool, down.view);
  REQUIRE(dt.ok());
  const WeightView& w_t = dt->view;
  REQUIRE(w_t.rows == n_ff);
  REQUIRE(w_t.cols == n_embd);
  if (n_embd % TypeInfo(type).block_size != 0) REQUIRE(w_t.type == GgmlType::kF32);
  const std::vector<float> df = Dequantized(down.view), tf = Dequantized(w_t);
  const bool exact_transpose =
      w_t.type == GgmlType::kF32 || type == GgmlType::kF16 || type == GgmlType::kBF16;
  if (exact_transpose) {
    for (int64_t r = 0; r < n_embd; ++r)
      for (int64_t c = 0; c < n_ff; ++c) REQUIRE(tf[c * n_embd + r] == df[r * n_ff + c]);
  }
  std::mt19937 rng(21);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  SparseScratch scratch;
  scratch.Reserve(pool.size(), n_embd, n_ff);
  for (Isa isa : AvailableIsas()) {
    const TypeKernels* k = KernelsFor(w_t.type, isa);
    if (k == nullptr) continue;
    for (const std::vector<int32_t>& idx : ActiveSets(n_ff, 23)) {
      std::vector<float> act(idx.size());
      for (size_t j = 0; j < act.size(); ++j) act[j] = (j % 3 == 1) ? 0.0f : dist(rng);
      std::vector<float> out(n_embd, 123.0f), ref(n_embd), dense(n_embd, 0.0f);
      SparseAxpy(pool, *k, w_t, idx.data(), act.data(), idx.size(), out.data(), scratch);
      SparseAxpyReference(w_t, idx.data(), act.data(), idx.size(), ref.data());
      // Dense down restricted to the active set: activations zero elsewhere, summed in double.
      std::vector<double> acc(n_embd, 0.0), mag(n_embd, 0.0);
      for (size_t j = 0; j < idx.size(); ++j) {
        for (int64_t i = 0; i < n_embd; ++i) {
          acc[i] += static_cast<double>(act[j]) * df[i * n_ff + idx[j]];
          mag[i] += std::fabs(static_cast<double>(act[j]) * tf[idx[j] * n_embd + i]);
        }
      }
      for (int64_t i = 0; i < n_embd; ++i) {
        // Float sums of up to |idx| terms split over threads, then the thread reduction.
        const double bound = (idx.size() + pool.size() + 2) * 2 * kEps * mag[i] + 1e-30;
        INFO(TypeName(type) << " " << IsaName(isa) << " n_embd " << n_embd << " n_ff " << n_ff
                            << " active " << idx.size() << " i " << i);
        REQUIRE(std::fabs(out[i] - ref[i]) <= bound);
        if (exact_transpose) REQUIRE(std::fabs(out[i] - acc[i]) <= bound);
      }
    }
  }
}

TEST_CASE("sparse mat-vec equals dense rows for every type and ISA", "[sparse]") {
  for (int threads : {1, 2, 3}) {
    ThreadPool pool(threads);
    for (GgmlType type : kTypes) {
      const bool blocked = TypeInfo(type).block_size > 1;
      CheckMatVec(type, 67, blocked ? 96 : 37, pool);
      CheckMatVec(type, 301, blocked ? 256 : 131, pool);
    }
  }
}

TEST_CASE("sparse axpy over down_t equals dense down restricted", "[sparse]") {
  for (int threads : {1, 2, 3}) {
    ThreadPool pool(threads);
    for (GgmlType type : kTypes) {
      const bool blocked = TypeInfo(type).block_size > 1;
      CheckAxpy(type, blocked ? 64 : 37, blocked ? 96 : 67, pool);
      CheckAxpy(type, 48, blocked ? 224 : 131, pool);  // 48: blocks don't divide → F32 down_t
    }
  }
}

}  // namespace
}  // namespace thermocline
