// Parity harness for ops/kernels.h: every computable type on every ISA this CPU has, against the
// scalar reference (to_float and from_float bit for bit; dots within a tolerance derived below),
// plus the half / bfloat16 conversions and ggml's quantizers on hand-computed examples.
#include "engine/ops/kernels.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "engine/ops/ggml_types.h"
#include "engine/ops/kernels_internal.h"
#include "engine/ops/row_dot.h"
#include "engine/ops/type_table.h"
#include "quant_test_util.h"

namespace thermocline {
namespace {

constexpr double kEps = std::numeric_limits<float>::epsilon();
const std::vector<GgmlType> kTypes = testing::WeightTypes();
using testing::IsQuantized;

// Sizes not a multiple of the kernels' unrolling: odd numbers of blocks, one block, and rows of
// several panel groups (32-element types) or super-blocks.
std::vector<int64_t> Sizes(GgmlType type) {
  if (TypeInfo(type).block_size == kQK_K) return {256, 512, 768, 1280, 2304};
  if (IsQuantized(type)) return {32, 64, 96, 160, 544, 4064};
  return {1, 7, 31, 33, 100, 257, 4097};
}

std::vector<float> RandomFloats(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& f : v) f = dist(rng) * (1.0f + 3.0f * (rng() % 8 == 0));  // some outliers
  return v;
}

// Rows of `type` made from random floats with the reference quantizer.
std::vector<uint8_t> RandomRow(GgmlType type, int64_t n, uint32_t seed) {
  std::vector<uint8_t> row(RowBytes(type, n));
  KernelsFor(type, Isa::kScalar)->from_float(RandomFloats(n, seed).data(), row.data(), n);
  return row;
}

std::string Label(GgmlType type, Isa isa, int64_t n) {
  return std::string(TypeName(type)) + " " + IsaName(isa) + " n=" + std::to_string(n);
}

// How far a SIMD dot may be from the reference (which sums in double, so it is near exact).
double DotTolerance(GgmlType type, int64_t n, const void* w, const void* x) {
  if (IsQuantized(type)) return testing::QuantDotTolerance(type, n, w, x);
  // The kernels sum in >= 8 float lanes with a few accumulators and a final tree, so every
  // partial sum goes through at most n / 8 + 32 roundings, each at most eps times a magnitude
  // bounded by sum |w_i x_i|.
  const TypeKernels& ref = *KernelsFor(type, Isa::kScalar);
  std::vector<float> wf(static_cast<size_t>(n)), xf(static_cast<size_t>(n));
  ref.to_float(w, wf.data(), n);
  KernelsFor(ref.vec_dot_type, Isa::kScalar)->to_float(x, xf.data(), n);
  double abs_sum = 0.0;
  for (int64_t i = 0; i < n; ++i) abs_sum += std::fabs(double{wf[i]} * xf[i]);
  return (static_cast<double>(n) / 8 + 32) * kEps * abs_sum;
}

TEST_CASE("AvailableIsas starts with scalar and has a table for every type", "[kernels]") {
  const std::vector<Isa>& isas = AvailableIsas();
  REQUIRE(!isas.empty());
  CHECK(isas.front() == Isa::kScalar);
  CHECK(BestIsa() == isas.back());
  for (Isa isa : isas) {
    for (GgmlType type : kTypes) {
      INFO(Label(type, isa, 0));
      const TypeKernels* k = KernelsFor(type, isa);
      REQUIRE(k != nullptr);
      const ActivationFormat act = FindWeightType(type)->activations;
      CHECK(k->vec_dot_type == (act == ActivationFormat::kF32    ? GgmlType::kF32
                                : act == ActivationFormat::kQ8_0 ? GgmlType::kQ8_0
                                : act == ActivationFormat::kQ8_1 ? GgmlType::kQ8_1
                                                                 : GgmlType::kQ8_K));
      CHECK(AxpyFor(type, isa) != nullptr);
      if (isa != Isa::kScalar && IsQuantized(type)) {
        // Every SIMD ISA has panels, and a gemm but for the super-block types and Q4_1/Q5_1
        // (Q8_1 activations), whose prefill runs their row dots in ggml's order
        // (kernels_simd.inc's SuperEntry and GgmlMinDot).
        CHECK(ops_internal::QuantDotFor(type, isa) != nullptr);
        const bool row_prefill = act == ActivationFormat::kQ8_K || act == ActivationFormat::kQ8_1;
        CHECK((ops_internal::GemmFor(type, isa) != nullptr) == !row_prefill);
      }
    }
  }
  CHECK(KernelsFor(GgmlType::kIQ2_XXS) == nullptr);
  CHECK(FindWeightType(GgmlType::kQ8_K) == nullptr);  // activations only
  if (isas.size() == 1) WARN("only the scalar kernels run on this CPU: SIMD parity not tested");
}

// Overwrites the first blocks of a quantized row with the quantizers' corner cases: all zero,
// all -0, the largest magnitude twice with opposite signs (the first one sets d's sign), and
// values near 1e-30 (tiny, yet 1 / d stays finite). The random values stay within 4.
void SpecialBlocks(std::vector<float>* src) {
  const int64_t blocks = static_cast<int64_t>(src->size()) / 32;
  for (int64_t b = 0; b < std::min<int64_t>(blocks, 5); ++b) {
    float* x = src->data() + b * 32;
    switch (b) {
      case 0:
        std::fill_n(x, 32, 0.0f);
        break;
      case 1:
        std::fill_n(x, 32, -0.0f);
        break;
      case 2:
        x[5] = 6.5f;
        x[20] = -6.5f;
        break;
      case 3:
        x[3] = -6.5f;
        x[30] = 6.5f;
        break;
      default:
        for (int j = 0; j < 32; ++j) x[j] *= 1e-30f;
        break;
    }
  }
}

TEST_CASE("to_float and from_float match the reference bit for bit", "[kernels]") {
  for (GgmlType type : kTypes) {
    const TypeKernels& ref = *KernelsFor(type, Isa::kScalar);
    for (int64_t n : Sizes(type)) {
      std::vector<float> src = RandomFloats(n, 7 + static_cast<uint32_t>(n));
      if (!IsQuantized(type)) {  // edge values for the float rounding paths
        const float special[] = {
            0.0f,     -0.0f, INFINITY,      -INFINITY,         NAN,        1e-8f, 6e-8f, 65504.0f,
            65520.0f, 1e30f, 1.0009765625f, 3.0517578125e-05f, 1.00390625f};
        for (size_t i = 0; i < sizeof(special) / sizeof(special[0]) && i < src.size(); ++i) {
          src[i * 3 % src.size()] = special[i];
        }
      } else {
        SpecialBlocks(&src);
      }
      std::vector<uint8_t> want(RowBytes(type, n)), got(want.size());
      std::vector<float> want_f(static_cast<size_t>(n)), got_f(want_f.size());
      ref.from_float(src.data(), want.data(), n);
      ref.to_float(want.data(), want_f.data(), n);
      for (Isa isa : AvailableIsas()) {
        INFO(Label(type, isa, n));
        const TypeKernels& k = *KernelsFor(type, isa);
        k.from_float(src.data(), got.data(), n);
        CHECK(std::memcmp(want.data(), got.data(), want.size()) == 0);
        k.to_float(want.data(), got_f.data(), n);
        CHECK(std::memcmp(want_f.data(), got_f.data(), want_f.size() * sizeof(float)) == 0);
      }
    }
  }
}

TEST_CASE("vec_dot and vec_dot_multi match the reference", "[kernels]") {
  for (GgmlType type : kTypes) {
    const TypeKernels& ref = *KernelsFor(type, Isa::kScalar);
    for (int64_t n : Sizes(type)) {
      const std::vector<uint8_t> w = RandomRow(type, n, 100 + static_cast<uint32_t>(n));
      // 8 activation rows, with a stride larger than a row to catch stride mix-ups.
      const size_t x_bytes = RowBytes(ref.vec_dot_type, n);
      const int64_t x_stride = static_cast<int64_t>(x_bytes + 64);
      std::vector<uint8_t> x(static_cast<size_t>(8 * x_stride));
      for (int j = 0; j < 8; ++j) {
        const std::vector<uint8_t> row = RandomRow(ref.vec_dot_type, n, 200 + j);
        std::memcpy(x.data() + j * x_stride, row.data(), x_bytes);
      }
      float want[8];
      double tol[8];
      for (int j = 0; j < 8; ++j) {
        want[j] = ref.vec_dot(n, w.data(), x.data() + j * x_stride);
        tol[j] = DotTolerance(type, n, w.data(), x.data() + j * x_stride);
      }
      for (Isa isa : AvailableIsas()) {
        INFO(Label(type, isa, n));
        const TypeKernels& k = *KernelsFor(type, isa);
        CHECK(std::fabs(k.vec_dot(n, w.data(), x.data()) - want[0]) <= tol[0]);
        for (int rows = 1; rows <= 8; ++rows) {
          float got[8];
          k.vec_dot_multi(n, w.data(), x.data(), x_stride, rows, got);
          for (int j = 0; j < rows; ++j) {
            INFO("k=" << rows << " row " << j << ": " << got[j] << " vs " << want[j]);
            CHECK(std::fabs(got[j] - want[j]) <= tol[j]);
          }
        }
      }
    }
  }
}

TEST_CASE("RowDot::DotRows matches the reference for every row it is given", "[kernels]") {
  for (GgmlType type : kTypes) {
    const TypeKernels& ref = *KernelsFor(type, Isa::kScalar);
    for (int64_t n : Sizes(type)) {
      // Rows in separate buffers (a sparse layer's active rows lie anywhere).
      std::vector<std::vector<uint8_t>> rows;
      for (int r = 0; r < RowDot::kMaxRows; ++r) {
        rows.push_back(RandomRow(type, n, 300 + static_cast<uint32_t>(n) + r));
      }
      const std::vector<float> x = RandomFloats(n, 400 + static_cast<uint32_t>(n));
      std::vector<uint8_t> xq(RowBytes(ref.vec_dot_type, n));
      KernelsFor(ref.vec_dot_type, Isa::kScalar)->from_float(x.data(), xq.data(), n);
      for (Isa isa : AvailableIsas()) {
        const RowDot dot(type, isa);
        REQUIRE(dot.ok());
        std::vector<uint8_t> prepared(RowDot::PreparedBytes(type, n) + 64);
        dot.Prepare(x.data(), n, prepared.data());
        for (int k = 1; k <= RowDot::kMaxRows; ++k) {
          const void* ptrs[RowDot::kMaxRows];
          for (int r = 0; r < k; ++r) ptrs[r] = rows[(r + k) % RowDot::kMaxRows].data();
          float got[RowDot::kMaxRows + 1];
          got[k] = 99.0f;  // a guard past the k outputs
          dot.DotRows(n, ptrs, k, prepared.data(), got);
          for (int r = 0; r < k; ++r) {
            const float want = ref.vec_dot(n, ptrs[r], xq.data());
            INFO(Label(type, isa, n)
                 << " k=" << k << " row " << r << ": " << got[r] << " vs " << want);
            CHECK(std::fabs(got[r] - want) <= DotTolerance(type, n, ptrs[r], xq.data()));
            // One row at a time through Dot: the same value up to summation order.
            CHECK(std::fabs(got[r] - dot.Dot(n, ptrs[r], prepared.data())) <=
                  2 * DotTolerance(type, n, ptrs[r], xq.data()));
          }
          CHECK(got[k] == 99.0f);
        }
      }
    }
  }
}

TEST_CASE("AttendHead of every ISA matches the scalar reference", "[kernels]") {
  // q_scale 40 spreads the scores over a range wide enough that most probabilities underflow:
  // the vector exp's clamped and far ranges.
  for (float q_scale : {1.0f, 40.0f}) {
    for (int64_t head_dim : {8, 17, 64, 80, 128, 200}) {
      for (int64_t n_kv : {1, 5, 33, 300}) {
        // Rows further apart than head_dim, as in a KV cache with several KV heads.
        const int64_t k_stride = head_dim + 3, v_stride = head_dim + 5;
        std::vector<float> q = RandomFloats(head_dim, 500 + static_cast<uint32_t>(head_dim));
        for (float& e : q) e *= q_scale;
        const std::vector<float> k =
            RandomFloats(n_kv * k_stride, 600 + static_cast<uint32_t>(n_kv));
        const std::vector<float> v =
            RandomFloats(n_kv * v_stride, 700 + static_cast<uint32_t>(n_kv));
        const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
        std::vector<float> scores(n_kv), want(head_dim);
        AttendHead(Isa::kScalar, n_kv, head_dim, q.data(), k.data(), k_stride, v.data(), v_stride,
                   scale, scores.data(), want.data());
        // A convex combination of the v rows: within the range of column i.
        for (int64_t i = 0; i < head_dim; ++i) {
          double lo = 1e30, hi = -1e30;
          for (int64_t j = 0; j < n_kv; ++j) {
            lo = std::min(lo, double{v[j * v_stride + i]});
            hi = std::max(hi, double{v[j * v_stride + i]});
          }
          REQUIRE(want[i] >= lo - 1e-5);
          REQUIRE(want[i] <= hi + 1e-5);
        }
        for (Isa isa : AvailableIsas()) {
          std::vector<float> got(head_dim + 1, 0.0f);
          got[head_dim] = 99.0f;  // a guard past the head
          AttendHead(isa, n_kv, head_dim, q.data(), k.data(), k_stride, v.data(), v_stride, scale,
                     scores.data(), got.data());
          for (int64_t i = 0; i < head_dim; ++i) {
            INFO(IsaName(isa) << " q_scale " << q_scale << " head_dim " << head_dim << " n_kv "
                              << n_kv << " i " << i);
            // Float scores (the reference sums them in double) move the weights by a few ulp.
            CHECK(std::fabs(got[i] - want[i]) <= 1e-5 * (1 + std::fabs(want[i])));
          }
          CHECK(got[head_dim] == 99.0f);
        }
      }
    }
  }
}

TEST_CASE("AttendHead of every ISA returns NaN for a NaN score, as the reference does",
          "[kernels]") {
  // A broken KV cache must show in the output, not vanish into a zero weight.
  const int64_t head_dim = 64, n_kv = 40;
  const std::vector<float> q = RandomFloats(head_dim, 11);
  std::vector<float> k = RandomFloats(n_kv * head_dim, 12);
  const std::vector<float> v = RandomFloats(n_kv * head_dim, 13);
  for (int64_t bad : {int64_t{3}, n_kv - 1}) {  // a position in a full vector, one in the tail
    std::vector<float> kb = k;
    kb[bad * head_dim + 5] = std::numeric_limits<float>::quiet_NaN();
    for (Isa isa : AvailableIsas()) {
      std::vector<float> scores(n_kv), out(head_dim, 0.0f);
      AttendHead(isa, n_kv, head_dim, q.data(), kb.data(), head_dim, v.data(), head_dim, 0.125f,
                 scores.data(), out.data());
      INFO(IsaName(isa) << " NaN at position " << bad);
      for (float o : out) CHECK(std::isnan(o));
    }
  }
}

// The F16 kernels compute as llama.cpp does, operation for operation (kernels.h), so every ISA
// gives the scalar reference's bits; that reference is within the half roundings of the float
// kernel. n_kv 33, 64, 100: ggml's single-token dot of V over positions padded to 32 takes whole
// 64s in vector lanes and the rest in double; 80 and 215 leave 16 and 23 positions past the
// whole 64s, and 16 positions take the scores' last sums together (ReduceAddEach).
TEST_CASE("AttendHeadF16 of every ISA equals the scalar reference and is near the float kernel",
          "[kernels]") {
  for (bool batched : {false, true}) {
    for (int64_t head_dim : {8, 17, 64, 128, 200}) {
      for (int64_t n_kv : {1, 5, 16, 33, 64, 80, 100, 215, 300}) {
        const int64_t k_stride = head_dim + 3, v_stride = head_dim + 5;
        std::vector<float> q = RandomFloats(head_dim, 800 + static_cast<uint32_t>(head_dim));
        for (float& e : q) e *= 4.0f;
        std::vector<float> k = RandomFloats(n_kv * k_stride, 900 + static_cast<uint32_t>(n_kv));
        std::vector<float> v = RandomFloats(n_kv * v_stride, 950 + static_cast<uint32_t>(n_kv));
        std::vector<uint16_t> kh(k.size()), vh(v.size());
        for (size_t i = 0; i < k.size(); ++i) kh[i] = FloatToHalf(k[i]);
        for (size_t i = 0; i < v.size(); ++i) vh[i] = FloatToHalf(v[i]);
        // The same rows as floats, and q rounded as the F16 kernel rounds it.
        for (size_t i = 0; i < k.size(); ++i) k[i] = HalfToFloat(kh[i]);
        for (size_t i = 0; i < v.size(); ++i) v[i] = HalfToFloat(vh[i]);
        std::vector<float> qh = q;
        for (float& e : qh) e = HalfToFloat(FloatToHalf(e));
        float v_max = 0;
        for (float e : v) v_max = std::max(v_max, std::fabs(e));
        const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
        std::vector<float> scores(n_kv), want(head_dim), exact(head_dim);
        AttendHeadF16(Isa::kScalar, n_kv, head_dim, head_dim, q.data(), kh.data(), k_stride,
                      vh.data(), v_stride, scale, 0.0f, batched, scores.data(), want.data());
        AttendHead(Isa::kScalar, n_kv, head_dim, qh.data(), k.data(), k_stride, v.data(), v_stride,
                   scale, scores.data(), exact.data());
        for (int64_t i = 0; i < head_dim; ++i) {
          INFO("batched " << batched << " head_dim " << head_dim << " n_kv " << n_kv << " i " << i);
          // The weights' rounding to half: each moves by at most half's unit roundoff, 2^-11 of
          // itself, and they sum to 1, so the output by at most 2^-11 of the largest |v|; ggml's
          // exp (1.5 ulp) and float sums add a few float ulps.
          CHECK(std::fabs(want[i] - exact[i]) <= 0x1p-11f * v_max + 1e-5f);
        }
        for (Isa isa : AvailableIsas()) {
          std::vector<float> got(head_dim + 1, 0.0f);
          got[head_dim] = 99.0f;
          AttendHeadF16(isa, n_kv, head_dim, head_dim, q.data(), kh.data(), k_stride, vh.data(),
                        v_stride, scale, 0.0f, batched, scores.data(), got.data());
          for (int64_t i = 0; i < head_dim; ++i) {
            INFO(IsaName(isa) << " batched " << batched << " head_dim " << head_dim << " n_kv "
                              << n_kv << " i " << i);
            CHECK(got[i] == want[i]);
          }
          CHECK(got[head_dim] == 99.0f);
        }
      }
    }
  }
}

// The heads of a KV group taken together (four at a time, the rest in a smaller block; the
// values' columns in slices of 64, v_dim 72 and 200 ending in a partial one) give each head
// AttendHeadF16's bits; the outputs between the heads' rows stay untouched. A soft cap takes the
// scores' scalar road.
TEST_CASE("AttendGroupF16 of every ISA gives each head the scalar AttendHeadF16", "[kernels]") {
  struct Dims {
    int64_t k_dim, v_dim;
  };
  for (const Dims d : {Dims{17, 17}, Dims{64, 64}, Dims{128, 128}, Dims{192, 192}, Dims{256, 256},
                       Dims{80, 80}, Dims{200, 200}, Dims{64, 40}, Dims{40, 72}}) {
    for (int n_heads : {1, 2, 3, 4, 5, 8, 9}) {
      for (int64_t n_kv : {1, 16, 33, 80, 215}) {
        for (bool batched : {false, true}) {
          for (float softcap : {0.0f, 2.0f}) {
            const int64_t k_stride = d.k_dim + 3, v_stride = d.v_dim + 5;
            const int64_t q_stride = d.k_dim + 1, out_stride = d.v_dim + 2;
            const uint32_t seed = static_cast<uint32_t>(d.k_dim * 7 + d.v_dim + n_kv);
            std::vector<float> q = RandomFloats(n_heads * q_stride, 300 + seed);
            for (float& e : q) e *= 4.0f;
            std::vector<uint16_t> kh(n_kv * k_stride), vh(n_kv * v_stride);
            std::vector<float> k = RandomFloats(kh.size(), 400 + seed);
            std::vector<float> v = RandomFloats(vh.size(), 500 + seed);
            for (size_t i = 0; i < kh.size(); ++i) kh[i] = FloatToHalf(k[i]);
            for (size_t i = 0; i < vh.size(); ++i) vh[i] = FloatToHalf(v[i]);
            const float scale = 1.0f / std::sqrt(static_cast<float>(d.k_dim));
            std::vector<float> want(n_heads * out_stride, 99.0f), scores(n_heads * n_kv);
            for (int h = 0; h < n_heads; ++h) {
              AttendHeadF16(Isa::kScalar, n_kv, d.k_dim, d.v_dim, q.data() + h * q_stride,
                            kh.data(), k_stride, vh.data(), v_stride, scale, softcap, batched,
                            scores.data(), want.data() + h * out_stride);
            }
            for (Isa isa : AvailableIsas()) {
              std::vector<float> got(n_heads * out_stride, 99.0f);
              AttendGroupF16(isa, n_kv, d.k_dim, d.v_dim, n_heads, q.data(), q_stride,
                             HalfRows::Strided(kh.data(), k_stride),
                             HalfRows::Strided(vh.data(), v_stride), scale, softcap, batched,
                             scores.data(), got.data(), out_stride);
              int64_t differ = 0;
              for (size_t i = 0; i < got.size(); ++i) differ += got[i] != want[i];
              INFO(IsaName(isa) << " k_dim " << d.k_dim << " v_dim " << d.v_dim << " heads "
                                << n_heads << " n_kv " << n_kv << " batched " << batched
                                << " softcap " << softcap);
              CHECK(differ == 0);
            }
          }
        }
      }
    }
  }
}

// Rows in tiles, as the session's F16 cache holds them (each head's rows of a tile together,
// the other heads' tiles between): each ISA gives the same bits as over the same rows at one
// stride (which the test above checks against the scalar reference), from any first position,
// and reads nothing outside the rows (the gaps hold NaNs, which would reach the output). 288
// wide: past the group kernel's longest head, the per-head kernel's road.
TEST_CASE("AttendGroupF16 over rows in tiles equals the same rows at one stride", "[kernels]") {
  struct Dims {
    int64_t k_dim, v_dim;
  };
  constexpr uint16_t kNaN = 0x7E00;
  for (const Dims d :
       {Dims{64, 64}, Dims{40, 72}, Dims{128, 128}, Dims{256, 256}, Dims{288, 288}}) {
    for (int tile_shift : {0, 2, 4, 8}) {
      for (int64_t first : {0, 3, 17}) {
        for (int64_t n_kv : {1, 33, 80, 215}) {
          for (bool batched : {false, true}) {
            const int n_heads = 4;
            const int64_t tile = int64_t{1} << tile_shift;
            const uint32_t seed = static_cast<uint32_t>(d.k_dim + n_kv * 3 + first + tile_shift);
            std::vector<float> q = RandomFloats(n_heads * d.k_dim, 600 + seed);
            for (float& e : q) e *= 4.0f;
            // Tiles of three heads' rows (this head is the second), rows padded by one half.
            auto tiled = [&](int64_t dim, uint32_t rng_seed, std::vector<uint16_t>* rows,
                             std::vector<uint16_t>* strided) {
              const int64_t row_stride = dim + 1, tile_stride = 3 * tile * row_stride;
              const int64_t tiles = (first + n_kv + tile - 1) / tile;
              rows->assign(tiles * tile_stride, kNaN);
              strided->assign(n_kv * dim, 0);
              std::vector<float> x = RandomFloats(n_kv * dim, rng_seed);
              const HalfRows r = {rows->data() + tile * row_stride, row_stride, tile_stride, first,
                                  tile_shift};
              for (int64_t j = 0; j < n_kv; ++j) {
                uint16_t* row = rows->data() + (r.Row(j) - rows->data());
                for (int64_t c = 0; c < dim; ++c) {
                  row[c] = (*strided)[j * dim + c] = FloatToHalf(x[j * dim + c]);
                }
              }
              return r;
            };
            std::vector<uint16_t> kt, ks, vt, vs;
            const HalfRows k_rows = tiled(d.k_dim, 700 + seed, &kt, &ks);
            const HalfRows v_rows = tiled(d.v_dim, 800 + seed, &vt, &vs);
            const float scale = 1.0f / std::sqrt(static_cast<float>(d.k_dim));
            std::vector<float> scores(n_heads * n_kv);
            for (Isa isa : AvailableIsas()) {
              std::vector<float> want(n_heads * d.v_dim), got(n_heads * d.v_dim, 99.0f);
              AttendGroupF16(isa, n_kv, d.k_dim, d.v_dim, n_heads, q.data(), d.k_dim,
                             HalfRows::Strided(ks.data(), d.k_dim),
                             HalfRows::Strided(vs.data(), d.v_dim), scale, 0.0f, batched,
                             scores.data(), want.data(), d.v_dim);
              AttendGroupF16(isa, n_kv, d.k_dim, d.v_dim, n_heads, q.data(), d.k_dim, k_rows,
                             v_rows, scale, 0.0f, batched, scores.data(), got.data(), d.v_dim);
              int64_t differ = 0;
              for (size_t i = 0; i < got.size(); ++i) differ += got[i] != want[i];
              INFO(IsaName(isa) << " k_dim " << d.k_dim << " v_dim " << d.v_dim << " tile " << tile
                                << " first " << first << " n_kv " << n_kv << " batched "
                                << batched);
              CHECK(differ == 0);
            }
          }
        }
      }
    }
  }
}

TEST_CASE("HalfToFloat and FloatToHalf round trip every half", "[kernels]") {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = HalfToFloat(static_cast<uint16_t>(h));
    const bool nan = (h & 0x7C00) == 0x7C00 && (h & 0x3FF) != 0;
    if (nan) {
      REQUIRE(std::isnan(f));
      REQUIRE(FloatToHalf(f) == (h | 0x200));  // NaNs come back quiet, payload kept
    } else {
      REQUIRE(FloatToHalf(f) == h);
    }
  }
}

