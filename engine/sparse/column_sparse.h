// The column-sparse mat-vec of input-sparse layers: y += W[:, kept] · x[kept] for a weight
// W: (out, in) whose inputs were thresholded, reading only the kept inputs' columns.
//
// Two layouts of W, built once at load:
//  - the integer one (kInt8, kInt4): W's columns as rows of unsigned integers u, 8 or 4 bits
//    each (64 or 128 outputs per 64-byte line), with W's own block scales: in W's orientation,
//    blocks of 32 inputs per output, so
//      W[i][j] = scale[j / 32][i] · (u[j][i] − offset) − min[j / 32][i].
//    Q8_0, Q4_0, Q4_1, Q5_x, Q4_K, Q5_K and IQ4 keep their quants exactly (their scales as F16);
//    Q2_K, Q3_K and Q6_K (scales per 16) are requantized to 8 bits per 32. The kept inputs are
//    quantized to int8 per block of 32, as the dense path's activations are, so the sums are
//    integer dot products (vpdpbusd, or vpmaddubsw on AVX2, over four kept columns interleaved
//    on the fly).
//  - the float one (kFloat): W's columns as rows of InputSparseTType, summed by the float axpy
//    (sparse_ops.h's SparseAxpyRows). For float weights, inputs that are not a multiple of 32,
//    and CPUs without AVX2.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/gpu/column_layout.h"
#include "engine/ops/kernels.h"
#include "engine/ops/weight_layout.h"
#include "engine/util/huge_pages.h"
#include "engine/util/thread_pool.h"

namespace thermocline {

// Outputs per step of the integer kernels, which read 64 bytes (a cache line) of each kept row
// per step: 64 of the 8-bit form, 128 of the 4-bit one. A slice of outputs starts on a multiple
// of its form's (ColumnWeight::chunk()).
constexpr int64_t kColumnChunk = 64;
constexpr int64_t kColumnChunk4 = 128;
constexpr size_t kColumnStepBytes = 64;
// Inputs per block of scales and of the activations' quantization.
constexpr int64_t kColumnBlock = 32;

class ColumnWeight {
 public:
  enum class Form : uint8_t { kFloat, kInt8, kInt4 };

  // W laid out for the column-sparse mat-vec: the integer form when `isa` has its kernel and W's
  // type and shape allow it, else the float form.
  static absl::StatusOr<ColumnWeight> Build(ThreadPool& pool, const WeightView& w, Isa isa);
  // The matrices `parts` (same type and columns) stacked by rows into one integer-form layout:
  // parts[0]'s outputs first. For projections of the same input (q, k and v): one pass over
  // the kept rows instead of one per matrix, whose short rows (k and v) cost more per byte.
  // FailedPrecondition where the integer form does not take them; InvalidArgument where the
  // parts differ in type, layout or columns.
  static absl::StatusOr<ColumnWeight> BuildStacked(ThreadPool& pool,
                                                   absl::Span<const WeightView* const> parts,
                                                   Isa isa);
  // The form Build chooses for w on isa.
  static Form FormFor(const WeightView& w, Isa isa);
  // Bytes Build's layout of w takes on isa.
  static double BytesFor(const WeightView& w, Isa isa);

  Form form() const { return form_; }
  int64_t in() const { return in_; }
  int64_t out() const { return out_; }
  // Outputs per step of the integer form's kernels (kColumnChunk or kColumnChunk4).
  int64_t chunk() const { return form_ == Form::kInt4 ? kColumnChunk4 : kColumnChunk; }
  // RAM the layout takes.
  size_t bytes() const;
  // Bytes read per kept input (its row and its share of its block's scales).
  double bytes_per_input() const;

  // Integer form: row j's values (row_bytes() each, outputs permuted within chunks as the kernels
  // read them: column_sparse.cc's StoredByte), and block b's scales and mins (F16, out_pad).
  const uint8_t* values() const {
    const uint8_t* p = storage_.data();
    return p + (64 - reinterpret_cast<uintptr_t>(p) % 64) % 64;
  }
  size_t row_bytes() const { return row_bytes_; }
  int64_t out_pad() const { return out_pad_; }
  int32_t offset() const { return offset_; }
  const uint16_t* scales(int64_t b) const { return scales_.data() + b * out_pad_; }
  const uint16_t* mins(int64_t b) const {
    return mins_.empty() ? nullptr : mins_.data() + b * out_pad_;
  }
  // Float form: W's columns as rows.
  const WeightView& rows() const { return rows_.view; }
  // The layout as the device uploads it (engine/gpu/column_layout.h); an empty one for a
  // default-constructed ColumnWeight. Its pointers are this object's.
  gpu::ColumnLayout layout() const;

 private:
  Form form_ = Form::kFloat;
  int64_t in_ = 0, out_ = 0, out_pad_ = 0;
  size_t row_bytes_ = 0;
  int32_t offset_ = 0;
  HugeBytes storage_;  // values, from a 64-aligned start (values())
  std::vector<uint16_t> scales_, mins_;
  OwnedWeight rows_;
};

// The kept inputs of one input vector, in the forms both layouts read: the (index, value) list,
// and per block of 32 inputs with a kept entry, the entries quantized to int8 in groups of four
// (a group is padded with zero entries). Reserved once; Set never allocates.
class ColumnInput {
 public:
  void Reserve(int64_t max_in);
  // idx ascending (< max_in), val: the kept values. The pointers must outlive the kernels' use.
  void Set(const int32_t* idx, const float* val, int64_t n);

