// MatMul: activations are converted once into the scratch buffer (tile rows or panels for
// quantized weights, Q8_0 rows for the scalar kernels, nothing for F32 activations), then the
// weight rows are split among the pool's threads. Prefill runs the gemm kernels (GemmKernels:
// groups of 16 or 32 rows repacked once per call, all tokens over them).
// Otherwise each thread walks its rows in blocks small enough to stay in L2 and runs every group
// of up to 8 tokens over a block, so a weight row is read from memory once per call and unpacked
// once per token group (vec_dot_multi / QuantDot::dot).
#include "engine/ops/matmul.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "engine/ops/kernels_internal.h"
#include "engine/ops/weight_layout.h"

namespace thermocline {
namespace {

using ops_internal::GemmKernels;
using ops_internal::PanelRowBytes;
using ops_internal::QuantDot;
using ops_internal::TileRowBytes;

constexpr int64_t kRowBlock = 32;  // rows per chunk of work: in cache while token groups pass
constexpr int64_t kMaxGroup = 8;   // vec_dot_multi's limit
constexpr int64_t kParallelConvertElements = 1 << 15;  // below this, convert on one thread

uint8_t* Align64(uint8_t* p) {
  return reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(p) + 63) & ~uintptr_t{63});
}

[[noreturn]] void Fatal(const char* what, const WeightView& w) {
  std::fprintf(stderr, "thermocline MatMul: %s (weights %s, %lld x %lld)\n", what,
               std::string(TypeName(w.type)).c_str(), static_cast<long long>(w.rows),
               static_cast<long long>(w.cols));
  std::abort();
}

// Calls fn(begin, end) on chunks of [0, n) of `chunk` items (one call for all of it on a single
// thread), handed out to the threads as they come for more (an atomic counter): a thread that is
// descheduled or slower holds up nobody, where with a static split the call would take as long
// as its slowest part.
template <class Fn>
void ParallelChunks(ThreadPool& pool, int64_t n, int64_t chunk, const Fn& fn) {
  const int64_t n_chunks = (n + chunk - 1) / chunk;
  if (pool.size() == 1 || n_chunks == 1) {
    fn(int64_t{0}, n);
    return;
  }
  std::atomic<int64_t> next{0};
  pool.Run([&](int) {
    for (int64_t c = next.fetch_add(1, std::memory_order_relaxed); c < n_chunks;
         c = next.fetch_add(1, std::memory_order_relaxed)) {
      fn(c * chunk, std::min(n, (c + 1) * chunk));
    }
  });
}

// Runs fn(t) for every token, on all threads when there is enough work.
template <class Fn>
void ForEachToken(ThreadPool& pool, int64_t n_tokens, int64_t cols, const Fn& fn) {
  const int64_t chunk = n_tokens * cols < kParallelConvertElements ? n_tokens : 1;
  ParallelChunks(pool, n_tokens, chunk, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) fn(t);
  });
}

// y[t, r] = dot(r, t0, k, out) over rows x token groups; dot fills out[0..k) for tokens
// t0 .. t0 + k of row r. Token groups are balanced (17 tokens: 6 + 6 + 5, not 8 + 8 + 1).
template <class Dot>
void RunTiles(ThreadPool& pool, int64_t rows, int64_t n_tokens, float* y, const Dot& dot) {
  const int64_t n_groups = (n_tokens + kMaxGroup - 1) / kMaxGroup;
  // Each thread streams one contiguous share of the rows and then helps with the others' ends
  // (ThreadPool::ParallelShares): decode is all streaming, and ranges handed out in turn from
  // one counter were up to 13% slower (2-core EPYC VM, cold Q4_0 mat-vecs, docs/sparse.md). A
  // matrix of few rows (a predictor's fc1, 33) is split evenly over the threads instead of into
  // kRowBlock rows and a remainder.
  const int64_t block = std::min(kRowBlock, (rows + pool.size() - 1) / pool.size());
  pool.ParallelShares(rows, block, [&](int64_t r0, int64_t r1) {
    for (int64_t rb = r0; rb < r1; rb += kRowBlock) {
      const int64_t re = std::min(r1, rb + kRowBlock);
      for (int64_t g = 0; g < n_groups; ++g) {
        const int64_t t0 = n_tokens * g / n_groups;
        const int k = static_cast<int>(n_tokens * (g + 1) / n_groups - t0);
        for (int64_t r = rb; r < re; ++r) {
          float out[kMaxGroup];
          dot(r, t0, k, out);
          for (int j = 0; j < k; ++j) y[(t0 + j) * rows + r] = out[j];
        }
      }
    }
  });
}