TEST_CASE("FloatToHalf rounds to nearest even", "[kernels]") {
  // Every tie between two consecutive positive finite halves goes to the even one; just above
  // or below a tie goes to the nearer one. Covers subnormals, the normal range and overflow.
  for (uint32_t h = 0; h < 0x7C00; ++h) {
    const double lo = HalfToFloat(static_cast<uint16_t>(h));
    const double hi = h + 1 == 0x7C00 ? 65536.0 : HalfToFloat(static_cast<uint16_t>(h + 1));
    const float mid = static_cast<float>((lo + hi) / 2);  // exact in float
    REQUIRE(FloatToHalf(mid) == ((h & 1) ? h + 1 : h));
    REQUIRE(FloatToHalf(std::nextafter(mid, 0.0f)) == h);
    REQUIRE(FloatToHalf(std::nextafter(mid, INFINITY)) == h + 1);
    REQUIRE(FloatToHalf(-mid) == (0x8000 | ((h & 1) ? h + 1 : h)));
  }
  CHECK(FloatToHalf(1.0f) == 0x3C00);
  CHECK(FloatToHalf(65504.0f) == 0x7BFF);
  CHECK(FloatToHalf(65519.0f) == 0x7BFF);
  CHECK(FloatToHalf(65520.0f) == 0x7C00);  // rounds up to infinity
  CHECK(FloatToHalf(1e10f) == 0x7C00);
  CHECK(FloatToHalf(-INFINITY) == 0xFC00);
  CHECK(FloatToHalf(-0.0f) == 0x8000);
  CHECK(FloatToHalf(std::ldexp(1.0f, -24)) == 0x0001);  // smallest subnormal
  CHECK(FloatToHalf(std::ldexp(1.0f, -25)) == 0x0000);  // tie with zero: even
  CHECK(FloatToHalf(std::ldexp(3.0f, -25)) == 0x0002);  // 1.5 ulp: tie, even
  CHECK(FloatToHalf(std::ldexp(1.0f, -14)) == 0x0400);  // smallest normal
  CHECK(FloatToHalf(std::nanf("")) == 0x7E00);
  CHECK(HalfToFloat(0x7BFF) == 65504.0f);
  CHECK(HalfToFloat(0x0001) == std::ldexp(1.0f, -24));
  CHECK(std::isinf(HalfToFloat(0x7C00)));
}

