// Neuron-aware operators against the dense operators restricted to the active set, for every
// computable FFN type, every ISA this CPU has, odd sizes, several thread counts, and empty,
// single, partial and full active sets.
#include "engine/sparse/sparse_ops.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "engine/ops/kernels.h"
#include "engine/ops/matmul.h"
#include "engine/ops/type_table.h"
#include "engine/sparse/column_sparse.h"
#include "engine/sparse/sparse_ffn.h"
#include "engine/util/thread_pool.h"
#include "quant_test_util.h"

namespace thermocline {
namespace {

constexpr double kEps = std::numeric_limits<float>::epsilon();
const std::vector<GgmlType> kTypes = testing::WeightTypes();

// Columns of a row: `small` rounded up to whole blocks of `type` (one super-block at least).
int64_t Cols(GgmlType type, int64_t small) {
  const int64_t b = TypeInfo(type).block_size;
  return (small + b - 1) / b * b;
}

// The type of down_t that TransposeWeight makes for a down of `type` with `rows` rows.
GgmlType DownTType(GgmlType type, int64_t rows) {
  const GgmlType t = FindWeightType(type)->down_t;
  return rows % TypeInfo(t).block_size == 0 ? t : GgmlType::kF32;
}

OwnedWeight RandomWeight(GgmlType type, int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(rows * cols));
  for (float& f : v) f = dist(rng);
  OwnedWeight w = OwnedWeight::Allocate(type, rows, cols);
  for (int64_t r = 0; r < rows; ++r) {
    QuantizeWeights(*KernelsFor(type, Isa::kScalar), v.data() + r * cols,
                    w.data.data() + r * w.view.row_bytes, cols);
  }
  return w;
}

std::vector<float> Dequantized(const WeightView& w) {
  std::vector<float> out(static_cast<size_t>(w.rows * w.cols));
  for (int64_t r = 0; r < w.rows; ++r)
    KernelsFor(w.type, Isa::kScalar)->to_float(w.row(r), out.data() + r * w.cols, w.cols);
  return out;
}

// Active sets: empty, one neuron, six descending (the axpy's groups of 4 rows plus a tail),
// every 7th + a few random, all.
std::vector<std::vector<int32_t>> ActiveSets(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> single = {static_cast<int32_t>(n / 2)}, six, partial, all;
  for (int32_t i = 0; i < 6; ++i) six.push_back(static_cast<int32_t>(n - 1 - 3 * i));
  for (int32_t i = 0; i < n; ++i) {
    all.push_back(i);
    if (i % 7 == 3 || rng() % 5 == 0) partial.push_back(i);
  }
  return {{}, single, six, partial, all};
}

// Error bound of a dot of n elements against the float reference: summation roundings (as in
// matmul_test: (n/8 + 32) · 2ε · Σ|w x|, block-wise SIMD sums; for the int8 kernels
// quant_test_util.h's bound on the prepared activations) plus, for quantized activations, their
// quantization: at most 0.6 steps (amax / 127 of the activation block) per element.
double DotBound(GgmlType type, const float* w, const float* x, int64_t n, const void* w_row) {
  const TypeKernels& ref = *KernelsFor(type, Isa::kScalar);
  double abs_sum = 0, quant_err = 0, kernel = 0;
  for (int64_t i = 0; i < n; ++i) abs_sum += std::fabs(static_cast<double>(w[i]) * x[i]);
  if (ref.vec_dot_type != GgmlType::kF32) {
    const int64_t block = TypeInfo(ref.vec_dot_type).block_size;
    for (int64_t b = 0; b < n; b += block) {
      double amax = 0;
      for (int64_t i = b; i < b + block; ++i)
        amax = std::max(amax, std::fabs(static_cast<double>(x[i])));
      for (int64_t i = b; i < b + block; ++i) quant_err += 0.6 * amax / 127.0 * std::fabs(w[i]);
    }
    std::vector<uint8_t> xq(RowBytes(ref.vec_dot_type, n));
    KernelsFor(ref.vec_dot_type, Isa::kScalar)->from_float(x, xq.data(), n);
    kernel = testing::QuantDotTolerance(type, n, w_row, xq.data());
  }
  return quant_err + kernel + (n / 8.0 + 32) * 2 * kEps * abs_sum + 1e-30;
}

void CheckMatVec(GgmlType type, int64_t rows, int64_t cols, ThreadPool& pool) {
  const OwnedWeight w = RandomWeight(type, rows, cols, 3);
  const OwnedWeight w_up = RandomWeight(type, rows, cols, 4);
  const std::vector<float> wf = Dequantized(w.view), uf = Dequantized(w_up.view);
  std::mt19937 rng(9);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> x(cols);
  for (float& f : x) f = dist(rng);
  // Each row's bound, once (they do not depend on the ISA or the active set).
  std::vector<double> bound_of(rows), bound_up_of(rows);
  for (int64_t r = 0; r < rows; ++r) {
    bound_of[r] = DotBound(type, wf.data() + r * cols, x.data(), cols, w.view.row(r));
    bound_up_of[r] = DotBound(type, uf.data() + r * cols, x.data(), cols, w_up.view.row(r));
  }
  const absl::StatusOr<InterleavedGateUp> interleaved = InterleaveGateUp(pool, w.view, w_up.view);
  REQUIRE(interleaved.ok());
  REQUIRE(interleaved->storage.data.size() == 2 * rows * w.view.row_bytes);
  for (Isa isa : AvailableIsas()) {
    const TypeKernels* k = KernelsFor(type, isa);
    if (k == nullptr) continue;
    std::vector<uint8_t> xc(ConvertedBytes(*k, cols));
    ConvertActivations(*k, isa, x.data(), cols, xc.data());
    std::vector<uint8_t> xp(PreparedBytes(type, cols));
    PrepareActivations(type, isa, x.data(), cols, xp.data());
    std::vector<float> dense(rows), dense_up(rows);
    MatMulScratch scratch;
    scratch.Reserve(1, cols);
    MatMul(pool, w.view, x.data(), 1, dense.data(), scratch, isa);
    MatMul(pool, w_up.view, x.data(), 1, dense_up.data(), scratch, isa);
    for (const std::vector<int32_t>& idx : ActiveSets(rows, 17)) {
      const size_t n = idx.size();
      std::vector<float> y(n + 1, -1.0f), y_isa(n + 1, -1.0f), ref(n + 1), ref_up(n + 1);
      std::vector<float> y_gate(n + 1, -1.0f), y_up(n + 1, -1.0f);
      SparseMatVec(pool, *k, w.view, xc.data(), idx.data(), n, y.data());
      SparseMatVec(pool, isa, w.view, xp.data(), idx.data(), n, y_isa.data());
      SparseGateUp(pool, isa, w.view, xp.data(), w_up.view, xp.data(), idx.data(), n, y_gate.data(),
                   y_up.data());
      std::vector<float> yi_gate(n + 1, -1.0f), yi_up(n + 1, -1.0f);
      SparseGateUp(pool, isa, interleaved->gate, xp.data(), interleaved->up, xp.data(), idx.data(),
                   n, yi_gate.data(), yi_up.data());
      // The same x in two buffers: gate and up rows then go through separate kernel calls.
      const std::vector<uint8_t> xp_up = xp;
      std::vector<float> ys_gate(n + 1, -1.0f), ys_up(n + 1, -1.0f);
      SparseGateUp(pool, isa, w.view, xp.data(), w_up.view, xp_up.data(), idx.data(), n,
                   ys_gate.data(), ys_up.data());
      SparseMatVecReference(w.view, x.data(), idx.data(), n, ref.data());
      SparseMatVecReference(w_up.view, x.data(), idx.data(), n, ref_up.data());
      for (size_t j = 0; j < n; ++j) {
        const double bound = bound_of[idx[j]];
        const double bound_up = bound_up_of[idx[j]];
        INFO(TypeName(type) << " " << IsaName(isa) << " rows " << rows << " cols " << cols
                            << " active " << n << " j " << j << " threads " << pool.size());
        REQUIRE(std::fabs(y[j] - ref[j]) <= bound);
        // Dense and sparse are each within `bound` of the reference.
        REQUIRE(std::fabs(y[j] - dense[idx[j]]) <= 2 * bound);
        // The ISA-explicit and fused forms run the same kernels on the same rows: bit-equal.
        REQUIRE(y_isa[j] == y[j]);
        REQUIRE(y_gate[j] == y[j]);
        REQUIRE(yi_gate[j] == y_gate[j]);  // interleaved storage: same rows, same kernels
        REQUIRE(yi_up[j] == y_up[j]);
        REQUIRE(ys_gate[j] == y_gate[j]);  // a row's dot does not depend on its call's other rows
        REQUIRE(ys_up[j] == y_up[j]);
        REQUIRE(std::fabs(y_up[j] - ref_up[j]) <= bound_up);
        REQUIRE(std::fabs(y_up[j] - dense_up[idx[j]]) <= 2 * bound_up);
      }
      // Nothing written past the list.
      REQUIRE(y[n] == -1.0f);
      REQUIRE(y_isa[n] == -1.0f);
      REQUIRE(y_gate[n] == -1.0f);
      REQUIRE(y_up[n] == -1.0f);
      REQUIRE(yi_gate[n] == -1.0f);
      REQUIRE(yi_up[n] == -1.0f);
      REQUIRE(ys_gate[n] == -1.0f);
      REQUIRE(ys_up[n] == -1.0f);
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
  REQUIRE(w_t.type == DownTType(type, n_embd));
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
      std::vector<float> out_isa(n_embd, -7.0f);
      SparseAxpy(pool, isa, w_t, idx.data(), act.data(), idx.size(), out_isa.data(), scratch);
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
        REQUIRE(out_isa[i] == out[i]);  // the same kernels and split: bit-equal
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
      CheckMatVec(type, 67, blocked ? Cols(type, 96) : 37, pool);
      CheckMatVec(type, 301, blocked ? Cols(type, 256) + TypeInfo(type).block_size : 131, pool);
    }
  }
}

TEST_CASE("sparse axpy over down_t equals dense down restricted", "[sparse]") {
  for (int threads : {1, 2, 3}) {
    ThreadPool pool(threads);
    for (GgmlType type : kTypes) {
      const bool blocked = TypeInfo(type).block_size > 1;
      CheckAxpy(type, blocked ? 64 : 37, blocked ? Cols(type, 96) : 67, pool);
      CheckAxpy(type, 48, blocked ? Cols(type, 224) : 131, pool);  // 48: F32 down_t
    }
  }
}

// down_t built the plain way: each column of down dequantized whole, then written in down_t's
// type, row k holding column order[k].
std::vector<uint8_t> TransposedReference(const WeightView& down, const std::vector<int32_t>& order,
                                         GgmlType type) {
  const std::vector<float> df = Dequantized(down);
  const size_t row_bytes = RowBytes(type, down.rows);
  std::vector<uint8_t> out(row_bytes * down.cols);
  std::vector<float> column(down.rows);
  for (int64_t k = 0; k < down.cols; ++k) {
    for (int64_t r = 0; r < down.rows; ++r) column[r] = df[r * down.cols + order[k]];
    QuantizeWeights(*KernelsFor(type, Isa::kScalar), column.data(), out.data() + k * row_bytes,
                    down.rows);
  }
  return out;
}

// The columns in several bands per thread and a last band cut short (blocked types: 7 blocks of
// columns; the others 75 columns), the rows some thousands (a column's buffer longer than a
// page), with and without an order.
TEST_CASE("down_t is down's columns in the given order, byte for byte", "[sparse]") {
  for (int threads : {1, 2, 3}) {
    ThreadPool pool(threads);
    for (GgmlType type : kTypes) {
      // The types requantized into Q8_0 share its band logic: two threads are enough for them.
      if (FindWeightType(type)->down_t != type && threads != 2) continue;
      const bool blocked = TypeInfo(type).block_size > 1;
      for (int64_t rows : {int64_t{64}, int64_t{2112}, int64_t{48}}) {
        const int64_t cols = blocked ? Cols(type, 224) + 2 * TypeInfo(type).block_size : 75;
        const OwnedWeight down = RandomWeight(type, rows, cols, 31 + static_cast<uint32_t>(rows));
        std::vector<int32_t> order(cols);
        for (int64_t k = 0; k < cols; ++k) order[k] = static_cast<int32_t>(k);
        std::mt19937 rng(7);
        std::shuffle(order.begin(), order.end(), rng);
        const GgmlType t_type = DownTType(type, rows);
        INFO(TypeName(type) << " " << rows << "x" << cols << ", " << threads << " threads");
        absl::StatusOr<OwnedWeight> shuffled = TransposeWeight(pool, down.view, order.data());
        REQUIRE(shuffled.ok());
        REQUIRE(shuffled->view.type == t_type);
        REQUIRE(shuffled->view.rows == cols);
        REQUIRE(shuffled->view.cols == rows);
        REQUIRE(shuffled->data.size() >= RowBytes(t_type, rows) * cols);
        const std::vector<uint8_t> want = TransposedReference(down.view, order, t_type);
        REQUIRE(std::equal(want.begin(), want.end(), shuffled->data.begin()));
        std::vector<int32_t> identity(cols);
        for (int64_t k = 0; k < cols; ++k) identity[k] = static_cast<int32_t>(k);
        absl::StatusOr<OwnedWeight> plain = TransposeWeight(pool, down.view);
        REQUIRE(plain.ok());
        const std::vector<uint8_t> want_plain = TransposedReference(down.view, identity, t_type);
        REQUIRE(std::equal(want_plain.begin(), want_plain.end(), plain->data.begin()));
      }
    }
  }
}

// An input-sparse layer's column-sparse mat-vec: a projection w (out, in) transposed into
// InputSparseTType's rows, then the columns of the kept inputs summed over column slices of
// 32 (as SparseFfn's threads take them), against the scalar axpy over the same copy and
// against w restricted to the kept inputs (the copy's requantization: at most half a Q8_0
// step, amax / 254, per weight).
void CheckColumnSparse(GgmlType type, int64_t n_out, int64_t n_in, ThreadPool& pool) {
  const OwnedWeight w = RandomWeight(type, n_out, n_in, 9);
  const GgmlType t_type = InputSparseTType(w.view);
  REQUIRE(t_type == (type == GgmlType::kQ4_0 ? GgmlType::kQ8_0 : DownTType(type, n_out)));
  absl::StatusOr<OwnedWeight> wt = TransposeWeightAs(pool, w.view, t_type);
  REQUIRE(wt.ok());
  REQUIRE(wt->view.rows == n_in);
  REQUIRE(wt->view.cols == n_out);
  const std::vector<float> wf = Dequantized(w.view), tf = Dequantized(wt->view);
  // Float types transpose exactly; the others are requantized to Q8_0 along the other axis.
  const bool lossless =
      t_type == GgmlType::kF32 || t_type == GgmlType::kF16 || t_type == GgmlType::kBF16;
  std::mt19937 rng(17);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (Isa isa : AvailableIsas()) {
    for (const std::vector<int32_t>& idx : ActiveSets(n_in, 29)) {
      std::vector<float> x(idx.size());
      for (float& v : x) v = dist(rng);
      std::vector<float> out(n_out + 1, -1.0f), ref(n_out);
      for (int64_t c0 = 0; c0 < n_out; c0 += 32) {
        const int64_t cols = std::min<int64_t>(32, n_out - c0);
        std::fill_n(out.data() + c0, cols, 0.0f);
        SparseAxpyRows(isa, wt->view, c0, cols, idx.data(), x.data(), idx.size(), out.data() + c0);
      }
      SparseAxpyReference(wt->view, idx.data(), x.data(), idx.size(), ref.data());
      REQUIRE(out[n_out] == -1.0f);  // nothing written past the row
      for (int64_t o = 0; o < n_out; ++o) {
        double mag = 0, exact = 0, requant = 0;
        for (size_t j = 0; j < idx.size(); ++j) {
          mag += std::fabs(static_cast<double>(x[j]) * tf[idx[j] * n_out + o]);
          exact += static_cast<double>(x[j]) * wf[o * n_in + idx[j]];
          requant += lossless ? 0.0 : std::fabs(x[j]) / 254;
        }
        INFO(TypeName(type) << " " << IsaName(isa) << " out " << o << " kept " << idx.size());
        REQUIRE(std::fabs(out[o] - ref[o]) <= (idx.size() + 2) * 2 * kEps * mag + 1e-30);
        // |w| <= 1 here, so a Q8_0 block's amax is at most 1 (plus the file type's own error).
        REQUIRE(std::fabs(out[o] - exact) <=
                requant * 1.1 + (idx.size() + 2) * 4 * kEps * mag + 1e-6);
      }
    }
  }
}

TEST_CASE("input-sparse copies: column-sparse mat-vec equals the kept columns", "[sparse]") {
  ThreadPool pool(2);
  for (GgmlType type : kTypes) {
    if (!SparseRowsSupported(type)) continue;
    CheckColumnSparse(type, 96, Cols(type, 64), pool);
  }
  // Rows that a type's blocks do not divide: refused, not misread.
  const OwnedWeight odd = RandomWeight(GgmlType::kF32, 40, 64, 3);
  CHECK(absl::IsInvalidArgument(TransposeWeightAs(pool, odd.view, GgmlType::kQ8_0).status()));
}

// The integer column-sparse layout (column_sparse.h) of a projection w: (out, in), odd outputs.
//  - Each column read back alone through the scalar reference (one kept input of 127: its int8
//    value is 127 at scale 1) against w's dequantized column: exact for Q8_0 and Q4_0, the F16
//    rounding of d · sc (2^-11 relative) for the decoded types, half a step of amax / 127 (plus
//    the F16 scale's rounding over 127 steps) for
//    the types requantized to 8 bits.
//  - Every ISA's kernel (AVX2's for AVX2 and AVX-512, VNNI's) against the reference on slices of 64
//  outputs (as SparseFfn's threads
//    take them) added onto y, for every active set; the reference against w restricted to the
//    kept inputs, within the activations' int8 rounding (0.6 steps of the block's amax / 127)
//    and the weights' error above.
void CheckIntegerColumns(GgmlType type, int64_t n_out, int64_t n_in, ThreadPool& pool) {
  const OwnedWeight w = RandomWeight(type, n_out, n_in, 21);
  absl::StatusOr<ColumnWeight> c = ColumnWeight::Build(pool, w.view, Isa::kAvx512Vnni);
  REQUIRE(c.ok());
  INFO(TypeName(type));
  REQUIRE(c->bytes() >= ColumnWeight::BytesFor(w.view, Isa::kAvx512Vnni));
  REQUIRE(c->bytes() <= ColumnWeight::BytesFor(w.view, Isa::kAvx512Vnni) + 64);
  if (type == GgmlType::kF32 || type == GgmlType::kF16 || type == GgmlType::kBF16) {
    REQUIRE(c->form() == ColumnWeight::Form::kFloat);
    return;
  }
  const bool int4 = type == GgmlType::kQ4_0 || type == GgmlType::kQ4_1 || type == GgmlType::kQ4_K;
  REQUIRE(c->form() == (int4 ? ColumnWeight::Form::kInt4 : ColumnWeight::Form::kInt8));
  // A step reads one whole line of each row: 128 outputs of 4 bits or 64 of 8.
  REQUIRE(c->chunk() == (int4 ? 128 : 64));
  REQUIRE(c->row_bytes() % 64 == 0);
  REQUIRE(c->out_pad() % c->chunk() == 0);
  REQUIRE(c->out_pad() >= n_out);
  // Without an integer kernel (scalar only): the float form.
  REQUIRE(ColumnWeight::FormFor(w.view, Isa::kScalar) == ColumnWeight::Form::kFloat);
  const bool exact = type == GgmlType::kQ8_0 || type == GgmlType::kQ4_0;
  const bool requant =
      type == GgmlType::kQ2_K || type == GgmlType::kQ3_K || type == GgmlType::kQ6_K;
  const std::vector<float> wf = Dequantized(w.view);
  // err[o · n_in + j]: the bound on the layout's weight (o, j).
  std::vector<double> err(wf.size());
  for (int64_t o = 0; o < n_out; ++o) {
    for (int64_t b = 0; b < n_in; b += 32) {
      double amax = 0;
      for (int64_t j = b; j < b + 32; ++j)
        amax = std::max<double>(amax, std::fabs(wf[o * n_in + j]));
      for (int64_t j = b; j < b + 32; ++j) {
        err[o * n_in + j] = (exact ? 1e-6 : requant ? 0.57 / 127 : 4e-3) * amax + 1e-7;
      }
    }
  }
  ColumnInput in;
  in.Reserve(n_in);
  std::vector<float> column(n_out);
  for (int32_t j = 0; j < n_in; ++j) {
    const float v = 127.0f;
    in.Set(&j, &v, 1);
    REQUIRE(in.n_blocks() == 1);
    REQUIRE(in.begin(1) == 4);  // one entry, padded to a group of 4
    REQUIRE(in.scale(0) == 1.0f);
    REQUIRE(in.qsum(0) == 127);
    std::fill(column.begin(), column.end(), 0.0f);
    ColumnSparseAddReference(*c, in, 0, n_out, column.data());
    for (int64_t o = 0; o < n_out; ++o) {
      INFO("column " << j << " output " << o);
      REQUIRE(std::fabs(column[o] / 127.0 - wf[o * n_in + j]) <= err[o * n_in + j]);
    }
  }
  std::mt19937 rng(5);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (const std::vector<int32_t>& idx : ActiveSets(n_in, 31)) {
    std::vector<float> x(idx.size());
    for (float& v : x) v = dist(rng) + 0.01f;
    in.Set(idx.data(), x.data(), static_cast<int64_t>(idx.size()));
    std::vector<float> ref(n_out, 0.5f);
    ColumnSparseAddReference(*c, in, 0, n_out, ref.data());
    for (int64_t o = 0; o < n_out; ++o) {
      double exact_sum = 0.5, bound = 1e-5, mag = 0;
      for (size_t k = 0; k < idx.size(); ++k) {
        double amax = 0;
        for (size_t l = 0; l < idx.size(); ++l) {
          if (idx[l] / 32 == idx[k] / 32) amax = std::max<double>(amax, std::fabs(x[l]));
        }
        const double wv = wf[o * n_in + idx[k]];
        exact_sum += wv * x[k];
        bound += std::fabs(wv) * 0.6 * amax / 127 + std::fabs(x[k]) * err[o * n_in + idx[k]];
        mag += std::fabs(wv * x[k]);
      }
      INFO("output " << o << " kept " << idx.size());
      REQUIRE(std::fabs(ref[o] - exact_sum) <= bound + 1e-5 * mag);
    }
    for (Isa isa : AvailableIsas()) {
      // All outputs in one call, and in slices of one step's outputs (c->chunk()) each.
      for (const int64_t slice : {n_out, c->chunk()}) {
        std::vector<float> out(n_out + 1, 0.5f);
        out[n_out] = -1.0f;
        for (int64_t c0 = 0; c0 < n_out; c0 += slice) {
          const int64_t c1 = std::min<int64_t>(c0 + slice, n_out);
          ColumnSparseAdd(isa, *c, in, c0, c1, out.data() + c0);
        }
        REQUIRE(out[n_out] == -1.0f);  // nothing written past the slice
        for (int64_t o = 0; o < n_out; ++o) {
          double mag = 0.5;
          for (size_t k = 0; k < idx.size(); ++k) mag += std::fabs(wf[o * n_in + idx[k]] * x[k]);
          INFO(IsaName(isa) << " output " << o << " kept " << idx.size() << " slice " << slice);
          REQUIRE(std::fabs(out[o] - ref[o]) <= 1e-5 * mag);
        }
      }
    }
  }
}

TEST_CASE("input-sparse integer layout: columns and kernels against the weights", "[sparse]") {
  ThreadPool pool(2);
  for (GgmlType type : kTypes) {
    if (!SparseRowsSupported(type)) continue;
    CheckIntegerColumns(type, 200, Cols(type, 96), pool);
  }
  // Fewer outputs than one 4-bit step.
  for (GgmlType type : {GgmlType::kQ4_0, GgmlType::kQ4_K, GgmlType::kQ8_0}) {
    CheckIntegerColumns(type, 72, Cols(type, 64), pool);
  }
  for (Isa isa : {Isa::kAvx2, Isa::kAvx512Vnni}) {
    if (std::find(AvailableIsas().begin(), AvailableIsas().end(), isa) == AvailableIsas().end()) {
      WARN("this CPU has no " << IsaName(isa) << ": its integer kernel was not run");
    }
  }
  // Inputs that are not whole blocks of 32: the float form.
  const OwnedWeight odd = RandomWeight(GgmlType::kQ8_0, 64, 32, 3);
  WeightView narrow = odd.view;
  narrow.cols = 16;
  CHECK(ColumnWeight::FormFor(narrow, Isa::kAvx512Vnni) == ColumnWeight::Form::kFloat);
}

TEST_CASE("input-sparse stacked layout: q, k and v in one give the three layouts' outputs",
          "[sparse]") {
  ThreadPool pool(2);
  for (GgmlType type : {GgmlType::kQ4_0, GgmlType::kQ4_K, GgmlType::kQ8_0, GgmlType::kQ6_K}) {
    INFO(TypeName(type));
    const int64_t n_in = Cols(type, 96);
    // Sizes that leave the parts' boundaries inside a step of either form.
    const OwnedWeight a = RandomWeight(type, 200, n_in, 1), b = RandomWeight(type, 40, n_in, 2),
                      c = RandomWeight(type, 72, n_in, 3);
    const WeightView* parts[] = {&a.view, &b.view, &c.view};
    for (Isa isa : AvailableIsas()) {
      INFO(IsaName(isa));
      absl::StatusOr<ColumnWeight> stacked = ColumnWeight::BuildStacked(pool, parts, isa);
      if (ColumnWeight::FormFor(a.view, isa) == ColumnWeight::Form::kFloat) {
        REQUIRE(absl::IsFailedPrecondition(stacked.status()));
        continue;
      }
      REQUIRE(stacked.ok());
      REQUIRE(stacked->out() == 312);
      std::vector<ColumnWeight> apart;
      for (const WeightView* w : parts) apart.push_back(*ColumnWeight::Build(pool, *w, isa));
      ColumnInput in;
      in.Reserve(n_in);
      std::mt19937 rng(9);
      std::normal_distribution<float> dist(0.0f, 1.0f);
      for (const std::vector<int32_t>& idx : ActiveSets(n_in, 23)) {
        std::vector<float> x(idx.size());
        for (float& v : x) v = dist(rng);
        in.Set(idx.data(), x.data(), static_cast<int64_t>(idx.size()));
        std::vector<float> one(313, 0.25f), three(312, 0.25f);
        one[312] = -1.0f;
        ColumnSparseAdd(isa, *stacked, in, 0, 312, one.data());
        REQUIRE(one[312] == -1.0f);
        int64_t at = 0;
        for (const ColumnWeight& w : apart) {
          ColumnSparseAdd(isa, w, in, 0, w.out(), three.data() + at);
          at += w.out();
        }
        // The same integer sums and the same float steps per output: the same bits.
        for (int64_t o = 0; o < 312; ++o) {
          INFO("output " << o << " kept " << idx.size());
          REQUIRE(one[o] == three[o]);
        }
      }
    }
  }
  // Parts that differ are refused.
  ThreadPool one(1);
  const OwnedWeight a = RandomWeight(GgmlType::kQ4_0, 64, 64, 1);
  const OwnedWeight b = RandomWeight(GgmlType::kQ8_0, 64, 64, 2);
  const OwnedWeight c = RandomWeight(GgmlType::kQ4_0, 64, 96, 3);
  const WeightView* mixed[] = {&a.view, &b.view};
  const WeightView* wide[] = {&a.view, &c.view};
  CHECK(absl::IsInvalidArgument(ColumnWeight::BuildStacked(one, mixed, BestIsa()).status()));
  CHECK(absl::IsInvalidArgument(ColumnWeight::BuildStacked(one, wide, BestIsa()).status()));
}

TEST_CASE("input-sparse integer layout: kept inputs quantized per block in groups of 4",
          "[sparse]") {
  ColumnInput in;
  in.Reserve(100);
  const std::vector<int32_t> idx = {1, 2, 40, 41, 42, 43, 44, 99};
  const std::vector<float> x = {0.5f, -1.0f, 2.0f, 1.0f, -0.25f, 0.0f, 2.0f, 3.0f};
  in.Set(idx.data(), x.data(), static_cast<int64_t>(idx.size()));
  REQUIRE(in.n_blocks() == 3);
  CHECK(in.block(0) == 0);
  CHECK(in.block(1) == 1);
  CHECK(in.block(2) == 3);
  CHECK(in.begin(1) == 4);   // 2 entries + 2 of padding
  CHECK(in.begin(2) == 12);  // 5 entries + 3
  CHECK(in.begin(3) == 16);  // 1 entry + 3
  CHECK(in.scale(0) == 1.0f / 127.0f);
  CHECK(in.slot_q()[0] == 64);  // 0.5 · 127 rounded to even
  CHECK(in.slot_q()[1] == -127);
  CHECK(in.slot_q()[2] == 0);
  CHECK(in.slot_idx()[3] == 2);  // padding repeats the last kept column
  CHECK(in.qsum(0) == 64 - 127);
  CHECK(in.qsum(2) == 127);
  in.Set(idx.data(), x.data(), 0);
  CHECK(in.n_blocks() == 0);
}

TEST_CASE("input-sparse: kept inputs shared out among threads by whole blocks", "[sparse]") {
  std::mt19937 rng(7);
  for (int64_t n_in : {31, 64, 300, 2048}) {
    for (double keep : {0.0, 0.1, 0.5, 1.0}) {
      std::vector<int32_t> idx;
      for (int32_t j = 0; j < n_in; ++j) {
        if (std::uniform_real_distribution<double>(0, 1)(rng) < keep) idx.push_back(j);
      }
      const int64_t n = static_cast<int64_t>(idx.size());
      for (int parts : {1, 2, 3, 5}) {
        INFO(n_in << " inputs, " << n << " kept, " << parts << " parts");
        CHECK(ColumnSplit(idx.data(), n, 0, parts) == 0);
        CHECK(ColumnSplit(idx.data(), n, parts, parts) == n);
        for (int part = 1; part < parts; ++part) {
          const int64_t e = ColumnSplit(idx.data(), n, part, parts);
          CHECK(e >= ColumnSplit(idx.data(), n, part - 1, parts));
          CHECK(e >= n * part / parts);
          // Never inside a block, and no further from an even share than one block's entries.
          if (e > 0 && e < n) CHECK(idx[e] / kColumnBlock != idx[e - 1] / kColumnBlock);
          CHECK(e - n * part / parts < kColumnBlock);
        }
      }
    }
  }
}

TEST_CASE("interleaving gate and up refuses matrices of other shapes", "[sparse]") {
  ThreadPool pool(1);
  const OwnedWeight a = RandomWeight(GgmlType::kQ8_0, 8, 64, 1);
  const OwnedWeight c = RandomWeight(GgmlType::kQ8_0, 9, 64, 3);
  const OwnedWeight d = RandomWeight(GgmlType::kQ8_0, 8, 96, 4);
  for (const OwnedWeight* other : {&c, &d}) {
    absl::StatusOr<InterleavedGateUp> r = InterleaveGateUp(pool, a.view, other->view);
    REQUIRE(r.status().code() == absl::StatusCode::kInvalidArgument);
    REQUIRE(std::string(r.status().message()).find("keep them separate") != std::string::npos);
  }
}

// The sparse FFN lays a neuron's gate, up and down_t rows side by side, of one type (Q4_0, Q8_0,
// float models) or not (a K-quant model's down_t is Q8_0): every row where it belongs, the
// views' stride a neuron's bytes, and the operators' results over the strided views the same
// bits as over the separate matrices.
TEST_CASE("interleaving a neuron's gate, up and down_t rows keeps every row", "[sparse]") {
  ThreadPool pool(2);
  const GgmlType q4_0 = GgmlType::kQ4_0, q8_0 = GgmlType::kQ8_0, f32 = GgmlType::kF32;
  const GgmlType q4_k = GgmlType::kQ4_K, q6_k = GgmlType::kQ6_K;
  const GgmlType types[][3] = {{q4_0, q4_0, q4_0},
                               {q8_0, q8_0, q8_0},
                               {f32, f32, f32},
                               {q4_k, q4_k, q8_0},
                               {q4_k, q6_k, q8_0}};
  for (const auto& t : types) {
    INFO(TypeName(t[0]) << " " << TypeName(t[1]) << " " << TypeName(t[2]));
    const int64_t n_ff = 37, n_embd = 256;
    const OwnedWeight gate = RandomWeight(t[0], n_ff, n_embd, 11);
    const OwnedWeight up = RandomWeight(t[1], n_ff, n_embd, 12);
    const OwnedWeight down_t = RandomWeight(t[2], n_ff, n_embd, 13);  // already in slot order
    std::vector<int32_t> order(n_ff);
    for (int64_t k = 0; k < n_ff; ++k) order[k] = static_cast<int32_t>((k * 5 + 3) % n_ff);
    const absl::StatusOr<InterleavedGateUp> g =
        InterleaveGateUp(pool, gate.view, up.view, order.data(), &down_t.view);
    REQUIRE(g.ok());
    const size_t gb = RowBytes(t[0], n_embd), ub = RowBytes(t[1], n_embd);
    const size_t db = RowBytes(t[2], n_embd), stride = gb + ub + db;
    CHECK(g->storage.data.size() == n_ff * stride);
    const WeightView* views[] = {&g->gate, &g->up, &g->down_t};
    for (int i = 0; i < 3; ++i) {
      CHECK(views[i]->row_bytes == stride);
      CHECK(views[i]->rows == n_ff);
      CHECK(views[i]->cols == n_embd);
      CHECK(views[i]->type == t[i]);
    }
    for (int64_t k = 0; k < n_ff; ++k) {
      CHECK(std::memcmp(g->gate.row(k), gate.view.row(order[k]), gb) == 0);
      CHECK(std::memcmp(g->up.row(k), up.view.row(order[k]), ub) == 0);
      CHECK(std::memcmp(g->down_t.row(k), down_t.view.row(k), db) == 0);
      CHECK(g->up.row(k) == g->gate.row(k) + gb);  // one neuron, one contiguous read
      CHECK(g->down_t.row(k) == g->gate.row(k) + gb + ub);
    }
    const std::vector<int32_t> idx = {0, 4, 5, 17, 36};
    const std::vector<float> act = {0.5f, -1.25f, 2.0f, 0.75f, -0.125f};
    for (Isa isa : AvailableIsas()) {
      if (AxpyFor(t[2], isa) == nullptr) continue;
      std::vector<float> strided(n_embd, 0.0f), apart(n_embd, 0.0f);
      SparseAxpyRows(isa, g->down_t, 0, n_embd, idx.data(), act.data(), 5, strided.data());
      SparseAxpyRows(isa, down_t.view, 0, n_embd, idx.data(), act.data(), 5, apart.data());
      CHECK(strided == apart);
    }
  }
  // down_t of another shape stays apart: refused here.
  const OwnedWeight gate = RandomWeight(GgmlType::kQ4_0, 8, 64, 1);
  const OwnedWeight up = RandomWeight(GgmlType::kQ4_0, 8, 64, 2);
  const OwnedWeight short_down_t = RandomWeight(GgmlType::kQ4_0, 7, 64, 4);
  const absl::StatusOr<InterleavedGateUp> r =
      InterleaveGateUp(pool, gate.view, up.view, nullptr, &short_down_t.view);
  REQUIRE(r.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(r.status().message()).find("down_t (7x64)") != std::string::npos);
  const absl::StatusOr<InterleavedGateUp> two = InterleaveGateUp(pool, gate.view, up.view);
  REQUIRE(two.ok());
  CHECK(two->down_t.data == nullptr);
  CHECK(two->gate.row_bytes == 2 * RowBytes(GgmlType::kQ4_0, 64));
}

// Lists long enough that the operators split them over the pool's threads (a part needs tens of
// KB of weights), with the per-part accumulators of down reduced at the end.
TEST_CASE("sparse operators split long lists over threads", "[sparse]") {
  for (int threads : {2, 3}) {
    ThreadPool pool(threads);
    for (GgmlType type : kTypes) {
      // The newer types share the split logic with the others: one thread count for them.
      if (FindWeightType(type)->down_t != type && threads != 3) continue;
      CheckMatVec(type, 1024, 512, pool);
      CheckAxpy(type, 512, 1024, pool);
    }
  }
}

// Every SIMD axpy kernel against the scalar one, for 1..4 rows folded at once and odd lengths.
TEST_CASE("axpy kernels of every ISA equal the scalar kernels", "[sparse]") {
  std::mt19937 rng(31);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (GgmlType type : kTypes) {
    const bool blocked = TypeInfo(type).block_size > 1;
    const int64_t b = TypeInfo(type).block_size;
    for (int64_t n : {blocked ? b : int64_t{7}, blocked ? 3 * b : int64_t{45}, int64_t{256}}) {
      const OwnedWeight w = RandomWeight(type, kMaxAxpyRows, n, 8);
      const std::vector<float> wf = Dequantized(w.view);
      for (int k = 1; k <= kMaxAxpyRows; ++k) {
        const uint8_t* rows[kMaxAxpyRows];
        float a[kMaxAxpyRows];
        for (int r = 0; r < k; ++r) {
          rows[r] = w.view.row(r);
          a[r] = dist(rng);
        }
        std::vector<float> init(n);
        for (float& f : init) f = dist(rng);
        std::vector<float> ref = init;
        AxpyFor(type, Isa::kScalar)(n, k, a, rows, ref.data());
        for (Isa isa : AvailableIsas()) {
          std::vector<float> acc = init;
          acc.push_back(99.0f);  // a guard past the end
          AxpyFor(type, isa)(n, k, a, rows, acc.data());
          for (int64_t i = 0; i < n; ++i) {
            double mag = std::fabs(init[i]);
            for (int r = 0; r < k; ++r) mag += std::fabs(a[r] * wf[r * n + i]);
            INFO(TypeName(type) << " " << IsaName(isa) << " n " << n << " k " << k << " i " << i);
            // k + 1 roundings of the float sum, each at most ε of the magnitude (FMA or not).
            REQUIRE(std::fabs(acc[i] - ref[i]) <= (k + 1) * 2 * kEps * mag + 1e-30);
          }
          REQUIRE(acc[n] == 99.0f);
        }
      }
    }
  }
}

// Gate-first rows (sparse_ops.h) of one type on every ISA against GateFirstRowsReference: the up
// rows it reads are those whose score passes the threshold, except where a gate's dot is
// within its error bound of the threshold; its output is the reference's over the same rows
// within the bound carried from the gate and up dots (act' <= 1.2 for SiLU and GELU-tanh) plus
// the axpy's float sums; it returns the rows that fired, a subset of those read.
void CheckGateFirst(GgmlType type, FfnActivation act, int64_t n_ff, int64_t n_embd) {
  ThreadPool pool(1);
  const OwnedWeight gate = RandomWeight(type, n_ff, n_embd, 31);
  const OwnedWeight up = RandomWeight(type, n_ff, n_embd, 32);
  const OwnedWeight down = RandomWeight(type, n_embd, n_ff, 33);  // (n_embd, n_ff)
  absl::StatusOr<OwnedWeight> dt = TransposeWeight(pool, down.view);
  REQUIRE(dt.ok());
  const WeightView& down_t = dt->view;
  const std::vector<float> gf = Dequantized(gate.view), uf = Dequantized(up.view);
  const std::vector<float> tf = Dequantized(down_t);
  std::mt19937 rng(41);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> x(n_embd);
  for (float& f : x) f = dist(rng);
  std::vector<int32_t> all(n_ff);
  for (int32_t i = 0; i < n_ff; ++i) all[i] = i;
  std::vector<float> g_ref(n_ff), u_ref(n_ff);
  SparseMatVecReference(gate.view, x.data(), all.data(), n_ff, g_ref.data());
  SparseMatVecReference(up.view, x.data(), all.data(), n_ff, u_ref.data());
  // Per-slot score scales (a profile's mean |up|), and each slot's score by the reference.
  std::uniform_real_distribution<float> scale_dist(0.25f, 2.0f);
  std::vector<float> scale(n_ff);
  for (float& f : scale) f = scale_dist(rng);
  std::vector<double> bound_g(n_ff), bound_u(n_ff);
  std::vector<float> a_abs(n_ff);
  for (int64_t r = 0; r < n_ff; ++r) {
    bound_g[r] = DotBound(type, gf.data() + r * n_embd, x.data(), n_embd, gate.view.row(r));
    bound_u[r] = DotBound(type, uf.data() + r * n_embd, x.data(), n_embd, up.view.row(r));
    a_abs[r] = std::fabs(GateActivation(act, g_ref[r])) * scale[r];
  }
  std::vector<float> sorted = a_abs;
  std::sort(sorted.begin(), sorted.end());
  const float median = sorted[n_ff / 2];
  for (Isa isa : AvailableIsas()) {
    if (KernelsFor(type, isa) == nullptr) continue;
    std::vector<uint8_t> xp(PreparedBytes(type, n_embd));
    PrepareActivations(type, isa, x.data(), n_embd, xp.data());
    // Every slot, a partial list of candidates, none; thresholds: none, the median, above all.
    const std::vector<int32_t> partial = ActiveSets(n_ff, 43)[3], none;
    for (const std::vector<int32_t>* cand :
         std::vector<const std::vector<int32_t>*>{&all, &partial, &none}) {
      for (float thr : {0.0f, median, sorted.back() + 1.0f}) {
        const int64_t n = static_cast<int64_t>(cand->size());
        std::vector<int32_t> idx = *cand, up_idx(n + 1, -1);
        std::vector<float> g(n + 1), u(n + 1), out(n_embd + 1, 0.5f);
        int64_t n_up = -1;
        const int64_t m = GateFirstRows(isa, act, gate.view, xp.data(), up.view, xp.data(), down_t,
                                        idx.data(), n, thr, scale.data(), 0.0f, g.data(), u.data(),
                                        out.data(), &n_up, up_idx.data());
        INFO(TypeName(type) << " " << IsaName(isa) << " " << ActivationName(act) << " n_ff " << n_ff
                            << " candidates " << n << " threshold " << thr);
        REQUIRE(n_up >= m);
        REQUIRE(n_up <= n);
        REQUIRE(up_idx[n] == -1);  // nothing written past the list
        REQUIRE(out[n_embd] == 0.5f);
        // Which up rows it read: the reference's choice, up to gates at the threshold.
        std::vector<uint8_t> read(n_ff, 0);
        for (int64_t j = 0; j < n_up; ++j) read[up_idx[j]] = 1;
        for (int32_t s : *cand) {
          if ((read[s] != 0) != (a_abs[s] > thr)) {
            INFO("slot " << s);
            REQUIRE(std::fabs(a_abs[s] - thr) <= 1.2 * bound_g[s] * scale[s]);
          }
        }
        for (int64_t j = 0; j < m; ++j) REQUIRE(read[idx[j]] == 1);  // fired ⊆ read
        if (thr > sorted.back()) REQUIRE(n_up == 0);
        // Its output against the reference over the same up rows (threshold -1: keeps all).
        std::vector<int32_t> ref_idx(up_idx.begin(), up_idx.begin() + n_up);
        std::vector<float> ref_g(n_up + 1), ref_out(n_embd, 0.5f);
        const int64_t ref_m =
            GateFirstRowsReference(act, gate.view, up.view, down_t, x.data(), ref_idx.data(), n_up,
                                   -1.0f, nullptr, 0.0f, ref_g.data(), ref_out.data());
        REQUIRE(ref_m <= n_up);
        for (int64_t i = 0; i < n_embd; ++i) {
          double bound = 0, mag = 0.5;
          for (int64_t j = 0; j < n_up; ++j) {
            const int32_t s = up_idx[j];
            const double a = std::fabs(GateActivation(act, g_ref[s]));
            const double dv =
                1.2 * bound_g[s] * (std::fabs(u_ref[s]) + bound_u[s]) + a * bound_u[s];
            const double w = std::fabs(tf[s * n_embd + i]);
            bound += dv * w;
            mag += (a * std::fabs(u_ref[s]) + dv) * w;
          }
          bound += (n_up + 2) * 2 * kEps * mag + 1e-30;
          INFO("i " << i);
          REQUIRE(std::fabs(out[i] - ref_out[i]) <= bound);
        }
      }
    }
  }
}

TEST_CASE("gate-first rows equal the scalar reference for every type and ISA", "[sparse]") {
  for (GgmlType type : kTypes) {
    const bool blocked = TypeInfo(type).block_size > 1;
    // Odd sizes for the float types; whole blocks (down's rows are n_ff long) for the others.
    CheckGateFirst(type, FfnActivation::kSilu, blocked ? Cols(type, 64) : 67,
                   blocked ? Cols(type, 96) : 37);
    CheckGateFirst(type, FfnActivation::kSilu, blocked ? Cols(type, 131) : 131,
                   blocked ? Cols(type, 64) : 45);
  }
  CheckGateFirst(GgmlType::kQ8_0, FfnActivation::kGeluTanh, 96, 64);
  CheckGateFirst(GgmlType::kF32, FfnActivation::kGeluTanh, 53, 29);
}

}  // namespace
}  // namespace thermocline