  int64_t n() const { return n_; }
  const int32_t* idx() const { return idx_; }
  const float* val() const { return val_; }
  // Blocks with a kept entry: block k is input block block(k); its groups' entries are slots
  // [begin(k), begin(k + 1)), a multiple of 4.
  int64_t n_blocks() const { return n_blocks_; }
  int32_t block(int64_t k) const { return block_[k]; }
  int32_t begin(int64_t k) const { return begin_[k]; }
  const int32_t* slot_idx() const { return slot_idx_.data(); }
  const int8_t* slot_q() const { return slot_q_.data(); }
  // x ≈ scale(k) · q over block k's slots; qsum(k) = Σ q.
  float scale(int64_t k) const { return scale_[k]; }
  int32_t qsum(int64_t k) const { return qsum_[k]; }

 private:
  const int32_t* idx_ = nullptr;
  const float* val_ = nullptr;
  int64_t n_ = 0;
  int64_t n_blocks_ = 0;
  std::vector<int32_t> block_, begin_, slot_idx_, qsum_;
  std::vector<int8_t> slot_q_;
  std::vector<float> scale_;
};

// Where part `part` of `parts` of a kept list idx: (n, ascending) begins, for threads that each
// take a share of the kept inputs through every output (their sums added after): an even share
// of the entries, its start moved on to the next block of 32 inputs so that no block is split
// (a block's int8 quantization then does not depend on the thread count). part == parts: n.
// Whole rows per thread rather than a slice of every row: a thread then reads each kept row as
// one run, which the hardware prefetchers follow (docs/sparse.md, "Input-sparse").
int64_t ColumnSplit(const int32_t* idx, int64_t n, int part, int parts);

// y[0, c1 − c0) += Σ over kept j of W[c0 + i][j] · x_j, on the calling thread. c0: a multiple of
// w.chunk(); c1 ≤ w.out().
void ColumnSparseAdd(Isa isa, const ColumnWeight& w, const ColumnInput& x, int64_t c0, int64_t c1,
                     float* y);
// The integer form's scalar reference (the same integer sums; float order may differ).
void ColumnSparseAddReference(const ColumnWeight& w, const ColumnInput& x, int64_t c0, int64_t c1,
                              float* y);

namespace column_sparse_internal {
// kernel.template operator()<kInt4, kMin>() for w's form (4-bit or 8-bit) and whether it has
// mins: the kernels' instantiations, chosen once per call.
template <class Kernel>
void ForForm(const ColumnWeight& w, Kernel&& kernel) {
  const bool min = w.mins(0) != nullptr;
  if (w.form() == ColumnWeight::Form::kInt4) {
    min ? kernel.template operator()<true, true>() : kernel.template operator()<true, false>();
  } else {
    min ? kernel.template operator()<false, true>() : kernel.template operator()<false, false>();
  }
}

// The kernels of the integer forms: AVX-512 VNNI (column_sparse_avx512.cc), and AVX2 for the
// CPUs without VNNI (column_sparse_avx2.cc).
void AddVnni(const ColumnWeight& w, const ColumnInput& x, int64_t c0, int64_t c1, float* y);
void AddAvx2(const ColumnWeight& w, const ColumnInput& x, int64_t c0, int64_t c1, float* y);

// The kernels' steps run block by block of x, chunk by chunk of a slice of `chunks` chunks
// whose line in each row starts at byte at0: a block's kept rows are read side by side, one line
// of each per step, and the next block's rows are new ones, which the hardware prefetchers pick
// up late (the shorter the rows, the more of each is read before they do): the kernels prefetch
// the lines of the step kAheadSteps on.
constexpr int64_t kAheadSteps = 8;
// The lines at byte `at` of the rows of slots [s0, s1). An asm statement: GCC 12 deletes
// __builtin_prefetch loops of this shape once they are inlined into the kernels.
inline void PrefetchRows(const uint8_t* values, size_t row_bytes, const int32_t* slot_idx,
                         int32_t s0, int32_t s1, size_t at) {
  for (int32_t s = s0; s < s1; ++s) {
    const uint8_t* line = values + slot_idx[s] * row_bytes + at;
#if defined(__x86_64__) || defined(__i386__)
    asm volatile("prefetcht0 %0" : : "m"(*line));
#else
    __builtin_prefetch(line);
#endif
  }
}
// Step `step` of a slice of `chunks` chunks, prefetched.
inline void PrefetchStep(const ColumnWeight& w, const ColumnInput& x, int64_t step, int64_t chunks,
                         size_t at0) {
  if (const int64_t k = step / chunks; k < x.n_blocks()) {
    PrefetchRows(w.values(), w.row_bytes(), x.slot_idx(), x.begin(k), x.begin(k + 1),
                 at0 + static_cast<size_t>(step % chunks) * kColumnStepBytes);
  }
}
}  // namespace column_sparse_internal

}  // namespace thermocline