// The decode side of a row-group layout: how its activations are quantized (once per token)
// and its groups' mat-vec.
struct GroupOps {
  size_t group_bytes = 0;  // of one group of kQ4GroupRows rows
  size_t act_bytes = 0;    // of one token's quantized activations
  void (*matvec)(int64_t, const uint8_t*, size_t, int64_t, const uint8_t*, float*) = nullptr;
  const ops_internal::IsaKernels* table = nullptr;
  const ops_internal::KGroupKernels* k_groups = nullptr;  // the K-quant layouts' kernels
  WeightLayout layout = WeightLayout::kRows;
  Isa isa = Isa::kScalar;  // of the Q8_K quantizer

  void Quantize(const float* x, int64_t n, uint8_t* dst) const {
    if (layout == WeightLayout::kQ4_0Groups) {
      table->q4_groups.quantize(x, n, /*offset=*/8, dst);  // the weights are w + 8
    } else {
      KernelsFor(GgmlType::kQ8_K, isa)->from_float(x, dst, n);
    }
  }
};

// The K-quants' row-group layouts: their kernels and group size.
struct KGroupLayout {
  WeightLayout layout;
  ops_internal::KGroupKernels ops_internal::IsaKernels::*kernels;
  size_t (*group_bytes)(int64_t n);
};
constexpr KGroupLayout kKGroupLayouts[] = {
    {WeightLayout::kQ2_KGroups, &ops_internal::IsaKernels::q2k_groups, ops_internal::Q2KGroupBytes},
    {WeightLayout::kQ3_KGroups, &ops_internal::IsaKernels::q3k_groups, ops_internal::Q3KGroupBytes},
    {WeightLayout::kQ4_KGroups, &ops_internal::IsaKernels::q4k_groups, ops_internal::Q4KGroupBytes},
    {WeightLayout::kQ5_KGroups, &ops_internal::IsaKernels::q5k_groups, ops_internal::Q5KGroupBytes},
    {WeightLayout::kQ6_KGroups, &ops_internal::IsaKernels::q6k_groups, ops_internal::Q6KGroupBytes},
};
const KGroupLayout* FindKGroupLayout(WeightLayout layout) {
  for (const KGroupLayout& k : kKGroupLayouts) {
    if (k.layout == layout) return &k;
  }
  return nullptr;
}

GroupOps GroupOpsFor(const WeightView& w, Isa isa) {
  GroupOps g;
  g.table = &ops_internal::TableOf(isa);
  g.layout = w.layout;
  g.isa = KernelsFor(GgmlType::kQ8_K, isa) != nullptr ? isa : Isa::kScalar;
  if (w.layout == WeightLayout::kQ4_0Groups) {
    g.group_bytes = ops_internal::Q4GroupBytes(w.cols);
    g.act_bytes = static_cast<size_t>(TileRowBytes(w.cols));
    g.matvec = g.table->q4_groups.matvec;
  } else {
    const KGroupLayout* k = FindKGroupLayout(w.layout);
    if (k == nullptr) Fatal("not a row-group layout", w);
    g.k_groups = &(g.table->*k->kernels);
    g.group_bytes = k->group_bytes(w.cols);
    g.act_bytes = RowBytes(GgmlType::kQ8_K, w.cols);
    g.matvec = g.k_groups->matvec;
  }
  return g;
}

