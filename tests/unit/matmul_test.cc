// MatMul against its references for every computable type, ISA, token count and thread count.
// Two checks per output: against the scalar vec_dot on the same converted activations (what
// MatMul must compute, up to summation order), and against MatMulReference (float activations,
// so the error of quantizing activations to Q8_0 is part of the bound).
#include "engine/ops/matmul.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "engine/ops/kernels.h"
#include "engine/util/thread_pool.h"
#include "quant_test_util.h"

namespace thermocline {
namespace {

constexpr double kEps = std::numeric_limits<float>::epsilon();

struct Matrix {
  std::vector<uint8_t> data;
  WeightView view;
};

Matrix RandomMatrix(GgmlType type, int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> row(static_cast<size_t>(cols));
  Matrix m;
  const size_t row_bytes = RowBytes(type, cols);
  m.data.resize(row_bytes * rows);
  for (int64_t r = 0; r < rows; ++r) {
    for (float& f : row) f = dist(rng);
    KernelsFor(type, Isa::kScalar)->from_float(row.data(), m.data.data() + r * row_bytes, cols);
  }
  m.view = {type, rows, cols, m.data.data(), row_bytes};
  return m;
}

// Checks n_tokens in {1, 3, 8, 17, 64} and, when max_tokens is larger, max_tokens itself.
void CheckMatMul(GgmlType type, int64_t rows, int64_t cols, int64_t max_tokens = 64) {
  const Matrix w = RandomMatrix(type, rows, cols, 11);
  const TypeKernels& ref = *KernelsFor(type, Isa::kScalar);
  const TypeKernels& x_ref = *KernelsFor(ref.vec_dot_type, Isa::kScalar);
  const bool quantized = ref.vec_dot_type != GgmlType::kF32;
  std::mt19937 rng(5);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(max_tokens * cols));
  for (float& f : x) f = dist(rng);

  // Per output: the scalar vec_dot on converted activations (what MatMul computes, up to
  // summation order); the bound of kernels_test on its distance to the SIMD kernels (roundings
  // at magnitudes up to sum |w x| for floats, quant_test_util.h's for the int8 kernels, which
  // offset the weights); and, against MatMulReference, the activation quantization error: half
  // a step (amax / 127 of the activation block) per element plus the fp16 rounding of Q8_0's
  // scale (at most 127 * 2^-11 steps), under 0.6 steps, times |w|.
  const size_t x_row_bytes = RowBytes(ref.vec_dot_type, cols);
  const int64_t x_block = TypeInfo(ref.vec_dot_type).block_size;
  std::vector<uint8_t> xq(x_row_bytes * max_tokens);
  std::vector<float> xq_f(static_cast<size_t>(cols)), w_f(static_cast<size_t>(cols));
  std::vector<float> want(static_cast<size_t>(max_tokens * rows));
  std::vector<double> tol_kernel(want.size()), tol_ref(want.size());
  for (int64_t t = 0; t < max_tokens; ++t) {
    x_ref.from_float(x.data() + t * cols, xq.data() + t * x_row_bytes, cols);
  }
  for (int64_t r = 0; r < rows; ++r) {
    ref.to_float(w.view.row(r), w_f.data(), cols);
    for (int64_t t = 0; t < max_tokens; ++t) {
      const uint8_t* xt = xq.data() + t * x_row_bytes;
      x_ref.to_float(xt, xq_f.data(), cols);
      double abs_sum = 0.0, quant_err = 0.0;
      for (int64_t i = 0; i < cols; ++i) abs_sum += std::fabs(double{w_f[i]} * xq_f[i]);
      if (quantized) {
        for (int64_t b = 0; b < cols; b += x_block) {
          double amax = 0.0;
          for (int64_t i = b; i < b + x_block; ++i) {
            amax = std::max(amax, std::fabs(double{x[t * cols + i]}));
          }
          for (int64_t i = b; i < b + x_block; ++i)
            quant_err += 0.6 * amax / 127 * std::fabs(w_f[i]);
        }
      }
      const size_t o = static_cast<size_t>(t * rows + r);
      want[o] = ref.vec_dot(cols, w.view.row(r), xt);
      tol_kernel[o] = quantized ? testing::QuantDotTolerance(type, cols, w.view.row(r), xt)
                                : (cols / 8.0 + 32) * 2 * kEps * abs_sum;
      tol_ref[o] = quant_err + tol_kernel[o] + (cols / 8.0 + 32) * 2 * kEps * abs_sum;
    }
  }
  std::vector<float> y_ref(want.size());
  MatMulReference(w.view, x.data(), max_tokens, y_ref.data());

