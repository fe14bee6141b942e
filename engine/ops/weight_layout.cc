// Weight matrices the engine builds at load rather than maps from the file: an owned matrix of
// any type on huge pages, a matrix's transpose (down_t), a permutation of its rows, a matrix
// made from floats, Q4_0 and Q4_K in row groups. Used by the model loader, the sparse FFN, the
// device uploads and the engine's dense re-layout.
#include "engine/ops/weight_layout.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/ops/kernels_internal.h"
#include "engine/ops/quants_ref.h"
#include "engine/ops/type_table.h"

namespace thermocline {
namespace {

// Columns TransposeWeight gathers at once (rounded up to whole blocks of the type): a band of
// a 4096-row matrix is 512 KB of floats, within L2.
constexpr int64_t kTransposeBand = 32;

constexpr int64_t kGroupRows = ops_internal::kQ4GroupRows;

// A kRows matrix re-laid in groups of kGroupRows rows, group_bytes each: allocated, zeroed (the
// last group's padding rows and any padding of a group stay zero), then fill(group, i, row)
// writes row i of each group from the matrix's row, parallel over the groups. A huge allocation
// is zero already and is not written twice.
template <class Fill>
OwnedWeight PackGroups(ThreadPool& pool, const WeightView& w, WeightLayout layout,
                       size_t group_bytes, const Fill& fill) {
  const int64_t n_groups = (w.rows + kGroupRows - 1) / kGroupRows;
  OwnedWeight p;
  p.view = w;
  p.view.layout = layout;
  p.data.resize(group_bytes * n_groups);
  p.view.data = p.data.data();
  const bool zero = FreshAllocationIsZero(p.data.size());
  pool.ParallelFor(n_groups, 16, [&](int, int64_t begin, int64_t end) {
    for (int64_t g = begin; g < end; ++g) {
      uint8_t* group = p.data.data() + g * group_bytes;
      if (!zero) std::memset(group, 0, group_bytes);
      for (int64_t i = 0; i < kGroupRows && g * kGroupRows + i < w.rows; ++i) {
        fill(group, i, w.row(g * kGroupRows + i));
      }
    }
  });
  return p;
}

}  // namespace

OwnedWeight OwnedWeight::Allocate(GgmlType type, int64_t rows, int64_t cols) {
  OwnedWeight w;
  w.view.type = type;
  w.view.rows = rows;
  w.view.cols = cols;
  w.view.row_bytes = RowBytes(type, cols);
  w.data.resize(w.view.row_bytes * rows);
  w.view.data = w.data.data();
  return w;
}

OwnedWeight MakeWeight(GgmlType type, const float* values, int64_t rows, int64_t cols) {
  OwnedWeight w = OwnedWeight::Allocate(type, rows, cols);
  QuantizeWeights(*KernelsFor(type), values, w.data.data(), rows * cols);
  return w;
}

GgmlType DownTType(const WeightView& down) {
  const WeightTypeRow* row = FindWeightType(down.type);
  GgmlType type = row != nullptr ? row->down_t : GgmlType::kF32;
  if (down.rows % TypeInfo(type).block_size != 0) type = GgmlType::kF32;
  return type;
}

absl::StatusOr<OwnedWeight> TransposeWeight(ThreadPool& pool, const WeightView& down,
                                            const int32_t* order) {
  // The table's down_t type: the same for float, Q8_0 and Q4_0 weights, Q8_0 for the others
  // (type_table.cc says why); F32 when its blocks do not divide the rows.
  return TransposeWeightAs(pool, down, DownTType(down), order);
}

absl::StatusOr<OwnedWeight> TransposeWeightAs(ThreadPool& pool, const WeightView& down,
                                              GgmlType type, const int32_t* order) {
  const WeightTypeRow* row = FindWeightType(down.type);
  if (row == nullptr) {
    return absl::UnimplementedError(
        absl::StrCat("no kernels for ", TypeName(down.type), ": cannot build down_t"));
  }
  const TypeKernels* src = KernelsFor(down.type);
  const int64_t rows = down.rows, cols = down.cols;  // down: (n_embd, n_ff)
  const TypeKernels* dst = KernelsFor(type);
  if (dst == nullptr || FindWeightType(type) == nullptr || rows % TypeInfo(type).block_size != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot transpose ", rows, " rows into ", TypeName(type), " rows"));
  }
  std::vector<int32_t> row_of(cols);  // source column → its row of down_t
  for (int64_t k = 0; k < cols; ++k) {
    row_of[order != nullptr ? order[k] : k] = static_cast<int32_t>(k);
  }
  // Down's columns in bands of whole blocks, each band's blocks dequantized row by row into its
  // columns' buffers, then each column quantized into its row of down_t: down is read once, in
  // order, and nothing the size of down is ever dequantized (a whole F32 copy, read column by
  // column, made a 1.1B model's load take 6 s).
  const int64_t block = TypeInfo(down.type).block_size;
  const int64_t band = (kTransposeBand + block - 1) / block * block;
  const size_t block_bytes = static_cast<size_t>(TypeInfo(down.type).type_size);
  OwnedWeight w = OwnedWeight::Allocate(type, cols, rows);
  // A column's buffer is a line longer than its rows: at a stride of a multiple of 4 KB every
  // column's next line falls into the same L1 set, and the gather took most of the load.
  const int64_t stride = (rows + 15) / 16 * 16 + 16;
  const size_t per_thread = static_cast<size_t>(band) * (stride + 1);
  std::vector<float> buffers(static_cast<size_t>(pool.size()) * per_thread);
  pool.ParallelFor((cols + band - 1) / band, 1, [&](int thread, int64_t begin, int64_t end) {
    float* column = buffers.data() + thread * per_thread;  // (band, stride)
    float* values = column + band * stride;                // (band) one row's band
    for (int64_t b = begin; b < end; ++b) {
      const int64_t c0 = b * band, width = std::min(band, cols - c0);
      const size_t offset = static_cast<size_t>(c0 / block) * block_bytes;
      for (int64_t r = 0; r < rows; ++r) {
        src->to_float(down.row(r) + offset, values, width);
        for (int64_t j = 0; j < width; ++j) column[j * stride + r] = values[j];
      }
      for (int64_t j = 0; j < width; ++j) {
        QuantizeWeights(*dst, column + j * stride,
                        w.data.data() + row_of[c0 + j] * w.view.row_bytes, rows);
      }
    }
  });
  return w;
}

OwnedWeight GatherRows(ThreadPool& pool, const WeightView& w, const int32_t* order, int64_t n) {
  OwnedWeight g = OwnedWeight::Allocate(w.type, n, w.cols);
  const size_t bytes = RowBytes(w.type, w.cols);
  pool.ParallelFor(n, 64, [&](int, int64_t begin, int64_t end) {
    for (int64_t k = begin; k < end; ++k) {
      std::memcpy(g.data.data() + k * g.view.row_bytes, w.row(order[k]), bytes);
    }
  });
  return g;
}

OwnedWeight CopyWeight(ThreadPool& pool, const WeightView& w) {
  OwnedWeight c = OwnedWeight::Allocate(w.type, w.rows, w.cols);
  const size_t bytes = RowBytes(w.type, w.cols);
  pool.ParallelFor(w.rows, 64, [&](int, int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      std::memcpy(c.data.data() + r * c.view.row_bytes, w.row(r), bytes);
    }
  });
  return c;
}

