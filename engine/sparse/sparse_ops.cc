// The neuron-aware operators: row-sparse mat-vec (the row-dot kernels of engine/ops/row_dot.h
// over the listed rows, gate and up fused) and the axpy of down_t rows (kernels.h's AxpyFor) with
// per-part accumulators. Rows a part will need soon are prefetched: active rows are scattered,
// so the hardware prefetchers only see each row once it has started.
#include "engine/sparse/sparse_ops.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/model/cpu_ops.h"
#include "engine/ops/row_dot.h"
#include "engine/ops/type_table.h"

namespace thermocline {

void SparseScratch::Reserve(int n_threads, int64_t max_cols, int64_t max_active) {
  n_threads_ = n_threads;
  cols_ = max_cols;
  acc_.assign(static_cast<size_t>(n_threads) * max_cols, 0.0f);
  nz_idx_.assign(max_active, 0);
  nz_act_.assign(max_active, 0.0f);
}

namespace {

// A part of a parallel operator should stream at least this many weight bytes: below it the
// hand-off to another thread costs more than the work it takes away.
constexpr size_t kMinPartBytes = 32 << 10;
// Active rows per row-dot kernel call (RowDot::DotRows).
constexpr int kRowsPerDot = 4;

// The row dots of (type, isa), or the scalar ones when this CPU lacks `isa` (Prepare and Dot
// then agree, as both come through here).
RowDot RowDotOrScalar(GgmlType type, Isa isa) {
  RowDot dot(type, isa);
  return dot.ok() ? dot : RowDot(type, Isa::kScalar);
}

// The (type, isa) whose kernel table entry `k` is; false for kernels from elsewhere.
bool IdentifyKernels(const TypeKernels& k, GgmlType* type, Isa* isa) {
  for (Isa i : AvailableIsas()) {
    for (const WeightTypeRow& row : TypeRows()) {
      if (KernelsFor(row.type, i) == &k) {
        *type = row.type;
        *isa = i;
        return true;
      }
    }
  }
  return false;
}

// Up to the pool's size, as many parts as there are kMinPartBytes of weights to read.
int PartsFor(const ThreadPool& pool, int64_t rows, size_t row_bytes) {
  const int64_t by_work = rows * static_cast<int64_t>(row_bytes) / kMinPartBytes;
  return static_cast<int>(std::clamp<int64_t>(by_work, 1, pool.size()));
}

// fn(part, begin, end) over `parts` equal slices of [0, n); one part runs on the caller.
template <class Fn>
void RunParts(ThreadPool& pool, int parts, int64_t n, const Fn& fn) {
  if (parts <= 1) {
    fn(0, int64_t{0}, n);
    return;
  }
  pool.Run([&](int part) {
    if (part < parts) fn(part, n * part / parts, n * (part + 1) / parts);
  });
}

// acc[0, cols) += Σ_j act[j] · w_t.row(idx[j])[col0, col0 + cols), j < n: kMaxAxpyRows rows per
// pass over acc, rows prefetched kPrefetchRows ahead (the first ones before the first pass).
void AxpyInto(AxpyFn axpy, const WeightView& w_t, int64_t col0, int64_t cols, const int32_t* idx,
              const float* act, int64_t n, float* acc) {
  const size_t offset = RowBytes(w_t.type, col0);
  const size_t bytes = RowBytes(w_t.type, cols);
  const uint8_t* rows[kMaxAxpyRows];
  for (int64_t j = 0; j < std::min(n, kPrefetchRows); ++j) {
    PrefetchRow(w_t.row(idx[j]) + offset, bytes);
  }
  for (int64_t j = 0; j < n; j += kMaxAxpyRows) {
    const int k = static_cast<int>(std::min<int64_t>(kMaxAxpyRows, n - j));
    for (int r = 0; r < k; ++r) {
      rows[r] = w_t.row(idx[j + r]) + offset;
      if (j + kPrefetchRows + r < n)
        PrefetchRow(w_t.row(idx[j + kPrefetchRows + r]) + offset, bytes);
    }
    axpy(cols, k, act + j, rows, acc);
  }
}

}  // namespace

void SparseAxpyRows(Isa isa, const WeightView& w_t, int64_t col0, int64_t cols, const int32_t* idx,
                    const float* act, int64_t n, float* out) {
  if (AxpyFor(w_t.type, isa) == nullptr) isa = Isa::kScalar;
  AxpyInto(AxpyFor(w_t.type, isa), w_t, col0, cols, idx, act, n, out);
}

bool SparseRowsSupported(GgmlType type) {
  const WeightTypeRow* row = FindWeightType(type);
  return row != nullptr && row->sparse;
}

size_t PreparedBytes(GgmlType type, int64_t n) { return RowDot::PreparedBytes(type, n); }

void PrepareActivations(GgmlType type, Isa isa, const float* x, int64_t n, void* dst) {
  RowDotOrScalar(type, isa).Prepare(x, n, dst);
}

void SparseRowDots(Isa isa, const WeightView& w, const void* x, const int32_t* idx, int64_t n,
                   float* y) {
  const RowDot dot = RowDotOrScalar(w.type, isa);
  const int64_t cols = w.cols;
  const size_t bytes = RowBytes(w.type, cols);  // of a row's data (row_bytes is the stride)
  for (int64_t j = 0; j < std::min(n, kPrefetchRows); ++j) PrefetchRow(w.row(idx[j]), bytes);
  // kRowsPerDot rows per kernel call: their loads interleave, so more of the scattered rows'
  // misses are in flight than one row's dot keeps going.
  const void* rows[RowDot::kMaxRows];
  for (int64_t j = 0; j < n; j += kRowsPerDot) {
    const int k = static_cast<int>(std::min<int64_t>(kRowsPerDot, n - j));
    for (int r = 0; r < k; ++r) {
      if (j + r + kPrefetchRows < n) PrefetchRow(w.row(idx[j + r + kPrefetchRows]), bytes);
      rows[r] = w.row(idx[j + r]);
    }
    dot.DotRows(cols, rows, k, x, y + j);
  }
}

void SparseMatVec(ThreadPool& pool, Isa isa, const WeightView& w, const void* x, const int32_t* idx,
                  int64_t n_active, float* y) {
  const size_t bytes = RowBytes(w.type, w.cols);
  RunParts(pool, PartsFor(pool, n_active, bytes), n_active, [&](int, int64_t begin, int64_t end) {
    SparseRowDots(isa, w, x, idx + begin, end - begin, y + begin);
  });
}

void SparseGateUp(ThreadPool& pool, Isa isa, const WeightView& gate, const void* x_gate,
                  const WeightView& up, const void* x_up, const int32_t* idx, int64_t n_active,
                  float* y_gate, float* y_up) {
  const RowDot gate_dot = RowDotOrScalar(gate.type, isa), up_dot = RowDotOrScalar(up.type, isa);
  const int64_t n = gate.cols;
  const size_t gate_bytes = RowBytes(gate.type, n), up_bytes = RowBytes(up.type, n);
  // Gate and up of a neuron against the same prepared x: one kernel call for the rows of
  // kRowsPerDot / 2 neurons, in the order they lie when interleaved (gate, up, gate, up);
  // otherwise one call for kRowsPerDot gate rows and one for their up rows.
  const bool shared_x = gate.type == up.type && x_gate == x_up;
  const int64_t step = shared_x ? kRowsPerDot / 2 : kRowsPerDot;
  RunParts(pool, PartsFor(pool, n_active, gate_bytes + up_bytes), n_active,
           [&](int, int64_t begin, int64_t end) {
             const void* g_rows[RowDot::kMaxRows];
             const void* u_rows[RowDot::kMaxRows];
             for (int64_t j = begin; j < end; j += step) {
               const int k = static_cast<int>(std::min<int64_t>(step, end - j));
               for (int r = 0; r < k; ++r) {
                 if (j + r + kPrefetchRows < end) {
                   PrefetchRow(gate.row(idx[j + r + kPrefetchRows]), gate_bytes);
                   PrefetchRow(up.row(idx[j + r + kPrefetchRows]), up_bytes);
                 }
                 g_rows[r] = gate.row(idx[j + r]);
                 u_rows[r] = up.row(idx[j + r]);
               }
               if (shared_x) {
                 const void* rows[RowDot::kMaxRows];
                 float out[RowDot::kMaxRows];
                 for (int r = 0; r < k; ++r) {
                   rows[2 * r] = g_rows[r];
                   rows[2 * r + 1] = u_rows[r];
                 }
                 gate_dot.DotRows(n, rows, 2 * k, x_gate, out);
                 for (int r = 0; r < k; ++r) {
                   y_gate[j + r] = out[2 * r];
                   y_up[j + r] = out[2 * r + 1];
                 }
               } else {
                 gate_dot.DotRows(n, g_rows, k, x_gate, y_gate + j);
                 up_dot.DotRows(n, u_rows, k, x_up, y_up + j);
               }
             }
           });
}

void SparseAxpy(ThreadPool& pool, Isa isa, const WeightView& w_t, const int32_t* idx,
                const float* act, int64_t n_active, float* out, SparseScratch& scratch) {
  const int64_t n = w_t.cols;
  // An ISA this CPU lacks falls back to the scalar kernels (TransposeWeight only makes down_t
  // of types that have kernels).
  if (AxpyFor(w_t.type, isa) == nullptr) isa = Isa::kScalar;
  const AxpyFn axpy = AxpyFor(w_t.type, isa);
  const AxpyFn add = AxpyFor(GgmlType::kF32, isa);
  // Drop exact zeros first so that the split below is by rows that do work.
  int32_t* nz_idx = scratch.nz_idx();
  float* nz_act = scratch.nz_act();
  int64_t m = 0;
  for (int64_t j = 0; j < n_active; ++j) {
    if (act[j] != 0.0f) {
      nz_idx[m] = idx[j];
      nz_act[m++] = act[j];
    }
  }
  const int parts = std::min(PartsFor(pool, m, w_t.row_bytes), std::max(1, scratch.n_threads()));
  RunParts(pool, parts, m, [&](int part, int64_t begin, int64_t end) {
    float* acc = part == 0 ? out : scratch.acc(part);
    std::fill_n(acc, n, 0.0f);
    AxpyInto(axpy, w_t, 0, n, nz_idx + begin, nz_act + begin, end - begin, acc);
  });
  // Explicit reduction of the other parts' accumulators into part 0's (out).
  for (int p = 1; p < parts; p += kMaxAxpyRows) {
    const int k = std::min(kMaxAxpyRows, parts - p);
    const uint8_t* rows[kMaxAxpyRows];
    float ones[kMaxAxpyRows];
    std::fill_n(ones, kMaxAxpyRows, 1.0f);
    for (int r = 0; r < k; ++r) rows[r] = reinterpret_cast<const uint8_t*>(scratch.acc(p + r));
    add(n, k, ones, rows, out);
  }
}

size_t ConvertedBytes(const TypeKernels& k, int64_t n) {
  GgmlType type;
  Isa isa;
  if (IdentifyKernels(k, &type, &isa)) return PreparedBytes(type, n);
  return RowBytes(k.vec_dot_type, n);
}

void ConvertActivations(const TypeKernels& k, Isa isa, const float* x, int64_t n, void* dst) {
  GgmlType type;
  Isa k_isa;
  if (IdentifyKernels(k, &type, &k_isa)) {
    PrepareActivations(type, k_isa, x, n, dst);
  } else if (k.vec_dot_type == GgmlType::kF32) {
    std::memcpy(dst, x, static_cast<size_t>(n) * sizeof(float));
  } else {
    KernelsFor(k.vec_dot_type, Isa::kScalar)->from_float(x, dst, n);
  }
}

void SparseMatVec(ThreadPool& pool, const TypeKernels& k, const WeightView& w, const void* x,
                  const int32_t* idx, int64_t n_active, float* y) {
  GgmlType type;
  Isa isa;
  if (IdentifyKernels(k, &type, &isa)) {
    SparseMatVec(pool, isa, w, x, idx, n_active, y);
    return;
  }
  pool.ParallelFor(n_active, 4, [&](int, int64_t begin, int64_t end) {
    for (int64_t j = begin; j < end; ++j) y[j] = k.vec_dot(w.cols, w.row(idx[j]), x);
  });
}

void AxpyTokensScratch::Reserve(int64_t max_tokens, int64_t max_rows) {
  max_tokens_ = max_tokens;
  max_rows_ = max_rows;
  idx_.assign(static_cast<size_t>(max_tokens * max_rows), 0);
  act_.assign(static_cast<size_t>(max_tokens * max_rows), 0.0f);
  count_.assign(max_tokens, 0);
}

void SparseAxpyTokens(ThreadPool& pool, Isa isa, const WeightView& w_t, const float* act, int64_t n,
                      float* out, AxpyTokensScratch& scratch) {
  // Bytes of w_t's column slice that the tokens pass over: within a core's L2 beside the
  // outputs and the lists.
  constexpr double kSliceBytes = 256 << 10;
  if (n > scratch.max_tokens_ || w_t.rows > scratch.max_rows_) {
    std::fprintf(
        stderr, "thermocline SparseAxpyTokens: %lld tokens x %lld rows, scratch for %lld x %lld\n",
        static_cast<long long>(n), static_cast<long long>(w_t.rows),
        static_cast<long long>(scratch.max_tokens_), static_cast<long long>(scratch.max_rows_));
    std::abort();
  }
  if (AxpyFor(w_t.type, isa) == nullptr) isa = Isa::kScalar;
  const AxpyFn axpy = AxpyFor(w_t.type, isa);
  const int64_t rows = w_t.rows, cols = w_t.cols;
  for (int64_t t = 0; t < n; ++t) {
    const float* a = act + t * rows;
    int32_t* idx = scratch.idx_.data() + t * rows;
    float* val = scratch.act_.data() + t * rows;
    int64_t m = 0;
    for (int64_t i = 0; i < rows; ++i) {
      if (a[i] != 0.0f) {
        idx[m] = static_cast<int32_t>(i);
        val[m++] = a[i];
      }
    }
    scratch.count_[t] = m;
  }
  const int64_t bs = TypeInfo(w_t.type).block_size;
  const double col_bytes = static_cast<double>(rows) * RowBytes(w_t.type, bs) / bs;
  const int64_t slice = std::min(
      cols, std::max<int64_t>(bs, static_cast<int64_t>(kSliceBytes / col_bytes) / bs * bs));
  const int64_t n_slices = (cols + slice - 1) / slice;
  const int parts = static_cast<int>(std::min<int64_t>(pool.size(), n_slices));
  RunParts(pool, parts, n_slices, [&](int, int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c) {
      const int64_t col0 = c * slice, width = std::min(slice, cols - col0);
      for (int64_t t = 0; t < n; ++t) {
        float* o = out + t * cols + col0;
        std::fill_n(o, width, 0.0f);
        AxpyInto(axpy, w_t, col0, width, scratch.idx_.data() + t * rows,
                 scratch.act_.data() + t * rows, scratch.count_[t], o);
      }
    }
  });
}

