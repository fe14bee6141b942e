// Q4_0 in row groups (weight_layout.h's PackQ4_0Groups, kernels_internal.h's Q4GroupKernels):
// the packing keeps every row's bytes; every ISA's mat-vec and gemm give the scalar reference's
// bits (they compute the same exact integer dots and the same float operations per row); and
// MatMul over the groups matches MatMul over the rows up to float summation order, for row
// counts that are not a multiple of the group, several blocks of columns, 1 to 64 tokens and
// 1 or 3 threads.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "engine/ops/kernels.h"
#include "engine/ops/kernels_internal.h"
#include "engine/ops/matmul.h"
#include "engine/ops/weight_layout.h"
#include "engine/util/thread_pool.h"
#include "quant_test_util.h"

namespace thermocline {
namespace {

using ops_internal::kQ4GroupRows;
using ops_internal::Q4GroupBytes;
using ops_internal::TableOf;
using ops_internal::TileRowBytes;

struct Q4Matrix {
  std::vector<uint8_t> data;
  WeightView view;
};

Q4Matrix RandomQ4(int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> values(static_cast<size_t>(rows * cols));
  for (float& v : values) v = dist(rng);
  Q4Matrix m;
  const size_t row_bytes = RowBytes(GgmlType::kQ4_0, cols);
  m.data.resize(row_bytes * rows);
  KernelsFor(GgmlType::kQ4_0, Isa::kScalar)->from_float(values.data(), m.data.data(), rows * cols);
  m.view = {GgmlType::kQ4_0, rows, cols, m.data.data(), row_bytes};
  return m;
}

std::vector<float> RandomX(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(n));
  for (float& f : x) f = dist(rng);
  return x;
}

struct Shape {
  int64_t rows, cols;
};
// 13 and 45: a partial last group; 33: a pair of groups and one more row (AVX-512 runs groups
// in pairs); 64 x 160: whole pairs over 5 blocks; 1 x 32: one row, one block.
const Shape kShapes[] = {{13, 96}, {45, 64}, {33, 160}, {64, 160}, {1, 32}, {80, 576}};

TEST_CASE("PackQ4_0Groups keeps every row's bytes and pads with zeros", "[q4_groups]") {
  ThreadPool pool(3);
  for (const Shape& s : kShapes) {
    const Q4Matrix m = RandomQ4(s.rows, s.cols, 7);
    const OwnedWeight p = PackQ4_0Groups(pool, m.view);
    const int64_t groups = (s.rows + kQ4GroupRows - 1) / kQ4GroupRows;
    CHECK(p.view.layout == WeightLayout::kQ4_0Groups);
    CHECK(p.view.rows == s.rows);
    CHECK(p.view.cols == s.cols);
    CHECK(p.view.row_bytes == m.view.row_bytes);
    CHECK(p.data.size() == groups * Q4GroupBytes(s.cols));
    CHECK(Q4GroupBytes(s.cols) % 64 == 0);
    std::vector<uint8_t> row(m.view.row_bytes);
    for (int64_t r = 0; r < groups * kQ4GroupRows; ++r) {
      UnpackQ4_0GroupRow(p.view, r, row.data());
      if (r < s.rows) {
        INFO("shape " << s.rows << "x" << s.cols << " row " << r);
        CHECK(std::memcmp(row.data(), m.view.row(r), row.size()) == 0);
      } else {
        CHECK(std::all_of(row.begin(), row.end(), [](uint8_t b) { return b == 0; }));
      }
    }
  }
}

TEST_CASE("Q4_0 group kernels of every ISA give the scalar reference's bits", "[q4_groups]") {
  const ops_internal::Q4GroupKernels& ref = TableOf(Isa::kScalar).q4_groups;
  ThreadPool pool(1);
  for (const Shape& s : kShapes) {
    const Q4Matrix m = RandomQ4(s.rows, s.cols, 3);
    const OwnedWeight p = PackQ4_0Groups(pool, m.view);
    const size_t gb = Q4GroupBytes(s.cols);
    constexpr int64_t kTokens = 7;
    const std::vector<float> x = RandomX(kTokens * s.cols, 9);
    const size_t stride = static_cast<size_t>(TileRowBytes(s.cols));
    std::vector<uint8_t> act(stride * kTokens);
    for (int64_t t = 0; t < kTokens; ++t) {
      ref.quantize(x.data() + t * s.cols, s.cols, 8, act.data() + t * stride);
    }
    std::vector<float> want(static_cast<size_t>(kTokens * s.rows));
    for (int64_t t = 0; t < kTokens; ++t) {
      ref.matvec(s.cols, p.view.data, gb, s.rows, act.data() + t * stride,
                 want.data() + t * s.rows);
    }
    for (Isa isa : AvailableIsas()) {
      INFO(IsaName(isa) << " shape " << s.rows << "x" << s.cols);
      const ops_internal::Q4GroupKernels& k = TableOf(isa).q4_groups;
      std::vector<uint8_t> act_isa(act.size());
      for (int64_t t = 0; t < kTokens; ++t) {
        k.quantize(x.data() + t * s.cols, s.cols, 8, act_isa.data() + t * stride);
      }
      // The tile rows' used bytes (quants, scales, corrections; the padding is not written).
      const size_t used = static_cast<size_t>(s.cols / kQK8_0 * 40);
      for (int64_t t = 0; t < kTokens; ++t) {
        CHECK(std::memcmp(act_isa.data() + t * stride, act.data() + t * stride, used) == 0);
      }
      std::vector<float> got(static_cast<size_t>(s.rows), -1.0f);
      k.matvec(s.cols, p.view.data, gb, s.rows, act.data(), got.data());
      for (int64_t r = 0; r < s.rows; ++r) CHECK(got[r] == want[r]);
      // The gemm, one call per gemm_rows rows, over all the tokens.
      std::vector<float> y(want.size(), -1.0f);
      for (int64_t r0 = 0; r0 < s.rows; r0 += k.gemm_rows) {
        const int rows = static_cast<int>(std::min<int64_t>(k.gemm_rows, s.rows - r0));
        k.gemm(s.cols, p.view.data + r0 / kQ4GroupRows * gb, gb, rows, act.data(), stride, kTokens,
               y.data() + r0, s.rows);
      }
      for (size_t i = 0; i < y.size(); ++i) CHECK(y[i] == want[i]);
    }
  }
}

TEST_CASE("MatMul over Q4_0 groups matches MatMul over the rows", "[q4_groups][matmul]") {
  const TypeKernels& q4 = *KernelsFor(GgmlType::kQ4_0, Isa::kScalar);
  const TypeKernels& q8 = *KernelsFor(GgmlType::kQ8_0, Isa::kScalar);
  for (int threads : {1, 3}) {
    ThreadPool pool(threads);
    for (const Shape& s : kShapes) {
      const Q4Matrix m = RandomQ4(s.rows, s.cols, 5);
      const OwnedWeight p = PackQ4_0Groups(pool, m.view);
      for (int64_t n : {1, 2, 7, 64}) {
        const std::vector<float> x = RandomX(n * s.cols, 13);
        MatMulScratch scratch;
        scratch.Reserve(n, s.cols);
        // Both layouts quantize x to the same Q8_0 blocks and take the same exact integer dot
        // per block; they differ in the order of the float sums, bounded as the int8 kernels'
        // distance to the scalar dot (quant_test_util.h).
        std::vector<uint8_t> xq(RowBytes(GgmlType::kQ8_0, s.cols));
        for (Isa isa : AvailableIsas()) {
          INFO(IsaName(isa) << " threads " << threads << " shape " << s.rows << "x" << s.cols
                            << " tokens " << n);
          std::vector<float> rows_y(static_cast<size_t>(n * s.rows));
          std::vector<float> groups_y(rows_y.size(), -1.0f);
          MatMul(pool, m.view, x.data(), n, rows_y.data(), scratch, isa);
          MatMul(pool, p.view, x.data(), n, groups_y.data(), scratch, isa);
          for (int64_t t = 0; t < n; ++t) {
            q8.from_float(x.data() + t * s.cols, xq.data(), s.cols);
            for (int64_t r = 0; r < s.rows; ++r) {
              const double want = q4.vec_dot(s.cols, m.view.row(r), xq.data());
              const double tol =
                  testing::QuantDotTolerance(GgmlType::kQ4_0, s.cols, m.view.row(r), xq.data());
              CHECK(std::fabs(groups_y[t * s.rows + r] - want) <= tol);
              CHECK(std::fabs(groups_y[t * s.rows + r] - rows_y[t * s.rows + r]) <= 2 * tol);
            }
          }
        }
      }
    }
  }
}

TEST_CASE("MatMulSameInput over Q4_0 groups equals one MatMul per weight", "[q4_groups][matmul]") {
  ThreadPool pool(3);
  const Q4Matrix a = RandomQ4(45, 128, 1), b = RandomQ4(13, 128, 2), c = RandomQ4(16, 128, 3);
  const OwnedWeight pa = PackQ4_0Groups(pool, a.view), pb = PackQ4_0Groups(pool, b.view),
                    pc = PackQ4_0Groups(pool, c.view);
  const std::vector<float> x = RandomX(128, 4);
  MatMulScratch scratch;
  scratch.Reserve(1, 128);
  std::vector<float> ya(45), yb(13), yc(16);
  const WeightView* w[] = {&pa.view, &pb.view, &pc.view};
  float* const y[] = {ya.data(), yb.data(), yc.data()};
  MatMulSameInput(pool, w, x.data(), 1, y, scratch);
  for (int i = 0; i < 3; ++i) {
    std::vector<float> one(static_cast<size_t>(w[i]->rows));
    MatMul(pool, *w[i], x.data(), 1, one.data(), scratch);
    for (int64_t r = 0; r < w[i]->rows; ++r) CHECK(y[i][r] == one[r]);
  }
}

}  // namespace
}  // namespace thermocline