OwnedWeight PackQ4_0Groups(ThreadPool& pool, const WeightView& w) {
  const int64_t nb = w.cols / kQK4_0;
  return PackGroups(
      pool, w, WeightLayout::kQ4_0Groups, ops_internal::Q4GroupBytes(w.cols),
      [&](uint8_t* group, int64_t i, const uint8_t* r) {
        const auto* row = reinterpret_cast<const BlockQ4_0*>(r);
        auto* scales = reinterpret_cast<uint16_t*>(group + nb * ops_internal::kQ4GroupBlockBytes);
        for (int64_t b = 0; b < nb; ++b) {
          uint8_t* q = group + b * ops_internal::kQ4GroupBlockBytes;
          for (int c = 0; c < 4; ++c) {
            std::memcpy(q + (c * kGroupRows + i) * 4, row[b].qs + 4 * c, 4);
          }
          scales[b * kGroupRows + i] = row[b].d;
        }
      });
}

void UnpackQ4_0GroupRow(const WeightView& w, int64_t r, void* row) {
  constexpr int64_t kRows = ops_internal::kQ4GroupRows;
  const int64_t nb = w.cols / kQK4_0, i = r % kRows;
  const uint8_t* group = w.data + r / kRows * ops_internal::Q4GroupBytes(w.cols);
  const auto* scales =
      reinterpret_cast<const uint16_t*>(group + nb * ops_internal::kQ4GroupBlockBytes);
  auto* out = static_cast<BlockQ4_0*>(row);
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* q = group + b * ops_internal::kQ4GroupBlockBytes;
    for (int c = 0; c < 4; ++c) std::memcpy(out[b].qs + 4 * c, q + (c * kRows + i) * 4, 4);
    out[b].d = scales[b * kRows + i];
  }
}