  MatMulScratch scratch;
  scratch.Reserve(max_tokens, cols);
  for (int threads : {1, 2}) {
    ThreadPool pool(threads);
    for (Isa isa : AvailableIsas()) {
      for (int64_t n_tokens : {int64_t{1}, int64_t{3}, int64_t{8}, int64_t{17}, max_tokens}) {
        INFO(TypeName(type) << " " << IsaName(isa) << " rows=" << rows << " cols=" << cols
                            << " tokens=" << n_tokens << " threads=" << threads);
        std::vector<float> y(static_cast<size_t>(n_tokens * rows), NAN);
        MatMul(pool, w.view, x.data(), n_tokens, y.data(), scratch, isa);
        int bad = 0;
        for (size_t o = 0; o < y.size(); ++o) {
          const bool ok = std::fabs(y[o] - want[o]) <= tol_kernel[o] &&
                          std::fabs(y[o] - y_ref[o]) <= tol_ref[o];
          if (!ok && bad++ < 3) {
            FAIL_CHECK("y[" << o / rows << ", " << o % rows << "] = " << y[o] << ", vec_dot "
                            << want[o] << " (tol " << tol_kernel[o] << "), reference " << y_ref[o]
                            << " (tol " << tol_ref[o] << ")");
          }
        }
        CHECK(bad == 0);
      }
    }
  }
}

TEST_CASE("MatMul matches its references for every type", "[matmul]") {
  for (GgmlType type :
       {GgmlType::kF32, GgmlType::kF16, GgmlType::kBF16, GgmlType::kQ8_0, GgmlType::kQ4_0}) {
    CheckMatMul(type, 37, 96);    // odd rows, odd number of blocks
    CheckMatMul(type, 160, 544);  // several row blocks per thread
  }
  for (GgmlType type : {GgmlType::kQ4_1, GgmlType::kQ5_0, GgmlType::kQ5_1, GgmlType::kIQ4_NL}) {
    CheckMatMul(type, 37, 96, 20);   // odd rows and blocks; gemm from 2 tokens
    CheckMatMul(type, 40, 544, 20);  // a column chunk of 16 blocks and a ragged one
  }
  for (GgmlType type : {GgmlType::kQ2_K, GgmlType::kQ3_K, GgmlType::kQ4_K, GgmlType::kQ5_K,
                        GgmlType::kQ6_K, GgmlType::kIQ4_XS}) {
    CheckMatMul(type, 37, 768, 20);  // odd rows, an odd number of super-blocks: a ragged chunk
  }
  for (GgmlType type : {GgmlType::kQ8_0, GgmlType::kQ4_0}) {
    CheckMatMul(type, 48, 2080);  // several column chunks in the tile kernels, 65 blocks
  }
  CheckMatMul(GgmlType::kF32, 5, 33);  // float rows need not be a multiple of 32
  for (GgmlType type : {GgmlType::kF16, GgmlType::kQ4_0}) {
    CheckMatMul(type, 37, 96, 130);  // more tokens than the gemm keeps on its stack (64)
  }
}

// Q, K and V shapes (one shared hand-off for quantized single tokens, one MatMul each
// otherwise): every output equals its own MatMul bit for bit (the same kernels on the same
// converted activations), for 1 to 3 threads.
TEST_CASE("MatMulSameInput equals one MatMul per weight", "[matmul]") {
  for (GgmlType type : {GgmlType::kQ4_0, GgmlType::kQ8_0, GgmlType::kF16, GgmlType::kQ5_1,
                        GgmlType::kQ4_K, GgmlType::kQ6_K}) {
    const int64_t cols = TypeInfo(type).block_size == kQK_K ? 256 : 160;
    const Matrix q = RandomMatrix(type, 300, cols, 1), k = RandomMatrix(type, 37, cols, 2),
                 v = RandomMatrix(type, 5000, cols, 3);  // ranges that cross from q to k to v
    std::mt19937 rng(9);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    for (int64_t n_tokens : {1, 3}) {
      std::vector<float> x(n_tokens * cols);
      for (float& f : x) f = dist(rng);
      for (int threads : {1, 2, 3}) {
        ThreadPool pool(threads);
        MatMulScratch scratch;
        scratch.Reserve(n_tokens, cols);
        const WeightView* w[] = {&q.view, &k.view, &v.view};
        std::vector<float> got[3], want[3];
        for (int i = 0; i < 3; ++i) {
          got[i].assign(n_tokens * w[i]->rows, -1.0f);
          want[i].resize(n_tokens * w[i]->rows);
          MatMul(pool, *w[i], x.data(), n_tokens, want[i].data(), scratch);
        }
        float* const y[] = {got[0].data(), got[1].data(), got[2].data()};
        MatMulSameInput(pool, w, x.data(), n_tokens, y, scratch);
        INFO(TypeName(type) << " tokens " << n_tokens << " threads " << threads);
        for (int i = 0; i < 3; ++i) CHECK(got[i] == want[i]);
      }
    }
  }
}

TEST_CASE("MatMulScratch::Reserve only grows", "[matmul]") {
  MatMulScratch scratch;
  scratch.Reserve(8, 2048);
  const size_t size = scratch.size();
  CHECK(size >= 8 * 2048 * sizeof(float));
  scratch.Reserve(1, 64);
  CHECK(scratch.size() == size);
}

}  // namespace
}  // namespace thermocline