void SparseAxpy(ThreadPool& pool, const TypeKernels& k, const WeightView& w_t, const int32_t* idx,
                const float* act, int64_t n_active, float* out, SparseScratch& scratch) {
  GgmlType type;
  Isa isa;
  if (!IdentifyKernels(k, &type, &isa)) isa = BestIsa();
  SparseAxpy(pool, isa, w_t, idx, act, n_active, out, scratch);
}

void SparseMatVecReference(const WeightView& w, const float* x, const int32_t* idx,
                           int64_t n_active, float* y) {
  const TypeKernels* k = KernelsFor(w.type, Isa::kScalar);
  std::vector<float> row(w.cols);
  for (int64_t j = 0; j < n_active; ++j) {
    k->to_float(w.row(idx[j]), row.data(), w.cols);
    double s = 0.0;
    for (int64_t i = 0; i < w.cols; ++i) s += static_cast<double>(row[i]) * x[i];
    y[j] = static_cast<float>(s);
  }
}

void SparseAxpyReference(const WeightView& w_t, const int32_t* idx, const float* act,
                         int64_t n_active, float* out) {
  const TypeKernels* k = KernelsFor(w_t.type, Isa::kScalar);
  std::vector<float> row(w_t.cols);
  std::vector<double> acc(w_t.cols, 0.0);
  for (int64_t j = 0; j < n_active; ++j) {
    k->to_float(w_t.row(idx[j]), row.data(), w_t.cols);
    for (int64_t i = 0; i < w_t.cols; ++i) acc[i] += static_cast<double>(act[j]) * row[i];
  }
  for (int64_t i = 0; i < w_t.cols; ++i) out[i] = static_cast<float>(acc[i]);
}