// MatMul over row groups: x quantized once per token, then the groups shared out as RunTiles
// shares rows (decode) or as gemm row groups (prefill).
void GroupsMatMul(ThreadPool& pool, const WeightView& w, const float* x, int64_t n_tokens, float* y,
                  uint8_t* scratch_data, size_t scratch_bytes, Isa isa) {
  const GroupOps ops = GroupOpsFor(w, isa);
  const int64_t cols = w.cols, rows = w.rows;
  const size_t stride = ops.act_bytes;
  if (stride * n_tokens > scratch_bytes) Fatal("scratch too small", w);
  ForEachToken(pool, n_tokens, cols,
               [&](int64_t t) { ops.Quantize(x + t * cols, cols, scratch_data + t * stride); });
  constexpr int64_t kGroupRows = ops_internal::kQ4GroupRows;
  const size_t group_bytes = ops.group_bytes;
  const int64_t n_groups = (rows + kGroupRows - 1) / kGroupRows;
  if (n_tokens == 1) {
    const int64_t block =
        std::min(kRowBlock / kGroupRows, (n_groups + pool.size() - 1) / pool.size());
    pool.ParallelShares(n_groups, block, [&](int64_t g0, int64_t g1) {
      ops.matvec(cols, w.data + g0 * group_bytes, group_bytes,
                 std::min(rows, g1 * kGroupRows) - g0 * kGroupRows, scratch_data,
                 y + g0 * kGroupRows);
    });
    return;
  }
  if (ops.k_groups != nullptr) {
    const ops_internal::KGroupKernels& k = *ops.k_groups;
    ParallelChunks(pool, n_groups, 1, [&](int64_t g0, int64_t g1) {
      for (int64_t g = g0; g < g1; ++g) {
        const int64_t r0 = g * kGroupRows;
        k.gemm(cols, w.data + g * group_bytes, static_cast<int>(std::min(kGroupRows, rows - r0)),
               scratch_data, stride, n_tokens, y + r0, rows);
      }
    });
    return;
  }
  const ops_internal::Q4GroupKernels& k = ops.table->q4_groups;
  const int64_t per_call = k.gemm_rows / kGroupRows;
  ParallelChunks(pool, n_groups, per_call, [&](int64_t g0, int64_t g1) {
    for (int64_t g = g0; g < g1; g += per_call) {
      const int64_t r0 = g * kGroupRows;
      k.gemm(cols, w.data + g * group_bytes, group_bytes,
             static_cast<int>(std::min<int64_t>(k.gemm_rows, rows - r0)), scratch_data, stride,
             n_tokens, y + r0, rows);
    }
  });
}

// MatMulSameInput's one pass for row groups of one token: x quantized once, the groups of all
// the matrices (one layout) shared out as one range (at most 4 matrices).
void GroupsMatVecSameInput(ThreadPool& pool, absl::Span<const WeightView* const> w, const float* x,
                           absl::Span<float* const> y, MatMulScratch& scratch, Isa isa) {
  const GroupOps ops = GroupOpsFor(*w[0], isa);
  constexpr int64_t kGroupRows = ops_internal::kQ4GroupRows;
  const int64_t cols = w[0]->cols;
  uint8_t* act = Align64(scratch.data());
  if (ops.act_bytes + static_cast<size_t>(act - scratch.data()) > scratch.size()) {
    Fatal("scratch too small", *w[0]);
  }
  ops.Quantize(x, cols, act);
  const size_t group_bytes = ops.group_bytes;
  int64_t first[5] = {0};
  for (size_t i = 0; i < w.size(); ++i) {
    first[i + 1] = first[i] + (w[i]->rows + kGroupRows - 1) / kGroupRows;
  }
  pool.ParallelShares(first[w.size()], kRowBlock / kGroupRows, [&](int64_t g0, int64_t g1) {
    for (size_t i = 0; i < w.size(); ++i) {
      const int64_t begin = std::max(g0, first[i]) - first[i];
      const int64_t end = std::min(g1, first[i + 1]) - first[i];
      if (begin >= end) continue;
      const WeightView& m = *w[i];
      ops.matvec(cols, m.data + begin * group_bytes, group_bytes,
                 std::min(m.rows, end * kGroupRows) - begin * kGroupRows, act,
                 y[i] + begin * kGroupRows);
    }
  });
}

}  // namespace

