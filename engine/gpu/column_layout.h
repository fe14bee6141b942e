// The column-sparse layout of an input-sparse projection (engine/sparse/column_sparse.h's
// ColumnWeight) as the device reads it, CUDA-free: what whole GPU layers upload for an
// input-sparse layer (gpu_layers.h) and what the device's column-sparse mat-vec computes with.
//
// The integer forms hold W: (out, in) as `in` rows of `row_bytes`, one per input, each
// `out_pad` unsigned 8-bit (kInt8) or 4-bit (kInt4) quants u, in 64-byte lines of 64 (8-bit) or
// 128 (4-bit) outputs, and per block of 32 inputs and output an F16 scale (and min):
//   W[o][i] = scale[i / 32][o] · (u[i][o] − offset) − min[i / 32][o].
// Within a line the outputs are permuted as the CPU kernels read them; OutputOfByte8 and
// OutputOfByte4 say which output a byte (nibble) holds. kRows holds W's columns as the rows of
// a float or Q8_0 matrix (in, out).
#pragma once

#include <cstddef>
#include <cstdint>

#include "engine/ops/matmul.h"

namespace thermocline::gpu {

struct ColumnLayout {
  enum class Form : uint8_t { kNone, kRows, kInt8, kInt4 };
  Form form = Form::kNone;
  int64_t in = 0, out = 0;
  // Integer forms.
  int64_t out_pad = 0;  // outputs per row, a multiple of the outputs per line
  size_t row_bytes = 0;
  int32_t offset = 0;
  const uint8_t* values = nullptr;   // (in, row_bytes)
  const uint16_t* scales = nullptr;  // (in / 32, out_pad), F16
  const uint16_t* mins = nullptr;    // (in / 32, out_pad), F16, or null: none
  // kRows: W's columns as rows.
  WeightView rows;

  bool empty() const { return form == Form::kNone; }
};

// The output (within its line) that byte b (< 64) of a line holds: the 8-bit form's, and the
// 4-bit form's low (high = false) or high nibble. The four bytes of word w of a line hold
// consecutive outputs: OutputOfByte8(4w + k) = OutputOfByte8(4w) + k, likewise for each nibble.
constexpr int OutputOfByte8(int b) { return 16 * ((b & 15) >> 2) + 4 * (b >> 4) + (b & 3); }
constexpr int OutputOfByte4(int b, bool high) {
  return 32 * ((b & 15) >> 2) + (high ? 16 : 0) + 4 * (b >> 4) + (b & 3);
}
// What the device kernel relies on: a word's outputs from its first byte's.
static_assert([] {
  for (int b = 0; b < 64; ++b) {
    const int k = b & 3, first = b - k;
    if (OutputOfByte8(b) != OutputOfByte8(first) + k) return false;
    if (OutputOfByte4(b, false) != OutputOfByte4(first, false) + k) return false;
    if (OutputOfByte4(b, true) != OutputOfByte4(first, false) + 16 + k) return false;
  }
  return true;
}());

// How the device's column-sparse mat-vec covers a layout: `tiles` thread blocks of
// kColumnThreads threads across the outputs (one 4-byte word of each row per thread in the
// integer forms, one output in kRows), times `splits` ranges of blocks_per_split blocks of 32
// inputs, each range summed into its own partial output (splits · out floats of scratch), the
// partials then added in range order: deterministic, no atomics.
constexpr int kColumnThreads = 128;
struct ColumnGrid {
  int64_t tiles = 0, splits = 0, blocks_per_split = 0;
};
ColumnGrid ColumnGridOf(const ColumnLayout& c);

// Whether the layout's fields agree with its form as the kernels read it: the integer forms'
// rows whole lines of out_pad >= out outputs (64 per line 8-bit, 128 4-bit), inputs whole
// blocks of 32, values and scales present; the float form's rows (in, out). False for kNone.
bool ColumnLayoutConsistent(const ColumnLayout& c);

// Device bytes of the layout's allocations (values, scales, mins; or the rows), each rounded as
// MemoryBudget accounts it.
uint64_t ColumnLayoutDeviceBytes(const ColumnLayout& c);

}  // namespace thermocline::gpu
