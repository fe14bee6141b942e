// Weight matrices built at load instead of mapped from the file: OwnedWeight (a matrix of any
// type over its own storage, on huge pages where scattered rows cost no TLB miss each), the
// transpose of a matrix (the sparse FFN's down_t, a rebuilt ffn_down), a permutation of its
// rows, a matrix made from floats, and Q4_0 and the K-quants re-laid in interleaved groups of
// rows for decode.
#pragma once

#include <cstdint>
#include <utility>

#include "absl/status/statusor.h"
#include "engine/ops/ggml_types.h"
#include "engine/ops/kernels.h"
#include "engine/ops/matmul.h"
#include "engine/util/huge_pages.h"
#include "engine/util/thread_pool.h"

namespace thermocline {

// An owned weight matrix built once at load (down_t, interleaved gate/up). Move-only: `view`
// points into `data` (or, with `data` empty, into a mapped file), and a copy would point into
// the original.
struct OwnedWeight {
  WeightView view;
  HugeBytes data;  // on huge pages: the sparse operators read scattered rows

  OwnedWeight() = default;
  OwnedWeight(WeightView v, HugeBytes d) : view(v), data(std::move(d)) {}
  OwnedWeight(OwnedWeight&&) noexcept = default;
  OwnedWeight& operator=(OwnedWeight&&) noexcept = default;
  OwnedWeight(const OwnedWeight&) = delete;
  OwnedWeight& operator=(const OwnedWeight&) = delete;

  // A (rows, cols) matrix of `type`, its view over its own storage, uninitialized: the caller
  // writes every row.
  static OwnedWeight Allocate(GgmlType type, int64_t rows, int64_t cols);
};

// The type TransposeWeight gives the transpose of `down` (the type table's down_t type, F32 when
// its blocks do not divide down.rows).
GgmlType DownTType(const WeightView& down);
// down_t: (down.cols, down.rows) of the type table's down_t type for down's type (its own type
// for float, Q8_0 and Q4_0 weights, Q8_0 for the others), or F32 when that type's block size
// does not divide down.rows. Parallel over the pool. With `order` (a permutation
// of down.cols entries), row k of down_t is column order[k] of down.
absl::StatusOr<OwnedWeight> TransposeWeight(ThreadPool& pool, const WeightView& down,
                                            const int32_t* order = nullptr);
// The same into rows of `type` (a type with kernels whose block size divides down.rows;
// InvalidArgument otherwise).
absl::StatusOr<OwnedWeight> TransposeWeightAs(ThreadPool& pool, const WeightView& down,
                                              GgmlType type, const int32_t* order = nullptr);
// Row k of the result is row order[k] of w, k < n: a copy, on huge pages.
OwnedWeight GatherRows(ThreadPool& pool, const WeightView& w, const int32_t* order, int64_t n);
// w's rows as they are (kRows), copied onto huge pages, parallel over the pool: what the dense
// path reads for a type without row groups instead of the file's mapping, whose 4 KB pages cost
// a mat-vec the hardware prefetchers' run at every page and a TLB miss each (one Zen 5 core:
// 15 GB/s of F16 or Q8_0 weights from the mapping, 23-25 GB/s from the copy).
OwnedWeight CopyWeight(ThreadPool& pool, const WeightView& w);
// An F32 or F16 weight over a copy of `values`: (rows, cols).
OwnedWeight MakeWeight(GgmlType type, const float* values, int64_t rows, int64_t cols);

// Q4_0 rows in groups of 16 with their blocks interleaved (WeightLayout::kQ4_0Groups; the
// bytes as kernels_internal.h draws them): the layout the dense CPU path's mat-vec streams as one
// run of 16 rows at a time, each row in its own lane, with no horizontal sum per row. The same
// bytes as the rows (plus a zero-padded last group and 64-byte alignment per group); only
// MatMul reads it. w: a kRows Q4_0 matrix. Parallel over the pool.
OwnedWeight PackQ4_0Groups(ThreadPool& pool, const WeightView& w);
// Row r of a kQ4_0Groups matrix as GGUF stores it (cols / 32 blocks into `row`): for tests.
void UnpackQ4_0GroupRow(const WeightView& w, int64_t r, void* row);

// Q2_K rows in groups of 16 (WeightLayout::kQ2_KGroups; kernels_internal.h draws the bytes):
// the rows' bytes rearranged, no more of them. w: a kRows Q2_K matrix. Parallel over the pool.
OwnedWeight PackQ2_KGroups(ThreadPool& pool, const WeightView& w);
// Row r of a kQ2_KGroups matrix as GGUF stores it: for tests and the prefill's gemm.
void UnpackQ2_KGroupRow(const WeightView& w, int64_t r, void* row);
// Q3_K rows in groups of 16 (WeightLayout::kQ3_KGroups; kernels_internal.h draws the bytes):
// the rows' quant and hmask bytes rearranged, the scales unpacked to a byte each (5.5% more
// bytes than the rows). w: a kRows Q3_K matrix. Parallel over the pool.
OwnedWeight PackQ3_KGroups(ThreadPool& pool, const WeightView& w);
// Row r of a kQ3_KGroups matrix as GGUF stores it (the scales packed again): for tests and the
// prefill's gemm.
void UnpackQ3_KGroupRow(const WeightView& w, int64_t r, void* row);
// Q4_K rows in groups of 16 with their super-blocks interleaved (WeightLayout::kQ4_KGroups;
// kernels_internal.h draws the bytes): as PackQ4_0Groups, for Q4_K, with each super-block's
// scales and mins unpacked to a byte each (2.8% more bytes than the rows). w: a kRows Q4_K
// matrix. Parallel over the pool.
OwnedWeight PackQ4_KGroups(ThreadPool& pool, const WeightView& w);
// Row r of a kQ4_KGroups matrix as GGUF stores it (cols / 256 super-blocks into `row`, the
// scales packed again): for tests.
void UnpackQ4_KGroupRow(const WeightView& w, int64_t r, void* row);
// Q5_K rows in groups of 16 (WeightLayout::kQ5_KGroups; kernels_internal.h draws the bytes):
// PackQ4_KGroups' record with the weights' fifth bits rearranged beside it (2.3% more bytes
// than the rows). w: a kRows Q5_K matrix. Parallel over the pool.
OwnedWeight PackQ5_KGroups(ThreadPool& pool, const WeightView& w);
// Row r of a kQ5_KGroups matrix as GGUF stores it: for tests.
void UnpackQ5_KGroupRow(const WeightView& w, int64_t r, void* row);
// Q6_K rows in groups of 16 (WeightLayout::kQ6_KGroups; kernels_internal.h draws the bytes):
// the same number of bytes as the rows, re-encoded, plus 32 bytes of padding per 16 rows and
// super-block (1%). w: a kRows Q6_K matrix. Parallel over the pool.
OwnedWeight PackQ6_KGroups(ThreadPool& pool, const WeightView& w);
// Row r of a kQ6_KGroups matrix as GGUF stores it: for tests.
void UnpackQ6_KGroupRow(const WeightView& w, int64_t r, void* row);

// The row-group copy of a kRows matrix for its type: PackQ4_0Groups or PackQ2_KGroups ...
// PackQ6_KGroups; for any other type an OwnedWeight without data
// (the type has no groups).
OwnedWeight PackRowGroups(ThreadPool& pool, const WeightView& w);

}  // namespace thermocline