void MatMulScratch::Reserve(int64_t max_tokens, int64_t max_cols) {
  const int64_t cols = (max_cols + 63) / 64 * 64;
  const size_t per_token =
      std::max({static_cast<size_t>(cols) * sizeof(float), static_cast<size_t>(PanelRowBytes(cols)),
                static_cast<size_t>(TileRowBytes(cols)), RowBytes(GgmlType::kQ8_0, cols),
                RowBytes(GgmlType::kQ8_1, cols),
                static_cast<size_t>((cols + kQK_K - 1) / kQK_K) * sizeof(BlockQ8_K)});
  const size_t bytes = static_cast<size_t>(max_tokens) * per_token + 64;
  if (buffer_.size() < bytes) buffer_.resize(bytes);
}

void MatMul(ThreadPool& pool, const WeightView& w, const float* x, int64_t n_tokens, float* y,
            MatMulScratch& scratch) {
  MatMul(pool, w, x, n_tokens, y, scratch, BestIsa());
}

void MatMul(ThreadPool& pool, const WeightView& w, const float* x, int64_t n_tokens, float* y,
            MatMulScratch& scratch, Isa isa) {
  if (n_tokens <= 0 || w.rows <= 0) return;
  uint8_t* scratch_data = Align64(scratch.data());
  const size_t pad = static_cast<size_t>(scratch_data - scratch.data());
  const size_t scratch_bytes = scratch.size() > pad ? scratch.size() - pad : 0;
  if (w.layout != WeightLayout::kRows) {
    GroupsMatMul(pool, w, x, n_tokens, y, scratch_data, scratch_bytes, isa);
    return;
  }
  const TypeKernels* kernels = KernelsFor(w.type, isa);
  if (kernels == nullptr) Fatal("no kernels for this type and ISA", w);
  const int64_t cols = w.cols;

  const GemmKernels* gemm = ops_internal::GemmFor(w.type, isa);
  if (gemm != nullptr && n_tokens >= gemm->min_tokens) {
    const uint8_t* act = reinterpret_cast<const uint8_t*>(x);
    size_t stride = static_cast<size_t>(cols) * sizeof(float);
    if (gemm->quantize != nullptr) {
      stride = gemm->row_bytes(cols);
      if (stride * n_tokens > scratch_bytes) Fatal("scratch too small", w);
      ForEachToken(pool, n_tokens, cols, [&](int64_t t) {
        gemm->quantize(x + t * cols, cols, gemm->offset, scratch_data + t * stride);
      });
      act = scratch_data;
    }
    const int64_t group = gemm->rows_per_group;
    ParallelChunks(pool, w.rows, group, [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; r += group) {
        gemm->gemm(cols, w.row(r), w.row_bytes, static_cast<int>(std::min(group, r1 - r)), act,
                   stride, n_tokens, y + r, w.rows);
      }
    });
    return;
  }
  if (const QuantDot* quant = ops_internal::QuantDotFor(w.type, isa); quant != nullptr) {
    const size_t stride = quant->row_bytes(cols);
    if (stride * n_tokens > scratch_bytes) Fatal("scratch too small", w);
    ForEachToken(pool, n_tokens, cols, [&](int64_t t) {
      quant->quantize_panel(x + t * cols, cols, quant->offset, scratch_data + t * stride);
    });
    if (n_tokens == 1 && quant->offset == -1) {
      // Q4_1 and Q5_1 (offset -1 panels): their dots sum each row in one chain of blocks, in
      // ggml's order, so a token takes kMaxDotRows rows at a time to keep several in flight.
      constexpr int64_t kRows = ops_internal::kMaxDotRows;
      pool.ParallelShares(w.rows, kRowBlock, [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; r += kRows) {
          const int k = static_cast<int>(std::min(kRows, r1 - r));
          const void* rows[kRows];
          for (int i = 0; i < k; ++i) rows[i] = w.row(r + i);
          quant->dot_rows(cols, rows, scratch_data, k, y + r);
        }
      });
      return;
    }
    RunTiles(pool, w.rows, n_tokens, y, [&](int64_t r, int64_t t0, int k, float* out) {
      quant->dot(cols, w.row(r), scratch_data + t0 * stride, stride, k, out);
    });
    return;
  }

  // vec_dot_multi on activations in vec_dot_type: F32 as given, else converted into scratch.
  const uint8_t* xs = reinterpret_cast<const uint8_t*>(x);
  size_t stride = static_cast<size_t>(cols) * sizeof(float);
  if (kernels->vec_dot_type != GgmlType::kF32) {
    const TypeKernels* x_kernels = KernelsFor(kernels->vec_dot_type, isa);
    stride = RowBytes(kernels->vec_dot_type, cols);
    if (stride * n_tokens > scratch_bytes) Fatal("scratch too small", w);
    ForEachToken(pool, n_tokens, cols, [&](int64_t t) {
      x_kernels->from_float(x + t * cols, scratch_data + t * stride, cols);
    });
    xs = scratch_data;
  }
  RunTiles(pool, w.rows, n_tokens, y, [&](int64_t r, int64_t t0, int k, float* out) {
    if (k == 1) {
      out[0] = kernels->vec_dot(cols, w.row(r), xs + t0 * stride);
    } else {
      kernels->vec_dot_multi(cols, w.row(r), xs + t0 * stride, static_cast<int64_t>(stride), k,
                             out);
    }
  });
}