namespace {

// Row i's parts of a Q4_K or Q5_K super-block record (kernels_internal.h): the low 4 bits of the
// weights at rec, the scales and mins unpacked from sc on.
template <class Block>
void PackKQuantsAndScales(const Block& b, int64_t i, uint8_t* rec, uint8_t* sc) {
  for (int j = 0; j < 4; ++j) {
    for (int c = 0; c < 8; ++c) {
      std::memcpy(rec + ((j * 8 + c) * kGroupRows + i) * 4, b.qs + 32 * j + 4 * c, 4);
    }
  }
  uint8_t* m = sc + 8 * kGroupRows;
  for (int s = 0; s < 8; ++s) {
    int scale, min;
    ops_internal::Q4KScaleMin(b.scales, s, &scale, &min);
    sc[s * kGroupRows + i] = static_cast<uint8_t>(scale);
    m[(s / 2 * kGroupRows + i) * 2 + s % 2] = static_cast<uint8_t>(min);
  }
  auto* d = reinterpret_cast<uint16_t*>(m + 8 * kGroupRows);
  d[i] = b.d;
  d[kGroupRows + i] = b.dmin;
}

template <class Block>
void UnpackKQuantsAndScales(const uint8_t* rec, const uint8_t* sc, int64_t i, Block& out) {
  for (int j = 0; j < 4; ++j) {
    for (int c = 0; c < 8; ++c) {
      std::memcpy(out.qs + 32 * j + 4 * c, rec + ((j * 8 + c) * kGroupRows + i) * 4, 4);
    }
  }
  const uint8_t* m = sc + 8 * kGroupRows;
  uint8_t s[8], mn[8];
  for (int k = 0; k < 8; ++k) {
    s[k] = sc[k * kGroupRows + i];
    mn[k] = m[(k / 2 * kGroupRows + i) * 2 + k % 2];
  }
  // The 12-byte packing Q4KScaleMin reads: 6 bits of scales and mins 0..3 with the top two
  // bits of 4..7 above them, and the low 4 bits of 4..7 in bytes 8..11.
  for (int j = 0; j < 4; ++j) {
    out.scales[j] = static_cast<uint8_t>(s[j] | (s[j + 4] >> 4) << 6);
    out.scales[j + 4] = static_cast<uint8_t>(mn[j] | (mn[j + 4] >> 4) << 6);
    out.scales[j + 8] = static_cast<uint8_t>((s[j + 4] & 0xF) | (mn[j + 4] & 0xF) << 4);
  }
  const auto* d = reinterpret_cast<const uint16_t*>(m + 8 * kGroupRows);
  out.d = d[i];
  out.dmin = d[kGroupRows + i];
}

// Where Q5_K's row groups keep the qh bytes 4c .. 4c+3 of row i, in a super-block's record.
size_t Q5HighOffset(int c, int64_t i) {
  return static_cast<size_t>(ops_internal::kQ4KGroupQuantBytes + (c * kGroupRows + i) * 4);
}

}  // namespace

OwnedWeight PackQ4_KGroups(ThreadPool& pool, const WeightView& w) {
  const int64_t nsb = w.cols / kQK_K;
  return PackGroups(pool, w, WeightLayout::kQ4_KGroups, ops_internal::Q4KGroupBytes(w.cols),
                    [&](uint8_t* group, int64_t i, const uint8_t* r) {
                      const auto* row = reinterpret_cast<const BlockQ4_K*>(r);
                      for (int64_t sb = 0; sb < nsb; ++sb) {
                        uint8_t* rec = group + sb * ops_internal::kQ4KGroupSuperBytes;
                        PackKQuantsAndScales(row[sb], i, rec,
                                             rec + ops_internal::kQ4KGroupQuantBytes);
                      }
                    });
}

void UnpackQ4_KGroupRow(const WeightView& w, int64_t r, void* row) {
  const int64_t nsb = w.cols / kQK_K, i = r % kGroupRows;
  const uint8_t* group = w.data + r / kGroupRows * ops_internal::Q4KGroupBytes(w.cols);
  auto* out = static_cast<BlockQ4_K*>(row);
  for (int64_t sb = 0; sb < nsb; ++sb) {
    const uint8_t* rec = group + sb * ops_internal::kQ4KGroupSuperBytes;
    UnpackKQuantsAndScales(rec, rec + ops_internal::kQ4KGroupQuantBytes, i, out[sb]);
  }
}

