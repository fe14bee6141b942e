// The neuron-aware operators: row-sparse mat-vec (the per-type vec_dot kernels over the listed
// rows) and the axpy of down_t rows with per-thread accumulators.
#include "engine/sparse/sparse_ops.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace thermocline {

void SparseScratch::Reserve(int n_threads, int64_t max_cols, int64_t max_active) {
  n_threads_ = n_threads;
  cols_ = max_cols;
  acc_.assign(static_cast<size_t>(n_threads) * max_cols, 0.0f);
  row_.assign(static_cast<size_t>(n_threads) * max_cols, 0.0f);
  nz_idx_.assign(max_active, 0);
  nz_act_.assign(max_active, 0.0f);
}

size_t ConvertedBytes(const TypeKernels& k, int64_t n) { return RowBytes(k.vec_dot_type, n); }

void ConvertActivations(const TypeKernels& k, Isa isa, const float* x, int64_t n, void* dst) {
  if (k.vec_dot_type == GgmlType::kF32) {
    std::memcpy(dst, x, static_cast<size_t>(n) * sizeof(float));
    return;
  }
  const TypeKernels* conv = KernelsFor(k.vec_dot_type, isa);
  if (conv == nullptr) conv = KernelsFor(k.vec_dot_type, Isa::kScalar);
  conv->from_float(x, dst, n);
}

void SparseMatVec(ThreadPool& pool, const TypeKernels& k, const WeightView& w, const void* x,
                  const int32_t* idx, int64_t n_active, float* y) {
  const int64_t n = w.cols;
  // Grain 4: a few rows per chunk keep the chunks equal while a tiny list stays on one thread.
  pool.ParallelFor(n_active, 4, [&](int, int64_t begin, int64_t end) {
    for (int64_t j = begin; j < end; ++j) y[j] = k.vec_dot(n, w.row(idx[j]), x);
  });
}

namespace {

// acc[0..n) += a * row[0..n)
inline void Axpy(float a, const float* row, int64_t n, float* acc) {
  for (int64_t i = 0; i < n; ++i) acc[i] += a * row[i];
}

}  // namespace

void SparseAxpy(ThreadPool& pool, const TypeKernels& k, const WeightView& w_t, const int32_t* idx,
                const float* act, int64_t n_active, float* out, SparseScratch& scratch) {
  const int64_t n = w_t.cols;
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
  const bool is_f32 = w_t.type == GgmlType::kF32;
  auto accumulate = [&](int thread, int64_t begin, int64_t end, float* acc) {
    float* tmp = scratch.row(thread);
    for (int64_t j = begin; j < end; ++j) {
      const uint8_t* r = w_t.row(nz_idx[j]);
      if (is_f32) {
        Axpy(nz_act[j], reinterpret_cast<const float*>(r), n, acc);
      } else {
        k.to_float(r, tmp, n);
        Axpy(nz_act[j], tmp, n, acc);
      }
    }
  };
  const int nt = std::min<int64_t>(pool.size(), scratch.n_threads());
  if (nt <= 1 || m < 2 * nt) {
    std::fill_n(out, n, 0.0f);
    accumulate(0, 0, m, out);
    return;
  }
  pool.Run([&](int thread) {
    float* acc = scratch.acc(thread);
    std::fill_n(acc, n, 0.0f);
    if (thread >= nt) return;
    const int64_t per = (m + nt - 1) / nt;
    const int64_t begin = std::min(m, thread * per), end = std::min(m, begin + per);
    accumulate(thread, begin, end, acc);
  });
  // Explicit reduction of the per-thread accumulators, parallel over output columns.
  pool.ParallelFor(n, 64, [&](int, int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      float s = 0.0f;
      for (int t = 0; t < nt; ++t) s += scratch.acc(t)[i];
      out[i] = s;
    }
  });
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

absl::StatusOr<OwnedWeight> TransposeWeight(ThreadPool& pool, const WeightView& down) {
  const TypeKernels* src = KernelsFor(down.type);
  if (src == nullptr) {
    return absl::UnimplementedError(
        absl::StrCat("no kernels for ", TypeName(down.type), ": cannot build down_t"));
  }
  const int64_t rows = down.rows, cols = down.cols;  // down: (n_embd, n_ff)
  GgmlType type = down.type;
  if (rows % TypeInfo(type).block_size != 0) type = GgmlType::kF32;
  const TypeKernels* dst = KernelsFor(type);
  // Dequantize down once (rows, cols), then write each transposed row in `type`.
  std::vector<float> full(static_cast<size_t>(rows) * cols);
  pool.ParallelFor(rows, 16, [&](int, int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) src->to_float(down.row(r), full.data() + r * cols, cols);
  });
  OwnedWeight w;
  w.view.type = type;
  w.view.rows = cols;
  w.view.cols = rows;
  w.view.row_bytes = RowBytes(type, rows);
  w.data.resize(w.view.row_bytes * cols);
  w.view.data = w.data.data();
  std::vector<float> tmp(static_cast<size_t>(pool.size()) * rows);
  pool.ParallelFor(cols, 16, [&](int thread, int64_t begin, int64_t end) {
    float* t = tmp.data() + thread * rows;
    for (int64_t c = begin; c < end; ++c) {
      for (int64_t r = 0; r < rows; ++r) t[r] = full[r * cols + c];
      dst->from_float(t, w.data.data() + c * w.view.row_bytes, rows);
    }
  });
  return w;
}

OwnedWeight MakeWeight(GgmlType type, const float* values, int64_t rows, int64_t cols) {
  OwnedWeight w;
  w.view.type = type;
  w.view.rows = rows;
  w.view.cols = cols;
  w.view.row_bytes = RowBytes(type, cols);
  w.data.resize(w.view.row_bytes * rows);
  w.view.data = w.data.data();
  KernelsFor(type)->from_float(values, w.data.data(), rows * cols);
  return w;
}

}  // namespace thermocline