TEST_CASE("FloatToBf16 rounds to nearest even and keeps NaN quiet", "[kernels]") {
  CHECK(FloatToBf16(1.0f) == 0x3F80);
  CHECK(FloatToBf16(1.0f + std::ldexp(1.0f, -8)) == 0x3F80);      // tie: even (down)
  CHECK(FloatToBf16(1.0f + 3 * std::ldexp(1.0f, -8)) == 0x3F82);  // tie: even (up)
  CHECK(FloatToBf16(std::nextafter(1.0f + std::ldexp(1.0f, -8), 2.0f)) == 0x3F81);
  CHECK(FloatToBf16(-2.0f) == 0xC000);
  CHECK(FloatToBf16(std::numeric_limits<float>::max()) == 0x7F80);  // rounds to infinity
  CHECK(FloatToBf16(INFINITY) == 0x7F80);
  uint32_t snan_bits = 0x7F800001;  // signalling NaN: rounding must not turn it into infinity
  float snan;
  std::memcpy(&snan, &snan_bits, 4);
  CHECK(FloatToBf16(snan) == 0x7FC0);
  for (uint32_t h = 0; h < 65536; ++h) {  // every bfloat16 survives the round trip
    if ((h & 0x7F80) == 0x7F80 && (h & 0x7F) != 0) continue;  // NaN: quieted
    REQUIRE(FloatToBf16(Bf16ToFloat(static_cast<uint16_t>(h))) == h);
  }
}