OwnedWeight PackQ5_KGroups(ThreadPool& pool, const WeightView& w) {
  const int64_t nsb = w.cols / kQK_K;
  constexpr int64_t kScales = ops_internal::kQ4KGroupQuantBytes + ops_internal::kQ5KGroupHighBytes;
  return PackGroups(pool, w, WeightLayout::kQ5_KGroups, ops_internal::Q5KGroupBytes(w.cols),
                    [&](uint8_t* group, int64_t i, const uint8_t* r) {
                      const auto* row = reinterpret_cast<const BlockQ5_K*>(r);
                      for (int64_t sb = 0; sb < nsb; ++sb) {
                        uint8_t* rec = group + sb * ops_internal::kQ5KGroupSuperBytes;
                        PackKQuantsAndScales(row[sb], i, rec, rec + kScales);
                        for (int c = 0; c < 8; ++c) {
                          std::memcpy(rec + Q5HighOffset(c, i), row[sb].qh + 4 * c, 4);
                        }
                      }
                    });
}

void UnpackQ5_KGroupRow(const WeightView& w, int64_t r, void* row) {
  constexpr int64_t kScales = ops_internal::kQ4KGroupQuantBytes + ops_internal::kQ5KGroupHighBytes;
  const int64_t nsb = w.cols / kQK_K, i = r % kGroupRows;
  const uint8_t* group = w.data + r / kGroupRows * ops_internal::Q5KGroupBytes(w.cols);
  auto* out = static_cast<BlockQ5_K*>(row);
  for (int64_t sb = 0; sb < nsb; ++sb) {
    const uint8_t* rec = group + sb * ops_internal::kQ5KGroupSuperBytes;
    UnpackKQuantsAndScales(rec, rec + kScales, i, out[sb]);
    for (int c = 0; c < 8; ++c) std::memcpy(out[sb].qh + 4 * c, rec + Q5HighOffset(c, i), 4);
  }
}

namespace {

// Where Q6_K's row groups keep part p of chunk k of half h of row i, in a super-block's record.
size_t Q6ChunkOffset(int h, int k, int p, int64_t i) {
  return static_cast<size_t>((((h * 8 + k) * 3 + p) * ops_internal::kQ4GroupRows + i) * 4);
}

// The 6-bit weights (0..63) of element 128h + 32s + l of a Q6_K block, streams s < 4, l < 32:
// ggml's layout keeps their low 4 bits in ql[64h + l] (s 0, 2) and ql[64h + 32 + l] (s 1, 3),
// their high 2 bits in qh[32h + l], 2 bits per stream.
void Q6Weights(const BlockQ6_K& b, int h, int l, int v[4]) {
  const uint8_t lo = b.ql[64 * h + l], hi = b.ql[64 * h + 32 + l], qh = b.qh[32 * h + l];
  v[0] = (lo & 0x0F) | (qh & 0x03) << 4;
  v[1] = (hi & 0x0F) | (qh & 0x0C) << 2;
  v[2] = (lo >> 4) | (qh & 0x30);
  v[3] = (hi >> 4) | (qh & 0xC0) >> 2;
}

}  // namespace

OwnedWeight PackQ6_KGroups(ThreadPool& pool, const WeightView& w) {
  const int64_t nsb = w.cols / kQK_K;
  return PackGroups(pool, w, WeightLayout::kQ6_KGroups, ops_internal::Q6KGroupBytes(w.cols),
                    [&](uint8_t* group, int64_t i, const uint8_t* r) {
                      const auto* row = reinterpret_cast<const BlockQ6_K*>(r);
                      for (int64_t sb = 0; sb < nsb; ++sb) {
                        uint8_t* rec = group + sb * ops_internal::kQ6KGroupSuperBytes;
                        for (int h = 0; h < 2; ++h) {
                          for (int k = 0; k < 8; ++k) {
                            for (int b = 0; b < 4; ++b) {
                              int v[4];
                              Q6Weights(row[sb], h, 4 * k + b, v);
                              uint8_t part[3];
                              ops_internal::Q6GroupEncode(v, part);
                              for (int p = 0; p < 3; ++p)
                                rec[Q6ChunkOffset(h, k, p, i) + b] = part[p];
                            }
                          }
                        }
                        uint8_t* sc = rec + ops_internal::kQ6KGroupQuantBytes;
                        for (int s = 0; s < 16; ++s) {
                          sc[s * kGroupRows + i] = static_cast<uint8_t>(row[sb].scales[s]);
                        }
                        reinterpret_cast<uint16_t*>(sc + 16 * kGroupRows)[i] = row[sb].d;
                      }
                    });
}