namespace {
// SparseRowDots, but consecutive rows (every slot of a chunk) one per kernel call in order, as
// the dense mat-vec reads them, so the hardware prefetchers see one stream; grouped rows are
// four streams, and per-row prefetches only cost instructions there. 1.1B Q4_0 gate-first at
// 0.5, 1 thread: 11.8 → 17.0 tokens/s. Half-dense lists (the up rows) are faster grouped and
// prefetched (17.0 against 14.3 one per call).
void InOrderRowDots(Isa isa, const WeightView& w, const void* x, const int32_t* idx, int64_t n,
                    float* y) {
  if (n == 0) return;
  if (idx[n - 1] - idx[0] + 1 != n) {
    SparseRowDots(isa, w, x, idx, n, y);
    return;
  }
  const RowDot dot = RowDotOrScalar(w.type, isa);
  for (int64_t j = 0; j < n; ++j) y[j] = dot.Dot(w.cols, w.row(idx[j]), x);
}
}  // namespace

float GateActivation(FfnActivation act, float g) {
  switch (act) {
    case FfnActivation::kSilu:
      return g / (1.0f + std::exp(-g));
    case FfnActivation::kGeluTanh:
      return GeluTanh(g);
    case FfnActivation::kRelu:
    case FfnActivation::kDRelu:
      break;
  }
  return g > 0.0f ? g : 0.0f;
}