TEST_CASE("Q4_0 quantization matches ggml's reference on known blocks", "[kernels]") {
  for (Isa isa : AvailableIsas()) {  // the SIMD quantizers are checked here too
    INFO(IsaName(isa));
    const TypeKernels& q4 = *KernelsFor(GgmlType::kQ4_0, isa);
    float x[32];
    BlockQ4_0 b;
    // Values -8..7 twice: the first -8 has the largest magnitude, d = -8 / -8 = 1, and
    // q = (int)(x / d + 8.5) = x + 8, so byte j holds q(j) | q(j + 16) << 4 = j | j << 4.
    for (int j = 0; j < 32; ++j) x[j] = static_cast<float>(j % 16 - 8);
    q4.from_float(x, &b, 32);
    CHECK(b.d == 0x3C00);
    for (int j = 0; j < 16; ++j) CHECK(b.qs[j] == (j | j << 4));
    // x = j - 16: max = -16, d = 2, id = 0.5, q = (int)(j / 2 + 0.5) = (j + 1) / 2, capped at 15.
    for (int j = 0; j < 32; ++j) x[j] = static_cast<float>(j - 16);
    q4.from_float(x, &b, 32);
    CHECK(b.d == 0x4000);
    for (int j = 0; j < 16; ++j) CHECK(b.qs[j] == ((j + 1) / 2 | std::min(15, (j + 17) / 2) << 4));
    // Negated: max = +16, d = -2 and the same quants.
    for (int j = 0; j < 32; ++j) x[j] = static_cast<float>(16 - j);
    q4.from_float(x, &b, 32);
    CHECK(b.d == 0xC000);
    CHECK(b.qs[0] == (0 | 8 << 4));
    // All zero: d = 0 / -8 = -0 (fp16 0x8000), id = 0, q = (int)8.5 = 8.
    for (float& v : x) v = 0.0f;
    q4.from_float(x, &b, 32);
    CHECK(b.d == 0x8000);
    for (int j = 0; j < 16; ++j) CHECK(b.qs[j] == 0x88);
  }
}