OwnedWeight PackQ2_KGroups(ThreadPool& pool, const WeightView& w) {
  const int64_t nsb = w.cols / kQK_K;
  return PackGroups(pool, w, WeightLayout::kQ2_KGroups, ops_internal::Q2KGroupBytes(w.cols),
                    [&](uint8_t* group, int64_t i, const uint8_t* r) {
                      const auto* row = reinterpret_cast<const BlockQ2_K*>(r);
                      for (int64_t sb = 0; sb < nsb; ++sb) {
                        uint8_t* rec = group + sb * ops_internal::kQ2KGroupSuperBytes;
                        for (int h = 0; h < 2; ++h) {
                          for (int k = 0; k < 8; ++k) {
                            std::memcpy(rec + ((h * 8 + k) * kGroupRows + i) * 4,
                                        row[sb].qs + 32 * h + 4 * k, 4);
                          }
                        }
                        uint8_t* sc = rec + ops_internal::kQ2KGroupQuantBytes;
                        for (int j = 0; j < 8; ++j) {
                          std::memcpy(sc + (j * kGroupRows + i) * 2, row[sb].scales + 2 * j, 2);
                        }
                        auto* d = reinterpret_cast<uint16_t*>(sc + 16 * kGroupRows);
                        d[i] = row[sb].d;
                        d[kGroupRows + i] = row[sb].dmin;
                      }
                    });
}

void UnpackQ2_KGroupRow(const WeightView& w, int64_t r, void* row) {
  const int64_t nsb = w.cols / kQK_K, i = r % kGroupRows;
  const uint8_t* group = w.data + r / kGroupRows * ops_internal::Q2KGroupBytes(w.cols);
  auto* out = static_cast<BlockQ2_K*>(row);
  for (int64_t sb = 0; sb < nsb; ++sb) {
    const uint8_t* rec = group + sb * ops_internal::kQ2KGroupSuperBytes;
    for (int h = 0; h < 2; ++h) {
      for (int k = 0; k < 8; ++k) {
        std::memcpy(out[sb].qs + 32 * h + 4 * k, rec + ((h * 8 + k) * kGroupRows + i) * 4, 4);
      }
    }
    const uint8_t* sc = rec + ops_internal::kQ2KGroupQuantBytes;
    for (int j = 0; j < 8; ++j) {
      std::memcpy(out[sb].scales + 2 * j, sc + (j * kGroupRows + i) * 2, 2);
    }
    const auto* d = reinterpret_cast<const uint16_t*>(sc + 16 * kGroupRows);
    out[sb].d = d[i];
    out[sb].dmin = d[kGroupRows + i];
  }
}

OwnedWeight PackQ3_KGroups(ThreadPool& pool, const WeightView& w) {
  const int64_t nsb = w.cols / kQK_K;
  constexpr int64_t kHm = 2 * 8 * kGroupRows * 4;  // where the hmask words start
  return PackGroups(
      pool, w, WeightLayout::kQ3_KGroups, ops_internal::Q3KGroupBytes(w.cols),
      [&](uint8_t* group, int64_t i, const uint8_t* r) {
        const auto* row = reinterpret_cast<const BlockQ3_K*>(r);
        for (int64_t sb = 0; sb < nsb; ++sb) {
          uint8_t* rec = group + sb * ops_internal::kQ3KGroupSuperBytes;
          for (int k = 0; k < 8; ++k) {
            for (int h = 0; h < 2; ++h) {
              std::memcpy(rec + ((h * 8 + k) * kGroupRows + i) * 4, row[sb].qs + 32 * h + 4 * k, 4);
            }
            std::memcpy(rec + kHm + (k * kGroupRows + i) * 4, row[sb].hmask + 4 * k, 4);
          }
          int32_t scales[16];
          ops_internal::Q3KScales(row[sb].scales, scales);
          uint8_t* sc = rec + ops_internal::kQ3KGroupQuantBytes;
          for (int s = 0; s < 16; ++s) {
            sc[s * kGroupRows + i] = static_cast<uint8_t>(scales[s] + 32);
          }
          reinterpret_cast<uint16_t*>(sc + 16 * kGroupRows)[i] = row[sb].d;
        }
      });
}

