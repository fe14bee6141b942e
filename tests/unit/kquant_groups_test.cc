// The K-quants in row groups (weight_layout.h's PackQ2_KGroups ... PackQ6_KGroups,
// kernels_internal.h's KGroupKernels): the packing keeps every row's bytes (the
// scales packed again and the re-encoded bits equal the file's); every ISA's
// mat-vec and gemm give the scalar reference's bits (the same exact integer sums and the same
// float operations per row); and MatMul over the groups gives, bit for bit, the scalar dot of the
// file's rows (ggml's order, kernels_scalar_quants.cc) as MatMul over the rows does, for row
// counts that are not a multiple of the group, one to several super-blocks of columns, 1 to 64
// tokens and 1 or 3 threads.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cstring>
#include <random>
#include <vector>

#include "engine/ops/kernels.h"
#include "engine/ops/kernels_internal.h"
#include "engine/ops/matmul.h"
#include "engine/ops/weight_layout.h"
#include "engine/util/thread_pool.h"

namespace thermocline {
namespace {

using ops_internal::kQ4GroupRows;
using ops_internal::TableOf;

// What differs between the types' groups.
struct GroupType {
  GgmlType type;
  WeightLayout layout;
  OwnedWeight (*pack)(ThreadPool&, const WeightView&);
  void (*unpack)(const WeightView&, int64_t, void*);
  size_t (*group_bytes)(int64_t);
  ops_internal::KGroupKernels ops_internal::IsaKernels::*kernels;
};
const GroupType kTypes[] = {
    {GgmlType::kQ2_K, WeightLayout::kQ2_KGroups, PackQ2_KGroups, UnpackQ2_KGroupRow,
     ops_internal::Q2KGroupBytes, &ops_internal::IsaKernels::q2k_groups},
    {GgmlType::kQ3_K, WeightLayout::kQ3_KGroups, PackQ3_KGroups, UnpackQ3_KGroupRow,
     ops_internal::Q3KGroupBytes, &ops_internal::IsaKernels::q3k_groups},
    {GgmlType::kQ4_K, WeightLayout::kQ4_KGroups, PackQ4_KGroups, UnpackQ4_KGroupRow,
     ops_internal::Q4KGroupBytes, &ops_internal::IsaKernels::q4k_groups},
    {GgmlType::kQ5_K, WeightLayout::kQ5_KGroups, PackQ5_KGroups, UnpackQ5_KGroupRow,
     ops_internal::Q5KGroupBytes, &ops_internal::IsaKernels::q5k_groups},
    {GgmlType::kQ6_K, WeightLayout::kQ6_KGroups, PackQ6_KGroups, UnpackQ6_KGroupRow,
     ops_internal::Q6KGroupBytes, &ops_internal::IsaKernels::q6k_groups},
};

struct KMatrix {
  std::vector<uint8_t> data;
  WeightView view;
};

// Rows of weights of varied magnitude per sub-block, so that scales and mins use their 6 bits.
KMatrix RandomK(GgmlType type, int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f), scale(0.05f, 2.0f);
  std::vector<float> values(static_cast<size_t>(rows * cols));
  for (size_t i = 0; i < values.size(); i += 32) {
    const float s = scale(rng), shift = 0.5f * dist(rng);
    for (size_t k = i; k < i + 32; ++k) values[k] = s * (dist(rng) + shift);
  }
  KMatrix m;
  const size_t row_bytes = RowBytes(type, cols);
  m.data.resize(row_bytes * rows);
  KernelsFor(type, Isa::kScalar)->from_float(values.data(), m.data.data(), rows * cols);
  m.view = {type, rows, cols, m.data.data(), row_bytes};
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
// 13 and 45: a partial last group; 1 x 256: one row, one super-block; 64 x 768 and 80 x 1280:
// whole groups over 3 and 5 super-blocks.
const Shape kShapes[] = {{13, 512}, {45, 256}, {1, 256}, {64, 768}, {80, 1280}};

TEST_CASE("PackQ4_KGroups and PackQ6_KGroups keep every row's bytes and pad with zeros",
          "[q4_groups]") {
  ThreadPool pool(3);
  for (const GroupType& k : kTypes) {
    for (const Shape& s : kShapes) {
      INFO(TypeName(k.type));
      const KMatrix m = RandomK(k.type, s.rows, s.cols, 7);
      const OwnedWeight p = k.pack(pool, m.view);
      const int64_t groups = (s.rows + kQ4GroupRows - 1) / kQ4GroupRows;
      CHECK(p.view.layout == k.layout);
      CHECK(p.view.rows == s.rows);
      CHECK(p.view.cols == s.cols);
      CHECK(p.view.row_bytes == m.view.row_bytes);
      CHECK(p.data.size() == groups * k.group_bytes(s.cols));
      CHECK(k.group_bytes(s.cols) % 64 == 0);
      std::vector<uint8_t> row(m.view.row_bytes);
      for (int64_t r = 0; r < groups * kQ4GroupRows; ++r) {
        k.unpack(p.view, r, row.data());
        if (r < s.rows) {
          INFO("shape " << s.rows << "x" << s.cols << " row " << r);
          CHECK(std::memcmp(row.data(), m.view.row(r), row.size()) == 0);
        } else {
          CHECK(std::all_of(row.begin(), row.end(), [](uint8_t b) { return b == 0; }));
        }
      }
    }
  }
}

TEST_CASE("Q4_K and Q6_K group kernels of every ISA give the scalar reference's bits",
          "[q4_groups]") {
  const TypeKernels& q8k = *KernelsFor(GgmlType::kQ8_K, Isa::kScalar);
  ThreadPool pool(1);
  for (const GroupType& kt : kTypes) {
    const ops_internal::KGroupKernels& ref = TableOf(Isa::kScalar).*kt.kernels;
    for (const Shape& s : kShapes) {
      const KMatrix m = RandomK(kt.type, s.rows, s.cols, 3);
      const OwnedWeight p = kt.pack(pool, m.view);
      const size_t gb = kt.group_bytes(s.cols);
      constexpr int64_t kTokens = 7;
      const std::vector<float> x = RandomX(kTokens * s.cols, 9);
      const size_t stride = RowBytes(GgmlType::kQ8_K, s.cols);
      std::vector<uint8_t> act(stride * kTokens);
      for (int64_t t = 0; t < kTokens; ++t) {
        q8k.from_float(x.data() + t * s.cols, act.data() + t * stride, s.cols);
      }
      std::vector<float> want(static_cast<size_t>(kTokens * s.rows));
      for (int64_t t = 0; t < kTokens; ++t) {
        ref.matvec(s.cols, p.view.data, gb, s.rows, act.data() + t * stride,
                   want.data() + t * s.rows);
      }
      for (Isa isa : AvailableIsas()) {
        INFO(TypeName(kt.type) << " " << IsaName(isa) << " shape " << s.rows << "x" << s.cols);
        const ops_internal::KGroupKernels& k = TableOf(isa).*kt.kernels;
        std::vector<float> got(static_cast<size_t>(s.rows), -1.0f);
        k.matvec(s.cols, p.view.data, gb, s.rows, act.data(), got.data());
        for (int64_t r = 0; r < s.rows; ++r) CHECK(got[r] == want[r]);
        // The gemm, one call per group, over all the tokens.
        std::vector<float> y(want.size(), -1.0f);
        for (int64_t r0 = 0; r0 < s.rows; r0 += kQ4GroupRows) {
          const int rows = static_cast<int>(std::min<int64_t>(kQ4GroupRows, s.rows - r0));
          k.gemm(s.cols, p.view.data + r0 / kQ4GroupRows * gb, rows, act.data(), stride, kTokens,
                 y.data() + r0, s.rows);
        }
        for (size_t i = 0; i < y.size(); ++i) CHECK(y[i] == want[i]);
      }
    }
  }
}

TEST_CASE("MatMul over K-quant groups gives the file rows' dots bit for bit",
          "[q4_groups][matmul]") {
  const TypeKernels& q8k = *KernelsFor(GgmlType::kQ8_K, Isa::kScalar);
  for (const GroupType& kt : kTypes) {
    const TypeKernels& wk = *KernelsFor(kt.type, Isa::kScalar);
    for (int threads : {1, 3}) {
      ThreadPool pool(threads);
      for (const Shape& s : kShapes) {
        const KMatrix m = RandomK(kt.type, s.rows, s.cols, 5);
        const OwnedWeight p = kt.pack(pool, m.view);
        for (int64_t n : {1, 2, 7, 64}) {
          const std::vector<float> x = RandomX(n * s.cols, 13);
          MatMulScratch scratch;
          scratch.Reserve(n, s.cols);
          // Both layouts quantize x to the same Q8_K blocks and compute each row's dot in ggml's
          // order (the groups: lane m of a row is chunk m of its sub-blocks), so a row's
          // result is the scalar dot of the file's row, llama.cpp's.
          std::vector<uint8_t> xq(RowBytes(GgmlType::kQ8_K, s.cols));
          for (Isa isa : AvailableIsas()) {
            INFO(TypeName(kt.type) << " " << IsaName(isa) << " threads " << threads << " shape "
                                   << s.rows << "x" << s.cols << " tokens " << n);
            std::vector<float> rows_y(static_cast<size_t>(n * s.rows));
            std::vector<float> groups_y(rows_y.size(), -1.0f);
            MatMul(pool, m.view, x.data(), n, rows_y.data(), scratch, isa);
            MatMul(pool, p.view, x.data(), n, groups_y.data(), scratch, isa);
            int64_t differ = 0;
            for (int64_t t = 0; t < n; ++t) {
              q8k.from_float(x.data() + t * s.cols, xq.data(), s.cols);
              for (int64_t r = 0; r < s.rows; ++r) {
                const float want = wk.vec_dot(s.cols, m.view.row(r), xq.data());
                differ += groups_y[t * s.rows + r] != want || rows_y[t * s.rows + r] != want;
              }
            }
            CHECK(differ == 0);
          }
        }
      }
    }
  }
}

TEST_CASE("MatMulSameInput over Q4_K groups equals one MatMul per weight", "[q4_groups][matmul]") {
  ThreadPool pool(3);
  const KMatrix a = RandomK(GgmlType::kQ4_K, 45, 512, 1), b = RandomK(GgmlType::kQ4_K, 13, 512, 2),
                c = RandomK(GgmlType::kQ4_K, 16, 512, 3);
  const OwnedWeight pa = PackQ4_KGroups(pool, a.view), pb = PackQ4_KGroups(pool, b.view),
                    pc = PackQ4_KGroups(pool, c.view);
  const std::vector<float> x = RandomX(512, 4);
  MatMulScratch scratch;
  scratch.Reserve(1, 512);
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