// The reference rounds x · id before adding 8.5; an FMA rounds once. Requantizing dequantized
// Q4_0 values (as TransposeWeight does) lands exactly where that matters: with max = -24 (d = 3,
// id = fl(1/3), a little over 1/3), x = 3 · (q - 8.5) gives x · id just below q - 8.5, rounded
// to it, so the reference's quant is q; fused, x · id + 8.5 stays below q and truncates to q - 1.
TEST_CASE("the Q4_0 quantizers round the product before adding 8.5", "[kernels]") {
  float x[32] = {-24.0f};
  for (int q = 1; q <= 8; ++q) x[q] = 3.0f * (static_cast<float>(q) - 8.5f);
  BlockQ4_0 want, got;
  KernelsFor(GgmlType::kQ4_0, Isa::kScalar)->from_float(x, &want, 32);
  CHECK(want.d == 0x4200);  // 3
  for (int q = 0; q <= 8; ++q) CHECK((want.qs[q] & 0xF) == q);
  CHECK(std::fmaf(x[1], 1.0f / 3.0f, 8.5f) < 1.0f);  // what an FMA would truncate to 0
  for (Isa isa : AvailableIsas()) {
    INFO(IsaName(isa));
    KernelsFor(GgmlType::kQ4_0, isa)->from_float(x, &got, 32);
    CHECK(std::memcmp(&want, &got, sizeof(want)) == 0);
  }
}