int64_t GateFirstRows(Isa isa, FfnActivation act, const WeightView& gate, const void* x_gate,
                      const WeightView& up, const void* x_up, const WeightView& down_t,
                      int32_t* idx, int64_t n, float gate_threshold, const float* scale,
                      float act_threshold, float* g, float* u, float* out, int64_t* n_up,
                      int32_t* up_idx) {
  InOrderRowDots(isa, gate, x_gate, idx, n, g);
  int64_t k = 0;
  for (int64_t j = 0; j < n; ++j) {
    const float a = GateActivation(act, g[j]);
    if (std::fabs(a) * (scale != nullptr ? scale[idx[j]] : 1.0f) > gate_threshold) {
      idx[k] = idx[j];
      g[k++] = a;
    }
  }
  if (n_up != nullptr) *n_up = k;
  if (up_idx != nullptr) std::copy_n(idx, k, up_idx);
  SparseRowDots(isa, up, x_up, idx, k, u);
  int64_t m = 0;
  for (int64_t j = 0; j < k; ++j) {
    const float v = g[j] * u[j];
    if (v != 0.0f && std::fabs(v) > act_threshold) {
      idx[m] = idx[j];
      g[m++] = v;
    }
  }
  SparseAxpyRows(isa, down_t, 0, down_t.cols, idx, g, m, out);
  return m;
}

