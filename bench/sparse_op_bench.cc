// The sparse operator benchmark: weights of one FFN shape per type (random, copied into enough
// "layers" that caches don't hold them), then repetitions of every (pattern, fraction) with a
// dense and a sparse measurement each, alternating which goes first; medians per path.
#include "bench/sparse_op_bench.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "bench/touch_lines.h"
#include "engine/ops/matmul.h"
#include "engine/ops/type_table.h"
#include "engine/ops/weight_layout.h"
#include "engine/sparse/sparse_ops.h"

namespace thermocline {
namespace {

// splitmix64: fast, seedable, good enough for weights and index draws.
class Rng {
 public:
  explicit Rng(uint64_t seed) : s_(seed) {}
  uint64_t Next() {
    uint64_t z = (s_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  float Uniform() { return static_cast<float>(Next() >> 40) * (2.0f / (1 << 24)) - 1.0f; }
  int64_t Below(int64_t n) { return static_cast<int64_t>(Next() % static_cast<uint64_t>(n)); }

 private:
  uint64_t s_;
};

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

double Micros(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double, std::micro>(b - a).count();
}

// A weight matrix (rows, cols) of `type` with uniform random values in [-1, 1).
OwnedWeight RandomWeight(ThreadPool& pool, GgmlType type, int64_t rows, int64_t cols,
                         uint64_t seed) {
  OwnedWeight w = OwnedWeight::Allocate(type, rows, cols);
  const TypeKernels* k = KernelsFor(type);
  std::vector<float> tmp(static_cast<size_t>(pool.size()) * cols);
  pool.ParallelFor(rows, 16, [&](int part, int64_t begin, int64_t end) {
    float* t = tmp.data() + part * cols;
    for (int64_t r = begin; r < end; ++r) {
      Rng rng(seed * 0x100000001B3ull + r);
      for (int64_t i = 0; i < cols; ++i) t[i] = rng.Uniform();
      QuantizeWeights(*k, t, w.data.data() + r * w.view.row_bytes, cols);
    }
  });
  return w;
}

OwnedWeight Copy(const OwnedWeight& src) {
  OwnedWeight w;
  w.view = src.view;
  w.data = src.data;
  w.view.data = w.data.data();
  return w;
}

struct Layer {
  OwnedWeight gate, up, down, down_t;  // gate, up: (n_ff, n_embd); down: (n_embd, n_ff)
  // What the engine's dense path reads: the row groups of gate, up and down for the types that
  // have them (PackRowGroups; empty: the rows above).
  OwnedWeight gate_groups, up_groups, down_groups;
  InterleavedGateUp gate_up;  // interleave_gate_up: what the sparse path reads
  int64_t hot_start = 0;      // kMixed: where the hot block begins
};

// The down_t the sparse path reads: interleaved with gate and up where they were.
const WeightView& DownT(const Layer& l) {
  return l.gate_up.down_t.data != nullptr ? l.gate_up.down_t : l.down_t.view;
}

// Draws `m` distinct neurons of [0, n) into idx (sorted); perm: a permutation buffer of n.
void DrawActive(Rng& rng, ActivePattern pattern, int64_t n, int64_t m, int64_t hot_start,
                std::vector<int32_t>& perm, std::vector<int32_t>& idx) {
  idx.clear();
  int64_t hot = 0;
  if (pattern == ActivePattern::kMixed) {
    hot = m / 2;
    hot_start = std::min(hot_start, n - hot);
    for (int64_t i = 0; i < hot; ++i) idx.push_back(static_cast<int32_t>(hot_start + i));
  }
  // The rest uniformly from the n - hot neurons outside the hot block (partial Fisher-Yates).
  const int64_t cold = n - hot;
  for (int64_t i = 0; i < cold; ++i) perm[i] = static_cast<int32_t>(i);
  for (int64_t i = 0; i < m - hot; ++i) {
    std::swap(perm[i], perm[i + rng.Below(cold - i)]);
    const int64_t p = perm[i];
    idx.push_back(static_cast<int32_t>(p < hot_start || hot == 0 ? p : p + hot));
  }
  std::sort(idx.begin(), idx.end());
}

absl::Status Check(const SparseOpBenchOptions& o) {
  if (o.n_embd <= 0 || o.n_ff <= 0) {
    return absl::InvalidArgumentError("--embd and --ff must be positive");
  }
  for (GgmlType t : o.types) {
    if (FindWeightType(t) == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("type ", TypeName(t), " has no kernels; use one of ", WeightTypeNames()));
    }
    const int64_t bs = TypeInfo(t).block_size;
    if (o.n_embd % bs != 0 || o.n_ff % bs != 0) {
      return absl::InvalidArgumentError(absl::StrCat("--embd ", o.n_embd, " and --ff ", o.n_ff,
                                                     " must be multiples of ", bs, " for ",
                                                     TypeName(t)));
    }
  }
  for (double f : o.fractions) {
    if (!(f > 0 && f <= 1)) {
      return absl::InvalidArgumentError(absl::StrCat("active fraction ", f, " not in (0, 1]"));
    }
  }
  if (o.repetitions < 1) return absl::InvalidArgumentError("--repetitions must be >= 1");
  if (o.patterns.empty() || o.fractions.empty() || o.types.empty()) {
    return absl::InvalidArgumentError("nothing to measure: no types, fractions or patterns");
  }
  return absl::OkStatus();
}

}  // namespace

const char* ActivePatternName(ActivePattern p) {
  return p == ActivePattern::kRandom ? "random" : "mixed";
}

absl::StatusOr<SparseOpBenchResult> RunSparseOpBench(ThreadPool& pool,
                                                     const SparseOpBenchOptions& o) {
  if (absl::Status s = Check(o); !s.ok()) return s;
  const int64_t d = o.n_embd, n_ff = o.n_ff;
  const Isa isa = BestIsa();
  SparseOpBenchResult result;
  result.threads = pool.size();
  result.isa = isa;
  result.n_embd = d;
  result.n_ff = n_ff;
  result.repetitions = o.repetitions;

  // Per-token buffers, shared by all types (sized for the largest).
  Rng rng(o.seed);
  std::vector<float> x(d), act(n_ff), y_gate(n_ff), y_up(n_ff), out(d);
  for (float& v : x) v = rng.Uniform();
  for (float& v : act) {  // |act| in [0.5, 1.5): no exact zero for the axpy to skip
    v = rng.Uniform();
    v += v >= 0 ? 0.5f : -0.5f;
  }
  size_t prepared = 0;
  for (GgmlType t : o.types) prepared = std::max(prepared, PreparedBytes(t, d));
  std::vector<uint8_t> x_gate(prepared);
  MatMulScratch matmul_scratch;
  matmul_scratch.Reserve(1, std::max(d, n_ff));
  SparseScratch sparse_scratch;
  sparse_scratch.Reserve(pool.size(), d, n_ff);
  std::vector<int32_t> perm(n_ff), idx;
  idx.reserve(n_ff);

  for (GgmlType type : o.types) {
    std::vector<Layer> layers(1);
    layers[0].gate = RandomWeight(pool, type, n_ff, d, o.seed + 1);
    layers[0].up = RandomWeight(pool, type, n_ff, d, o.seed + 2);
    layers[0].down = RandomWeight(pool, type, d, n_ff, o.seed + 3);
    layers[0].gate_groups = PackRowGroups(pool, layers[0].gate.view);
    layers[0].up_groups = PackRowGroups(pool, layers[0].up.view);
    layers[0].down_groups = PackRowGroups(pool, layers[0].down.view);
    auto dt = TransposeWeight(pool, layers[0].down.view);
    if (!dt.ok()) return dt.status();
    layers[0].down_t = *std::move(dt);
    if (o.interleave_gate_up) {
      // down_t beside them, as SparseWeights lays a neuron's rows.
      auto gu = InterleaveGateUp(pool, layers[0].gate.view, layers[0].up.view, nullptr,
                                 &layers[0].down_t.view);
      if (!gu.ok()) return gu.status();
      layers[0].gate_up = *std::move(gu);
    }
    const int64_t layer_bytes = static_cast<int64_t>(
        layers[0].gate.data.size() + layers[0].up.data.size() + layers[0].down.data.size() +
        layers[0].down_t.data.size() + layers[0].gate_up.storage.data.size() +
        layers[0].gate_groups.data.size() + layers[0].up_groups.data.size() +
        layers[0].down_groups.data.size());
    const int64_t n_layers =
        std::max<int64_t>(2, (o.min_weight_bytes + layer_bytes - 1) / layer_bytes);
    for (int64_t l = 1; l < n_layers; ++l) {
      Layer c;
      c.gate = Copy(layers[0].gate);
      c.up = Copy(layers[0].up);
      c.down = Copy(layers[0].down);
      c.down_t = Copy(layers[0].down_t);
      c.gate_groups = Copy(layers[0].gate_groups);
      c.up_groups = Copy(layers[0].up_groups);
      c.down_groups = Copy(layers[0].down_groups);
      if (o.interleave_gate_up) {
        // The same views at the same offsets into the copy.
        const InterleavedGateUp& from = layers[0].gate_up;
        c.gate_up.storage = Copy(from.storage);
        const uint8_t* base = c.gate_up.storage.data.data();
        const auto moved = [&](WeightView v) {
          if (v.data != nullptr) v.data = base + (v.data - from.storage.data.data());
          return v;
        };
        c.gate_up.gate = moved(from.gate);
        c.gate_up.up = moved(from.up);
        c.gate_up.down_t = moved(from.down_t);
      }
      layers.push_back(std::move(c));
    }
    for (Layer& l : layers) l.hot_start = rng.Below(n_ff);
    result.layers.push_back(static_cast<int>(n_layers));
    size_t next_layer = 0;
    auto take_layer = [&]() -> const Layer& {
      const Layer& l = layers[next_layer];
      next_layer = (next_layer + 1) % layers.size();
      return l;
    };

    auto dense_view = [](const OwnedWeight& groups, const OwnedWeight& rows) -> const WeightView& {
      return groups.data.empty() ? rows.view : groups.view;
    };
    auto dense = [&](const Layer& l, double* gu, double* dn) {
      const auto t0 = std::chrono::steady_clock::now();
      MatMul(pool, dense_view(l.gate_groups, l.gate), x.data(), 1, y_gate.data(), matmul_scratch);
      MatMul(pool, dense_view(l.up_groups, l.up), x.data(), 1, y_up.data(), matmul_scratch);
      const auto t1 = std::chrono::steady_clock::now();
      MatMul(pool, dense_view(l.down_groups, l.down), act.data(), 1, out.data(), matmul_scratch);
      const auto t2 = std::chrono::steady_clock::now();
      *gu = Micros(t0, t1);
      *dn = Micros(t1, t2);
    };
    auto sparse = [&](const Layer& l, double* gu, double* dn) {
      const int64_t m = static_cast<int64_t>(idx.size());
      const auto t0 = std::chrono::steady_clock::now();
      // gate and up share a type here: x is prepared once for both.
      PrepareActivations(type, isa, x.data(), d, x_gate.data());
      const WeightView& g = o.interleave_gate_up ? l.gate_up.gate : l.gate.view;
      const WeightView& u = o.interleave_gate_up ? l.gate_up.up : l.up.view;
      SparseGateUp(pool, isa, g, x_gate.data(), u, x_gate.data(), idx.data(), m, y_gate.data(),
                   y_up.data());
      const auto t1 = std::chrono::steady_clock::now();
      SparseAxpy(pool, isa, DownT(l), idx.data(), act.data(), m, out.data(), sparse_scratch);
      const auto t2 = std::chrono::steady_clock::now();
      *gu = Micros(t0, t1);
      *dn = Micros(t1, t2);
    };

    // The read floor: the same bytes as each path, touched once per cache line on every thread
    // of the pool and not computed on. Dense reads whole matrices as streams; sparse reads the
    // active rows of gate, up and down_t, scattered as the active set is.
    const int parts = pool.size();
    std::vector<uint64_t> sinks(parts, 0);
    auto dense_read = [&](const Layer& l) {
      const auto t0 = std::chrono::steady_clock::now();
      pool.Run([&](int part) {
        for (const WeightView* w : {&l.gate.view, &l.up.view, &l.down.view}) {
          const int64_t begin = w->rows * part / parts, end = w->rows * (part + 1) / parts;
          if (end > begin) sinks[part] += TouchLines(w->row(begin), (end - begin) * w->row_bytes);
        }
      });
      return Micros(t0, std::chrono::steady_clock::now());
    };
    auto sparse_read = [&](const Layer& l) {
      const int64_t m = static_cast<int64_t>(idx.size());
      const WeightView& g = o.interleave_gate_up ? l.gate_up.gate : l.gate.view;
      const WeightView& u = o.interleave_gate_up ? l.gate_up.up : l.up.view;
      const WeightView& dt = DownT(l);
      const size_t gu_bytes = RowBytes(type, d), dt_bytes = RowBytes(dt.type, dt.cols);
      const auto t0 = std::chrono::steady_clock::now();
      pool.Run([&](int part) {
        const int64_t begin = m * part / parts, end = m * (part + 1) / parts;
        uint64_t sum = 0;
        for (int64_t j = begin; j < end; ++j) {
          sum += TouchLines(g.row(idx[j]), gu_bytes) + TouchLines(u.row(idx[j]), gu_bytes);
        }
        for (int64_t j = begin; j < end; ++j) sum += TouchLines(dt.row(idx[j]), dt_bytes);
        sinks[part] += sum;
      });
      return Micros(t0, std::chrono::steady_clock::now());
    };

    struct Samples {
      std::vector<double> dense_gu, dense_dn, dense, sparse_gu, sparse_dn, sparse;
      std::vector<double> dense_read, sparse_read;
    };
    const size_t n_cases = o.patterns.size() * o.fractions.size();
    std::vector<Samples> samples(n_cases);
    for (int rep = 0; rep < o.repetitions; ++rep) {
      for (size_t c = 0; c < n_cases; ++c) {
        const ActivePattern pattern = o.patterns[c / o.fractions.size()];
        const double f = o.fractions[c % o.fractions.size()];
        const int64_t m = std::clamp<int64_t>(std::llround(f * n_ff), 1, n_ff);
        Samples& s = samples[c];
        for (int k = 0; k < 2; ++k) {
          double gu, dn;
          if ((k == 0) == (rep % 2 == 0)) {
            dense(take_layer(), &gu, &dn);
            s.dense_gu.push_back(gu);
            s.dense_dn.push_back(dn);
            s.dense.push_back(gu + dn);
          } else {
            const Layer& l = take_layer();
            DrawActive(rng, pattern, n_ff, m, l.hot_start, perm, idx);
            sparse(l, &gu, &dn);
            s.sparse_gu.push_back(gu);
            s.sparse_dn.push_back(dn);
            s.sparse.push_back(gu + dn);
          }
        }
        for (int k = 0; k < 2; ++k) {
          const Layer& l = take_layer();
          if ((k == 0) == (rep % 2 == 0)) {
            s.dense_read.push_back(dense_read(l));
          } else {
            DrawActive(rng, pattern, n_ff, m, l.hot_start, perm, idx);
            s.sparse_read.push_back(sparse_read(l));
          }
        }
      }
    }
    for (size_t c = 0; c < n_cases; ++c) {
      SparseOpBenchRow row;
      row.type = type;
      row.pattern = o.patterns[c / o.fractions.size()];
      row.fraction = o.fractions[c % o.fractions.size()];
      row.active = std::clamp<int64_t>(std::llround(row.fraction * n_ff), 1, n_ff);
      row.n_ff = n_ff;
      const Samples& s = samples[c];
      row.dense_gate_up_us = Median(s.dense_gu);
      row.dense_down_us = Median(s.dense_dn);
      row.dense_us = Median(s.dense);
      row.sparse_gate_up_us = Median(s.sparse_gu);
      row.sparse_down_us = Median(s.sparse_dn);
      row.sparse_us = Median(s.sparse);
      row.dense_min_us = *std::min_element(s.dense.begin(), s.dense.end());
      row.sparse_min_us = *std::min_element(s.sparse.begin(), s.sparse.end());
      row.dense_read_us = Median(s.dense_read);
      row.sparse_read_us = Median(s.sparse_read);
      result.rows.push_back(row);
    }
    volatile uint64_t sink = 0;  // the reads' sums are used, so the reads are not dropped
    for (uint64_t v : sinks) sink = sink + v;
  }
  return result;
}

}  // namespace thermocline