void MatMulSameInput(ThreadPool& pool, absl::Span<const WeightView* const> w, const float* x,
                     int64_t n_tokens, absl::Span<float* const> y, MatMulScratch& scratch) {
  const Isa isa = BestIsa();
  const QuantDot* quant = w.empty() ? nullptr : ops_internal::QuantDotFor(w[0]->type, isa);
  constexpr size_t kMaxShared = 4;  // matrices one shared pass takes (Q, K, V and one more)
  bool shared = n_tokens == 1 && quant != nullptr && w.size() <= kMaxShared;
  for (const WeightView* m : w) {
    shared = shared && m->type == w[0]->type && m->cols == w[0]->cols && m->layout == w[0]->layout;
  }
  if (shared && w[0]->layout != WeightLayout::kRows) {
    GroupsMatVecSameInput(pool, w, x, y, scratch, isa);
    return;
  }
  if (!shared) {
    for (size_t i = 0; i < w.size(); ++i) MatMul(pool, *w[i], x, n_tokens, y[i], scratch, isa);
    return;
  }
  const int64_t cols = w[0]->cols;
  uint8_t* panel = Align64(scratch.data());
  const size_t pad = static_cast<size_t>(panel - scratch.data());
  if (quant->row_bytes(cols) + pad > scratch.size()) {
    Fatal("scratch too small", *w[0]);
  }
  quant->quantize_panel(x, cols, quant->offset, panel);
  // The matrices' rows as one range of rows, shared out as RunTiles shares a matrix's; a block
  // that crosses from one matrix into the next is run in two parts.
  int64_t first_row[kMaxShared + 1] = {0};
  for (size_t i = 0; i < w.size(); ++i) first_row[i + 1] = first_row[i] + w[i]->rows;
  const int64_t total = first_row[w.size()];
  pool.ParallelShares(total, kRowBlock, [&](int64_t r0, int64_t r1) {
    for (size_t i = 0; i < w.size(); ++i) {
      const int64_t begin = std::max(r0, first_row[i]), end = std::min(r1, first_row[i + 1]);
      const WeightView& m = *w[i];
      for (int64_t r = begin; r < end; ++r) {
        quant->dot(cols, m.row(r - first_row[i]), panel, 0, 1, y[i] + (r - first_row[i]));
      }
    }
  });
}

void MatMulReference(const WeightView& w, const float* x, int64_t n_tokens, float* y) {
  const TypeKernels* kernels = KernelsFor(w.type, Isa::kScalar);
  if (kernels == nullptr) Fatal("no kernels for this type", w);
  if (w.layout != WeightLayout::kRows) Fatal("the reference reads rows as GGUF stores them", w);
  std::vector<float> row(static_cast<size_t>(w.cols));
  for (int64_t r = 0; r < w.rows; ++r) {
    kernels->to_float(w.row(r), row.data(), w.cols);
    for (int64_t t = 0; t < n_tokens; ++t) {
      double sum = 0.0;
      for (int64_t i = 0; i < w.cols; ++i) sum += double{row[i]} * x[t * w.cols + i];
      y[t * w.rows + r] = static_cast<float>(sum);
    }
  }
}

}  // namespace thermocline
