// The CUDA operators against the CPU reference (the parity harness), plus the parts that need no
// GPU: memory-cap bookkeeping and the "no CUDA device" probe. Every case that needs a device is
// tagged [cuda] and prints "SKIPPED:" without one (ctest reports it skipped, never passed).
// Tolerances: see cuda_test_util.h.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "bench/gpu_ops.h"
#include "cuda_test_util.h"
#include "engine/gpu/gpu_backend.h"
#include "engine/gpu/gpu_ffn_executor.h"
#include "engine/gpu/gpu_memory.h"
#include "engine/model/cpu_ops.h"

namespace thermocline {
namespace {

using namespace cuda_test;  // NOLINT: the harness's helpers

TEST_CASE("MemoryBudget: reservations round up, the cap is never passed", "[gpu]") {
  gpu::MemoryBudget b(4096);
  REQUIRE(gpu::MemoryBudget::Rounded(0) == 0);
  REQUIRE(gpu::MemoryBudget::Rounded(1) == 256);
  REQUIRE(gpu::MemoryBudget::Rounded(256) == 256);
  REQUIRE(gpu::MemoryBudget::Rounded(257) == 512);
  REQUIRE(b.Reserve(1000, "a").ok());  // 1024 accounted
  REQUIRE(b.used() == 1024);
  REQUIRE(b.Reserve(3072, "b").ok());
  REQUIRE(b.used() == 4096);
  const absl::Status full = b.Reserve(1, "the last byte");
  REQUIRE(full.code() == absl::StatusCode::kResourceExhausted);
  REQUIRE(full.message().find("the last byte") != std::string::npos);
  REQUIRE(full.message().find("--gpu-memory") != std::string::npos);
  REQUIRE(b.used() == 4096);  // a refused reservation accounts nothing
  b.Release(3072);
  REQUIRE(b.used() == 1024);
  REQUIRE(b.available() == 3072);
  REQUIRE(b.Reserve(3073, "too much").code() == absl::StatusCode::kResourceExhausted);
  REQUIRE(b.Reserve(3072, "exactly the rest").ok());
  REQUIRE(b.peak() == 4096);
  b.Release(1000);
  b.Release(3072);
  b.Release(256);  // releasing more than reserved clamps at zero, never wraps
  REQUIRE(b.used() == 0);
  gpu::MemoryBudget unlimited;
  REQUIRE(unlimited.Reserve(uint64_t{1} << 50, "big").ok());
  REQUIRE(unlimited.Reserve(~uint64_t{0}, "everything").code() ==
          absl::StatusCode::kResourceExhausted);
}

TEST_CASE("GPU probe: no device is a clean error, a device is described", "[gpu]") {
  const absl::StatusOr<gpu::DeviceInfo> info = gpu::Probe(0);
  if (!gpu::CudaCompiledIn()) {
    REQUIRE(info.status().code() == absl::StatusCode::kUnavailable);
  }
  if (!info.ok()) {
    INFO(info.status().ToString());
    REQUIRE(info.status().code() == absl::StatusCode::kUnavailable);
    REQUIRE(info.status().message().find("no ") != std::string::npos);
    REQUIRE_FALSE(gpu::DeviceAvailable());
    // Everything built on the device reports the same cleanly instead of crashing.
    REQUIRE(gpu::GpuOps::Create().status().code() == absl::StatusCode::kUnavailable);
    gpu::GpuFfnSpec spec;
    spec.n_embd = 64;
    spec.n_ff = 8;
    REQUIRE(gpu::CreateGpuFfnExecutor(spec).status().code() == absl::StatusCode::kUnavailable);
  } else {
    REQUIRE(gpu::CudaCompiledIn());
    REQUIRE_FALSE(info->name.empty());
    REQUIRE(info->total_bytes > 0);
    REQUIRE(info->compute_major >= 8);
    REQUIRE(gpu::DeviceAvailable());
  }
  REQUIRE(gpu::Probe(-1).status().code() != absl::StatusCode::kOk);
  REQUIRE(gpu::Probe(4096).status().code() != absl::StatusCode::kOk);
}

TEST_CASE("CUDA mat-vec equals the CPU reference for every type", "[cuda]") {
  REQUIRE_GPU_OPS(ops);
  const int64_t shapes[][2] = {{1, 32},    {7, 96},  {131, 288}, {1001, 4096},
                               {67, 4128}, {5, 768}, {3, 256}};
  uint32_t seed = 1;
  for (GgmlType type : kTypes) {
    for (const auto& shape : shapes) {
      const int64_t rows = shape[0], cols = shape[1];
      if (cols % TypeInfo(type).block_size != 0) continue;  // super-blocks: 256, 768, 4096
      INFO(TypeName(type) << " " << rows << "x" << cols);
      const OwnedWeight w = RandomWeight(type, rows, cols, ++seed);
      const std::vector<float> x = RandomFloats(cols, ++seed);
      const CpuMatVec ref = ReferenceMatVec(w.view, x);
      std::vector<float> y(rows);
      REQUIRE_OK(ops->MatVec(w.view, x.data(), y.data()));
      for (int64_t i = 0; i < rows; ++i) {
        INFO("row " << i << " ref " << ref.y[i] << " gpu " << y[i]);
        REQUIRE(std::fabs(y[i] - ref.y[i]) <= DotBound(cols, ref.magnitude[i]));
      }
    }
  }
  // Float types need no blocks: odd row lengths too.
  for (GgmlType type : {GgmlType::kF32, GgmlType::kF16, GgmlType::kBF16}) {
    const OwnedWeight w = RandomWeight(type, 13, 257, ++seed);
    const std::vector<float> x = RandomFloats(257, ++seed);
    const CpuMatVec ref = ReferenceMatVec(w.view, x);
    std::vector<float> y(13);
    REQUIRE_OK(ops->MatVec(w.view, x.data(), y.data()));
    for (int i = 0; i < 13; ++i)
      REQUIRE(std::fabs(y[i] - ref.y[i]) <= DotBound(257, ref.magnitude[i]));
  }
}

TEST_CASE("CUDA prefill GEMM (cuBLAS) equals the dequantized float product", "[cuda]") {
  REQUIRE_GPU_OPS(ops);
  uint32_t seed = 100;
  for (GgmlType type : kTypes) {
    const int64_t rows = 75, cols = ColsFor(type, 160), n_tokens = 5;
    INFO(TypeName(type));
    const OwnedWeight w = RandomWeight(type, rows, cols, ++seed);
    const std::vector<float> x = RandomFloats(n_tokens * cols, ++seed);
    std::vector<float> y(n_tokens * rows);
    REQUIRE_OK(ops->Gemm(w.view, x.data(), n_tokens, y.data()));
    for (int64_t r = 0; r < rows; ++r) {
      const std::vector<float> row = DequantRow(w.view, r);
      for (int64_t t = 0; t < n_tokens; ++t) {
        double ref = 0, m = 0;
        for (int64_t c = 0; c < cols; ++c) {
          ref += double{row[c]} * x[t * cols + c];
          m += std::fabs(double{row[c]} * x[t * cols + c]);
        }
        // F32: cuBLAS sums in any order, at worst cols roundings. Other types: x and the
        // dequantized weights are rounded to F16 first (≤ ε16/2 relative each).
        const double bound =
            (type == GgmlType::kF32 ? 0.0 : kEps16) * m + (cols + 8) * kEps32 * m + 1e-30;
        INFO("r " << r << " t " << t);
        REQUIRE(std::fabs(y[t * rows + r] - ref) <= bound);
      }
    }
  }
}

// Compact rows: every 3rd neuron plus a few, in a scrambled order (the table need not be sorted).
std::vector<int32_t> Table(int64_t n, uint32_t seed) {
  std::vector<int32_t> t;
  for (int32_t i = 0; i < n; ++i) {
    if (i % 3 == 1 || i == n - 1) t.push_back(i);
  }
  std::shuffle(t.begin(), t.end(), std::mt19937(seed));
  return t;
}

TEST_CASE("CUDA sparse kernels equal the dense ones restricted to the active set", "[cuda]") {
  REQUIRE_GPU_OPS(ops);
  uint32_t seed = 200;
  for (GgmlType type : kTypes) {
    const int64_t n_ff = 301, n_embd = ColsFor(type, 160);
    INFO(TypeName(type));
    const OwnedWeight w = RandomWeight(type, n_ff, n_embd, ++seed);
    const std::vector<int32_t> table = Table(n_ff, ++seed);
    const std::vector<float> x = RandomFloats(n_embd, ++seed);
    const CpuMatVec dense = ReferenceMatVec(w.view, x);
    std::vector<int32_t> partial;
    for (int32_t k = 0; k < static_cast<int32_t>(table.size()); k += 2) partial.push_back(k);
    std::vector<int32_t> all(table.size());
    std::iota(all.begin(), all.end(), 0);
    for (const std::vector<int32_t>& active : {std::vector<int32_t>{0}, partial, all}) {
      std::vector<float> y(active.size());
      REQUIRE_OK(ops->SparseMatVec(w.view, table, active, x.data(), y.data()));
      for (size_t j = 0; j < active.size(); ++j) {
        const int32_t n = table[active[j]];
        REQUIRE(std::fabs(y[j] - dense.y[n]) <= DotBound(n_embd, dense.magnitude[n]));
      }
      // Axpy over down_t rows: out = Σ act_j · w_t.row(table[active[j]]), zeros skipped.
      std::vector<float> act = RandomFloats(active.size(), ++seed);
      for (size_t j = 0; j < act.size(); j += 4) act[j] = 0.0f;
      std::vector<float> out(n_embd);
      REQUIRE_OK(ops->SparseAxpy(w.view, table, active, act.data(), out.data()));
      std::vector<double> ref(n_embd, 0.0), m(n_embd, 0.0);
      for (size_t j = 0; j < active.size(); ++j) {
        const std::vector<float> row = DequantRow(w.view, table[active[j]]);
        for (int64_t c = 0; c < n_embd; ++c) {
          ref[c] += double{act[j]} * row[c];
          m[c] += std::fabs(double{act[j]} * row[c]);
        }
      }
      // Each slice sums its rows in sequence, then the slices are summed: ≤ n + 2 roundings.
      for (int64_t c = 0; c < n_embd; ++c) {
        REQUIRE(std::fabs(out[c] - ref[c]) <= (active.size() + 2) * kEps32 * m[c] + 1e-30);
      }
    }
  }
}

TEST_CASE("CUDA predictor selects the neurons the CPU predictor selects", "[cuda]") {
  REQUIRE_GPU_OPS(ops);
  const int64_t n_embd = 128, rank = 64, n_ff = 500;
  uint32_t seed = 300;
  for (GgmlType type : {GgmlType::kF32, GgmlType::kF16, GgmlType::kQ8_0}) {
    INFO(TypeName(type));
    const OwnedWeight fc1 = RandomWeight(type, rank, n_embd, ++seed);
    const OwnedWeight fc2 = RandomWeight(type, n_ff, rank, ++seed);
    const std::vector<float> b1 = RandomFloats(rank, ++seed), b2 = RandomFloats(n_ff, ++seed);
    const std::vector<float> x = RandomFloats(n_embd, ++seed);
    const std::vector<int32_t> table = Table(n_ff, ++seed);
    const float threshold = 0.5f;
    absl::StatusOr<std::vector<int32_t>> got =
        ops->Predict(fc1.view, b1, fc2.view, b2, table, threshold, x.data());
    REQUIRE_OK(got.status());
    // CPU: hidden = relu(fc1 x + b1), logits = fc2 hidden + b2, both with the CPU's semantics.
    CpuMatVec h = ReferenceMatVec(fc1.view, x);
    std::vector<float> hidden(rank);
    for (int64_t j = 0; j < rank; ++j) hidden[j] = std::max(0.0f, h.y[j] + b1[j]);
    const CpuMatVec logits = ReferenceMatVec(fc2.view, hidden);
    // A neuron whose logit is within the error bound of the threshold may go either way; the
    // bound covers fc2's dot plus fc1's error carried through fc2 (|Δh| ≤ its bound, times |w|).
    std::vector<uint8_t> in_gpu(table.size(), 0);
    for (size_t j = 0; j < got->size(); ++j) {
      REQUIRE((*got)[j] >= 0);
      REQUIRE((*got)[j] < static_cast<int32_t>(table.size()));
      if (j > 0) REQUIRE((*got)[j] > (*got)[j - 1]);  // ascending, unique
      in_gpu[(*got)[j]] = 1;
    }
    double max_h_err = 0;
    for (int64_t j = 0; j < rank; ++j)
      max_h_err = std::max(max_h_err, DotBound(n_embd, h.magnitude[j]));
    int decided = 0;
    for (size_t k = 0; k < table.size(); ++k) {
      const int32_t n = table[k];
      const double v = double{logits.y[n]} + b2[n];
      // Quantized fc2 re-quantizes hidden: a hidden error can move an int8 step (1/127 of the
      // block max), so its margin is wider.
      const double q_step = type == GgmlType::kQ8_0 ? 1.0 / 64 : 0.0;
      const double margin = DotBound(rank, logits.magnitude[n]) + (max_h_err + q_step) * rank;
      if (v > threshold + margin) REQUIRE(in_gpu[k]);
      if (v < threshold - margin) REQUIRE_FALSE(in_gpu[k]);
      decided += std::fabs(v - threshold) > margin;
    }
    REQUIRE(decided > static_cast<int>(table.size()) / 2);  // the check is not vacuous
  }
}

TEST_CASE("CUDA RMSNorm, RoPE and gated activations equal the CPU", "[cuda]") {
  REQUIRE_GPU_OPS(ops);
  for (int64_t n : {1, 31, 4096, 5000}) {
    const std::vector<float> x = RandomFloats(n, 400 + n), w = RandomFloats(n, 401 + n);
    std::vector<float> ref(n), got(n);
    RmsNorm(x.data(), w.data(), n, 1e-5f, ref.data());
    REQUIRE_OK(ops->RmsNorm(x.data(), w.data(), n, 1e-5f, got.data()));
    // Sum of squares: ≤ n/1024 + 10 sequential and tree additions, then sqrt, divide, 2 products.
    for (int64_t i = 0; i < n; ++i) {
      REQUIRE(std::fabs(got[i] - ref[i]) <= (n / 1024.0 + 16) * kEps32 * std::fabs(ref[i]) + 1e-30);
    }
  }
  {
    const int64_t heads = 5, head_dim = 48, rope_dim = 32;  // partial rotation
    std::vector<float> x = RandomFloats(heads * head_dim, 410), cs(rope_dim);
    for (int64_t i = 0; i < rope_dim / 2; ++i) {
      const double theta = 7 * std::pow(10000.0, -2.0 * i / rope_dim);
      cs[2 * i] = static_cast<float>(std::cos(theta));
      cs[2 * i + 1] = static_cast<float>(std::sin(theta));
    }
    std::vector<float> ref = x, got = x;
    ApplyRope(ref.data(), heads, head_dim, rope_dim, cs.data());
    REQUIRE_OK(ops->Rope(got.data(), heads, head_dim, rope_dim, cs.data()));
    // Two products and a sum per element; nvcc may fuse them (FMA): ≤ 3 roundings.
    for (int64_t h = 0; h < heads; ++h) {
      for (int64_t i = 0; i < head_dim; ++i) {
        const int64_t p = h * head_dim + (i & ~int64_t{1});
        const double m = std::fabs(x[p]) + std::fabs(x[p + 1]);
        REQUIRE(std::fabs(got[h * head_dim + i] - ref[h * head_dim + i]) <= 3 * kEps32 * m);
      }
    }
  }
  for (FfnActivation act : {FfnActivation::kSilu, FfnActivation::kRelu, FfnActivation::kDRelu}) {
    const int64_t n = 1003;
    const std::vector<float> gate = RandomFloats(n, 420, -8, 8), up = RandomFloats(n, 421, -2, 2);
    std::vector<float> ref = gate, got = gate;
    GatedActivation(act, ref.data(), up.data(), n);
    REQUIRE_OK(ops->GatedActivation(act, got.data(), up.data(), n));
    // expf (≤ 2 ulp on the device, ≤ 1 on the CPU), one add, one divide, one product.
    for (int64_t i = 0; i < n; ++i) {
      INFO(ActivationName(act) << " " << i);
      REQUIRE(std::fabs(got[i] - ref[i]) <= 8 * kEps32 * std::fabs(ref[i]) + 1e-30);
    }
  }
}

TEST_CASE("CUDA decode attention equals the CPU's softmax attention", "[cuda]") {
  REQUIRE_GPU_OPS(ops);
  struct Case {
    int64_t n_kv, n_head, n_head_kv, head_dim;
  };
  for (const Case& c : {Case{1, 4, 4, 64}, Case{37, 4, 2, 48}, Case{300, 8, 1, 128},
                        Case{1000, 2, 2, 64}, Case{5, 2, 1, 512}}) {
    INFO(c.n_kv << " kv, " << c.n_head << "/" << c.n_head_kv << " heads, dim " << c.head_dim);
    const int64_t kv_dim = c.n_head_kv * c.head_dim;
    const std::vector<float> q = RandomFloats(c.n_head * c.head_dim, 430 + c.n_kv);
    const std::vector<float> k = RandomFloats(c.n_kv * kv_dim, 431 + c.n_kv);
    const std::vector<float> v = RandomFloats(c.n_kv * kv_dim, 432 + c.n_kv);
    std::vector<float> got(c.n_head * c.head_dim);
    REQUIRE_OK(ops->Attention(q.data(), k.data(), v.data(), c.n_kv, c.n_head, c.n_head_kv,
                              c.head_dim, got.data()));
    const int64_t group = c.n_head / c.n_head_kv;
    const double scale = 1.0 / std::sqrt(static_cast<double>(c.head_dim));
    for (int64_t h = 0; h < c.n_head; ++h) {
      const int64_t off = (h / group) * c.head_dim;
      std::vector<double> s(c.n_kv);
      double max_s = -1e300, max_mag = 0, sum = 0;
      for (int64_t j = 0; j < c.n_kv; ++j) {
        double dot = 0, mag = 0;
        for (int64_t i = 0; i < c.head_dim; ++i) {
          dot += double{q[h * c.head_dim + i]} * k[j * kv_dim + off + i];
          mag += std::fabs(double{q[h * c.head_dim + i]} * k[j * kv_dim + off + i]);
        }
        s[j] = dot * scale;
        max_s = std::max(max_s, s[j]);
        max_mag = std::max(max_mag, mag * scale);
      }
      for (double& e : s) sum += (e = std::exp(e - max_s));
      // A score error δ (the dot's bound) moves each probability by ≤ 2δ relative; the sums of
      // exps and of p·v add ≤ n_kv + 16 roundings; expf 2 ulp.
      const double rel = (2 * (c.head_dim + 4) * max_mag + c.n_kv + 24) * kEps32;
      for (int64_t i = 0; i < c.head_dim; ++i) {
        double ref = 0, mag = 0;
        for (int64_t j = 0; j < c.n_kv; ++j) {
          ref += s[j] / sum * v[j * kv_dim + off + i];
          mag += s[j] / sum * std::fabs(v[j * kv_dim + off + i]);
        }
        REQUIRE(std::fabs(got[h * c.head_dim + i] - ref) <= rel * mag + 1e-30);
      }
    }
  }
}

}  // namespace
}  // namespace thermocline