// Weights round as ggml's quantize_row_q8_0_ref (what llama-quantize writes): x · (1 / d), halves
// away from zero. Activations as ggml's x86 quantize_row_q8_0 (what llama.cpp computes with):
// x · (127 / amax), halves to even.
TEST_CASE("Q8_0 quantization matches ggml's reference on known blocks", "[kernels]") {
  for (Isa isa : AvailableIsas()) {  // the SIMD quantizers are checked here too
    INFO(IsaName(isa));
    const TypeKernels& q8 = *KernelsFor(GgmlType::kQ8_0, isa);
    float x[32] = {127.0f, 2.5f, 0.5f, -0.5f, -1.5f, 1.5f, -2.5f, 0.49999997f, -126.6f};
    // amax = 127: d = 1, id = 1, so each quant is x rounded.
    BlockQ8_0 b;
    QuantizeWeights(q8, x, &b, 32);
    CHECK(b.d == 0x3C00);
    const int want_weights[9] = {127, 3, 1, -1, -2, 2, -3, 0, -127};
    for (int j = 0; j < 9; ++j) CHECK(b.qs[j] == want_weights[j]);
    for (int j = 9; j < 32; ++j) CHECK(b.qs[j] == 0);
    q8.from_float(x, &b, 32);
    CHECK(b.d == 0x3C00);
    const int want_activations[9] = {127, 2, 0, 0, -2, 2, -2, 0, -127};
    for (int j = 0; j < 9; ++j) CHECK(b.qs[j] == want_activations[j]);
    for (int j = 9; j < 32; ++j) CHECK(b.qs[j] == 0);
    // amax = 254: d = 2, id = 0.5 either way; 5 · 0.5 = 2.5 -> 3 (weights) or 2 (activations);
    // fp16(2) = 0x4000.
    for (float& v : x) v = 5.0f;
    x[31] = -254.0f;
    QuantizeWeights(q8, x, &b, 32);
    CHECK(b.d == 0x4000);
    CHECK(b.qs[0] == 3);
    CHECK(b.qs[31] == -127);
    q8.from_float(x, &b, 32);
    CHECK(b.d == 0x4000);
    CHECK(b.qs[0] == 2);
    CHECK(b.qs[31] == -127);
  }
}