void UnpackQ3_KGroupRow(const WeightView& w, int64_t r, void* row) {
  constexpr int64_t kHm = 2 * 8 * kGroupRows * 4;
  const int64_t nsb = w.cols / kQK_K, i = r % kGroupRows;
  const uint8_t* group = w.data + r / kGroupRows * ops_internal::Q3KGroupBytes(w.cols);
  auto* out = static_cast<BlockQ3_K*>(row);
  for (int64_t sb = 0; sb < nsb; ++sb) {
    const uint8_t* rec = group + sb * ops_internal::kQ3KGroupSuperBytes;
    for (int k = 0; k < 8; ++k) {
      for (int h = 0; h < 2; ++h) {
        std::memcpy(out[sb].qs + 32 * h + 4 * k, rec + ((h * 8 + k) * kGroupRows + i) * 4, 4);
      }
      std::memcpy(out[sb].hmask + 4 * k, rec + kHm + (k * kGroupRows + i) * 4, 4);
    }
    // The 12-byte packing Q3KScales reads: the low 4 bits of scales 0..7 and 8..15 as the
    // nibbles of bytes 0..7, the high 2 bits of scale j at bits 2(j / 4) of byte 8 + j % 4.
    const uint8_t* sc = rec + ops_internal::kQ3KGroupQuantBytes;
    std::memset(out[sb].scales, 0, sizeof(out[sb].scales));
    for (int j = 0; j < 16; ++j) {
      const int l = sc[j * kGroupRows + i];
      out[sb].scales[j % 8] |= static_cast<uint8_t>((l & 0xF) << (j < 8 ? 0 : 4));
      out[sb].scales[8 + j % 4] |= static_cast<uint8_t>((l >> 4) << (2 * (j / 4)));
    }
    out[sb].d = reinterpret_cast<const uint16_t*>(sc + 16 * kGroupRows)[i];
  }
}

OwnedWeight PackRowGroups(ThreadPool& pool, const WeightView& w) {
  switch (w.type) {
    case GgmlType::kQ4_0:
      return PackQ4_0Groups(pool, w);
    case GgmlType::kQ2_K:
      return PackQ2_KGroups(pool, w);
    case GgmlType::kQ3_K:
      return PackQ3_KGroups(pool, w);
    case GgmlType::kQ4_K:
      return PackQ4_KGroups(pool, w);
    case GgmlType::kQ5_K:
      return PackQ5_KGroups(pool, w);
    case GgmlType::kQ6_K:
      return PackQ6_KGroups(pool, w);
    default:
      return {};
  }
}

void UnpackQ6_KGroupRow(const WeightView& w, int64_t r, void* row) {
  constexpr int64_t kRows = ops_internal::kQ4GroupRows;
  const int64_t nsb = w.cols / kQK_K, i = r % kRows;
  const uint8_t* group = w.data + r / kRows * ops_internal::Q6KGroupBytes(w.cols);
  auto* out = static_cast<BlockQ6_K*>(row);
  for (int64_t sb = 0; sb < nsb; ++sb) {
    const uint8_t* rec = group + sb * ops_internal::kQ6KGroupSuperBytes;
    for (int h = 0; h < 2; ++h) {
      for (int k = 0; k < 8; ++k) {
        for (int b = 0; b < 4; ++b) {
          const uint8_t part[3] = {rec[Q6ChunkOffset(h, k, 0, i) + b],
                                   rec[Q6ChunkOffset(h, k, 1, i) + b],
                                   rec[Q6ChunkOffset(h, k, 2, i) + b]};
          int v[4];
          ops_internal::Q6GroupDecode(part, v);
          const int l = 4 * k + b;
          out[sb].ql[64 * h + l] = static_cast<uint8_t>((v[0] & 0xF) | (v[2] & 0xF) << 4);
          out[sb].ql[64 * h + 32 + l] = static_cast<uint8_t>((v[1] & 0xF) | (v[3] & 0xF) << 4);
          out[sb].qh[32 * h + l] = static_cast<uint8_t>(v[0] >> 4 | (v[1] >> 4) << 2 |
                                                        (v[2] >> 4) << 4 | (v[3] >> 4) << 6);
        }
      }
    }
    const uint8_t* sc = rec + ops_internal::kQ6KGroupQuantBytes;
    for (int s = 0; s < 16; ++s) out[sb].scales[s] = static_cast<int8_t>(sc[s * kRows + i]);
    out[sb].d = reinterpret_cast<const uint16_t*>(sc + 16 * kRows)[i];
  }
}

}  // namespace thermocline