int64_t GateFirstRowsReference(FfnActivation act, const WeightView& gate, const WeightView& up,
                               const WeightView& down_t, const float* x, int32_t* idx, int64_t n,
                               float gate_threshold, const float* scale, float act_threshold,
                               float* g, float* out) {
  std::vector<float> gv(n), uv(n);
  SparseMatVecReference(gate, x, idx, n, gv.data());
  SparseMatVecReference(up, x, idx, n, uv.data());
  int64_t m = 0;
  for (int64_t j = 0; j < n; ++j) {
    const float a = GateActivation(act, gv[j]);
    if (!(std::fabs(a) * (scale != nullptr ? scale[idx[j]] : 1.0f) > gate_threshold)) continue;
    const float v = a * uv[j];
    if (v != 0.0f && std::fabs(v) > act_threshold) {
      idx[m] = idx[j];
      g[m++] = v;
    }
  }
  std::vector<float> sum(down_t.cols);
  SparseAxpyReference(down_t, idx, g, m, sum.data());
  for (int64_t i = 0; i < down_t.cols; ++i) out[i] += sum[i];
  return m;
}

absl::StatusOr<InterleavedGateUp> InterleaveGateUp(ThreadPool& pool, const WeightView& gate,
                                                   const WeightView& up, const int32_t* order,
                                                   const WeightView* down_t) {
  const auto differ = [&](const WeightView& w) {
    return w.rows != gate.rows || w.cols != gate.cols;
  };
  if (differ(up) || (down_t != nullptr && differ(*down_t))) {
    const WeightView& other = differ(up) ? up : *down_t;
    return absl::InvalidArgumentError(
        absl::StrCat("gate (", gate.rows, "x", gate.cols, ") and ", differ(up) ? "up" : "down_t",
                     " (", other.rows, "x", other.cols, ") differ in shape: keep them separate"));
  }
  const size_t gate_bytes = RowBytes(gate.type, gate.cols), up_bytes = RowBytes(up.type, up.cols);
  const size_t down_bytes = down_t != nullptr ? RowBytes(down_t->type, down_t->cols) : 0;
  const size_t stride = gate_bytes + up_bytes + down_bytes;  // a neuron's
  HugeBytes bytes(stride * gate.rows);
  uint8_t* dst = bytes.data();
  pool.ParallelFor(gate.rows, 64, [&](int, int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const int64_t src = order != nullptr ? order[r] : r;
      uint8_t* neuron = dst + r * stride;
      std::memcpy(neuron, gate.row(src), gate_bytes);
      std::memcpy(neuron + gate_bytes, up.row(src), up_bytes);
      if (down_t != nullptr)
        std::memcpy(neuron + gate_bytes + up_bytes, down_t->row(r), down_bytes);
    }
  });
  InterleavedGateUp g;
  g.gate = {gate.type, gate.rows, gate.cols, dst, stride};
  g.up = {up.type, gate.rows, gate.cols, dst + gate_bytes, stride};
  if (down_t != nullptr) {
    g.down_t = {down_t->type, gate.rows, gate.cols, dst + gate_bytes + up_bytes, stride};
  }
  g.storage = OwnedWeight(g.gate, std::move(bytes));
  return g;
}

}  // namespace thermocline