// The two differ only in the last rounding: 127 / amax and 1 / (amax / 127) are often a rounding
// apart, so a product can fall on either side of a half. The test finds such an amax and an x
// between the two ids' half-way points, and checks that each quantizer takes its own id.
TEST_CASE("Q8_0 activations take 127 / amax, weights 1 / d", "[kernels]") {
  float amax = 100.0f, id_act = 0, id_ref = 0;
  for (int k = 0; k < 1000; ++k, amax = std::nextafter(amax, 1e9f)) {
    id_act = 127.0f / amax;
    id_ref = 1.0f / (amax / 127.0f);
    if (id_act != id_ref) break;
  }
  REQUIRE(id_act != id_ref);
  // x · id crosses q + 0.5 between the two ids: x = (q + 0.5) / (the mean id), rounded.
  float x[32] = {amax};
  bool found = false;
  for (int q = 1; q < 126 && !found; ++q) {
    const float v = (static_cast<float>(q) + 0.5f) / (0.5f * (id_act + id_ref));
    for (float u : {v, std::nextafter(v, 0.0f), std::nextafter(v, 1e9f)}) {
      if ((u * id_act < q + 0.5f) != (u * id_ref < q + 0.5f)) {
        x[1] = u;
        found = true;
        break;
      }
    }
  }
  REQUIRE(found);
  for (Isa isa : AvailableIsas()) {
    INFO(IsaName(isa));
    const TypeKernels& q8 = *KernelsFor(GgmlType::kQ8_0, isa);
    BlockQ8_0 act, weight;
    q8.from_float(x, &act, 32);
    QuantizeWeights(q8, x, &weight, 32);
    CHECK(act.qs[1] == static_cast<int>(std::nearbyint(x[1] * id_act)));
    CHECK(weight.qs[1] == static_cast<int>(std::roundf(x[1] * id_ref)));
    CHECK(act.qs[1] != weight.qs[1]);
  }
}

}  // namespace
}  // namespace thermocline
