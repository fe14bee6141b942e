// Matrix products of a weight matrix with activations, parallel over the weight rows:
// mat-vec for decode (one token) and matrix-matrix for prefill (many tokens, each weight row
// read once per group of tokens).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/types/span.h"
#include "engine/ops/ggml_types.h"
#include "engine/ops/kernels.h"
#include "engine/util/thread_pool.h"

namespace thermocline {

// How a weight matrix's bytes are arranged.
enum class WeightLayout : uint8_t {
  kRows,        // row r at data + r * row_bytes, as GGUF stores it
  kQ4_0Groups,  // Q4_0 rows in interleaved groups of 16 (weight_layout.h's PackQ4_0Groups)
  kQ2_KGroups,  // Q2_K rows in interleaved groups of 16 (weight_layout.h's PackQ2_KGroups)
  kQ3_KGroups,  // Q3_K rows in interleaved groups of 16 (weight_layout.h's PackQ3_KGroups)
  kQ4_KGroups,  // Q4_K rows in interleaved groups of 16 (weight_layout.h's PackQ4_KGroups)
  kQ5_KGroups,  // Q5_K rows in interleaved groups of 16 (weight_layout.h's PackQ5_KGroups)
  kQ6_KGroups,  // Q6_K rows in interleaved groups of 16 (weight_layout.h's PackQ6_KGroups)
};

// A weight matrix: `rows` rows of `cols` elements of `type` (GGUF ne[0] = cols, ne[1] = rows),
// each row row_bytes long. Not owning. As GGUF stores it (kRows) everywhere but in the matrices
// the engine re-lays at load for the dense CPU path, which only MatMul reads: row() is
// meaningless for those (row_bytes stays a row's size, so rows * row_bytes is the matrix's).
struct WeightView {
  GgmlType type = GgmlType::kF32;
  int64_t rows = 0;
  int64_t cols = 0;
  const uint8_t* data = nullptr;
  size_t row_bytes = 0;
  WeightLayout layout = WeightLayout::kRows;
  const uint8_t* row(int64_t r) const { return data + static_cast<size_t>(r) * row_bytes; }
};

// Buffer for activations converted to a kernel's vec_dot_type. Sized once (Reserve) at load so
// that the decode loop never allocates.
class MatMulScratch {
 public:
  void Reserve(int64_t max_tokens, int64_t max_cols);
  uint8_t* data() { return buffer_.data(); }
  size_t size() const { return buffer_.size(); }

 private:
  std::vector<uint8_t> buffer_;
};

// y: (n_tokens, w.rows) = x: (n_tokens, w.cols) · wᵀ. x and y rows are contiguous.
// scratch must have been reserved for at least n_tokens × w.cols.
void MatMul(ThreadPool& pool, const WeightView& w, const float* x, int64_t n_tokens, float* y,
            MatMulScratch& scratch);
// The same with the kernels of a given ISA (one of AvailableIsas()), for tests and benchmarks.
void MatMul(ThreadPool& pool, const WeightView& w, const float* x, int64_t n_tokens, float* y,
            MatMulScratch& scratch, Isa isa);

// Several weights over the same x (attention's Q, K and V): for one token of quantized
// weights of one type, x is converted once and the rows of all of them are shared out in one
// hand-off to the pool (small K and V matrices cost a hand-off each otherwise); else one MatMul
// each. y[i]: (n_tokens, w[i]->rows).
void MatMulSameInput(ThreadPool& pool, absl::Span<const WeightView* const> w, const float* x,
                     int64_t n_tokens, absl::Span<float* const> y, MatMulScratch& scratch);

// Scalar reference of MatMul (dequantize each row, dot in float): for tests only.
void MatMulReference(const WeightView& w, const float* x, int64_t n_tokens, float* y);

}  // namespace thermocline
