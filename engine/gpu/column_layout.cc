#include "engine/gpu/column_layout.h"

#include <algorithm>

#include "engine/gpu/gpu_memory.h"
#include "engine/ops/ggml_types.h"

namespace thermocline::gpu {

ColumnGrid ColumnGridOf(const ColumnLayout& c) {
  // Enough thread blocks to fill a large GPU (132 SMs on an H100) about twice.
  constexpr int64_t kTargetBlocks = 256;
  ColumnGrid g;
  if (c.empty()) return g;
  const int64_t units =
      c.form == ColumnLayout::Form::kRows ? c.out : static_cast<int64_t>(c.row_bytes / 4);
  g.tiles = std::max<int64_t>((units + kColumnThreads - 1) / kColumnThreads, 1);
  const int64_t blocks = std::max<int64_t>((c.in + 31) / 32, 1);
  const int64_t want = std::clamp<int64_t>((kTargetBlocks + g.tiles - 1) / g.tiles, 1, blocks);
  g.blocks_per_split = (blocks + want - 1) / want;
  g.splits = (blocks + g.blocks_per_split - 1) / g.blocks_per_split;
  return g;
}

bool ColumnLayoutConsistent(const ColumnLayout& c) {
  switch (c.form) {
    case ColumnLayout::Form::kNone:
      return false;
    case ColumnLayout::Form::kRows:
      return c.rows.data != nullptr && c.rows.rows == c.in && c.rows.cols == c.out;
    case ColumnLayout::Form::kInt8:
    case ColumnLayout::Form::kInt4:
      break;
  }
  const bool int4 = c.form == ColumnLayout::Form::kInt4;
  const int64_t per_line = int4 ? 128 : 64;
  const uint64_t bytes = static_cast<uint64_t>(int4 ? c.out_pad / 2 : c.out_pad);
  return c.in > 0 && c.in % 32 == 0 && c.out > 0 && c.out_pad >= c.out &&
         c.out_pad % per_line == 0 && c.row_bytes == bytes && c.values != nullptr &&
         c.scales != nullptr;
}

uint64_t ColumnLayoutDeviceBytes(const ColumnLayout& c) {
  auto granules = [](uint64_t bytes) {
    return MemoryBudget::Rounded(std::max<uint64_t>(bytes, 1));
  };
  switch (c.form) {
    case ColumnLayout::Form::kNone:
      return 0;
    case ColumnLayout::Form::kRows:
      return granules(static_cast<uint64_t>(c.rows.rows) * RowBytes(c.rows.type, c.rows.cols));
    case ColumnLayout::Form::kInt8:
    case ColumnLayout::Form::kInt4:
      break;
  }
  const uint64_t scales = static_cast<uint64_t>(c.in / 32) * c.out_pad * sizeof(uint16_t);
  return granules(static_cast<uint64_t>(c.in) * c.row_bytes) + granules(scales) +
         (c.mins != nullptr ? granules(scales) : 0);
}

}  // namespace thermocline::gpu
