// The kernels that compute in ggml's own order so that a llama.cpp file gives llama.cpp's numbers
// bit for bit (kquants_reference_test.cc checks that against llama.cpp's outputs): the super-block
// row dots (Q2_K .. Q6_K, IQ4_XS; kernels_internal.h's KMins), Q4_1 and Q5_1 (kernels_simd.inc's
// GgmlMinDots) and SiLU (kernels.h's SiluMul).
// Every ISA must give the scalar reference's bits, and a prompt the same numbers as the tokens
// one at a time.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "engine/ops/kernels.h"
#include "engine/ops/matmul.h"
#include "engine/ops/type_table.h"
#include "engine/util/thread_pool.h"

namespace thermocline {
namespace {

std::vector<float> Random(int64_t n, uint32_t seed, float scale) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (float& e : v) e = dist(rng);
  return v;
}

constexpr GgmlType kGgmlOrderTypes[] = {GgmlType::kQ2_K, GgmlType::kQ3_K, GgmlType::kQ4_K,
                                        GgmlType::kQ5_K, GgmlType::kQ6_K, GgmlType::kIQ4_XS,
                                        GgmlType::kQ4_1, GgmlType::kQ5_1};

// Columns: an odd number of blocks (super-blocks for the 256-element types).
int64_t Cols(GgmlType type, int64_t super_blocks) {
  return TypeInfo(type).block_size == 256 ? super_blocks * 256 : super_blocks * 256 + 32;
}

TEST_CASE("the dots in ggml's order give the scalar reference's bits on every ISA", "[kernels]") {
  constexpr int kRows = 7, kTokens = 3;
  for (GgmlType type : kGgmlOrderTypes) {
    const int64_t kCols = Cols(type, 5);
    const TypeKernels& ref = *KernelsFor(type, Isa::kScalar);
    const size_t row_bytes = RowBytes(type, kCols);
    std::vector<uint8_t> w(kRows * row_bytes);
    for (int r = 0; r < kRows; ++r) {
      // Rows of different scales and signs: the mins and offsets take every sign.
      const std::vector<float> f = Random(kCols, 100 + r, 0.02f * (r + 1));
      QuantizeWeights(ref, f.data(), w.data() + r * row_bytes, kCols);
    }
    const TypeKernels& act = *KernelsFor(ref.vec_dot_type, Isa::kScalar);
    const size_t x_bytes = RowBytes(ref.vec_dot_type, kCols);
    std::vector<uint8_t> x(kTokens * x_bytes);
    for (int t = 0; t < kTokens; ++t) {
      const std::vector<float> f = Random(kCols, 200 + t, 1.0f + t);
      act.from_float(f.data(), x.data() + t * x_bytes, kCols);
    }
    for (Isa isa : AvailableIsas()) {
      const TypeKernels& k = *KernelsFor(type, isa);
      for (int r = 0; r < kRows; ++r) {
        float multi[kTokens];
        k.vec_dot_multi(kCols, w.data() + r * row_bytes, x.data(), static_cast<int64_t>(x_bytes),
                        kTokens, multi);
        for (int t = 0; t < kTokens; ++t) {
          INFO(TypeName(type) << " " << IsaName(isa) << " row " << r << " token " << t);
          const float want = ref.vec_dot(kCols, w.data() + r * row_bytes, x.data() + t * x_bytes);
          CHECK(k.vec_dot(kCols, w.data() + r * row_bytes, x.data() + t * x_bytes) == want);
          CHECK(multi[t] == want);
        }
      }
    }
  }
}

// llama.cpp runs a prompt's tokens through the same dot as a single token's (no gemm for these
// types), so a prompt's logits equal those of its tokens fed one by one; MatMul does the same
// (one token of Q4_1 / Q5_1 takes several rows at a time, the same dots).
TEST_CASE("a MatMul in ggml's order of several tokens equals one token at a time, bit for bit",
          "[kernels][matmul]") {
  constexpr int64_t kRows = 37, kTokens = 11;
  ThreadPool pool(2);
  for (GgmlType type : kGgmlOrderTypes) {
    const int64_t kCols = Cols(type, 3);
    MatMulScratch scratch;
    scratch.Reserve(kTokens, kCols);
    const std::vector<float> x = Random(kTokens * kCols, 7, 1.0f);
    const size_t row_bytes = RowBytes(type, kCols);
    std::vector<uint8_t> data(kRows * row_bytes);
    const std::vector<float> f = Random(kRows * kCols, 11, 0.05f);
    for (int64_t r = 0; r < kRows; ++r) {
      QuantizeWeights(*KernelsFor(type), f.data() + r * kCols, data.data() + r * row_bytes, kCols);
    }
    const WeightView w{type, kRows, kCols, data.data(), row_bytes};
    for (Isa isa : AvailableIsas()) {
      std::vector<float> batch(kTokens * kRows), one(kRows);
      MatMul(pool, w, x.data(), kTokens, batch.data(), scratch, isa);
      for (int64_t t = 0; t < kTokens; ++t) {
        MatMul(pool, w, x.data() + t * kCols, 1, one.data(), scratch, isa);
        for (int64_t r = 0; r < kRows; ++r) {
          INFO(TypeName(type) << " " << IsaName(isa) << " token " << t << " row " << r);
          CHECK(batch[t * kRows + r] == one[r]);
        }
      }
    }
  }
}

TEST_CASE("SiluMul gives the scalar reference's bits on every ISA, near x / (1 + e^-x) * up",
          "[kernels]") {
  for (int64_t n : {int64_t{16}, int64_t{20}, int64_t{256}, int64_t{1003}}) {
    std::vector<float> gate = Random(n, 31, 4.0f), up = Random(n, 37, 1.0f);
    gate[0] = -100.0f;  // e^100 overflows: silu is -0 in float, as in ggml
    gate[1] = 90.0f;    // e^-90 is below FLT_MIN
    std::vector<float> want = gate;
    SiluMul(Isa::kScalar, want.data(), up.data(), n);
    for (int64_t i = 0; i < n; ++i) {
      INFO("n " << n << " i " << i << " x " << gate[i]);
      const double exact = gate[i] / (1.0 + std::exp(-static_cast<double>(gate[i]))) * up[i];
      // ggml's exp is within 2 ulp; the division and product round once each.
      CHECK(std::fabs(want[i] - exact) <= 4e-7 * std::fabs(exact) + 1e-30);
      if (i >= n / 16 * 16) {
        // Past the last whole 16, ggml takes expf: the same expression as here.
        CHECK(want[i] == gate[i] / (1.0f + std::exp(-gate[i])) * up[i]);
      }
    }
    for (Isa isa : AvailableIsas()) {
      std::vector<float> got = gate;
      SiluMul(isa, got.data(), up.data(), n);
      for (int64_t i = 0; i < n; ++i) {
        INFO(IsaName(isa) << " n " << n << " i " << i);
        CHECK(got[i] == want[i]);
      }
    }
  }
}

}  // namespace
}  // namespace thermocline
