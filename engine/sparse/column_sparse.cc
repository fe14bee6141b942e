// The column-sparse mat-vec's layouts (built from every weight type's blocks), the kept inputs'
// quantization, the integer form's scalar reference and the dispatch (column_sparse.h).
#include "engine/sparse/column_sparse.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "engine/ops/ggml_types.h"
#include "engine/ops/quants_ref.h"
#include "engine/ops/type_table.h"
#include "engine/sparse/sparse_ffn.h"
#include "engine/sparse/sparse_ops.h"

namespace thermocline {
namespace {

using ops_internal::DecodedBlock;
using ops_internal::DecodeFn;

// Where output p of a chunk is stored within its 64 bytes. The kernels interleave four rows'
// lines bytewise, then wordwise, within each 128-bit lane L (unpacklo/hi_epi8, then _epi16): int32
// lane 4 L + q of interleaved vector m (0..3) then holds byte 16 L + 4 m + q of each row.
//  - 8-bit: that byte holds output 16 m + 4 L + q, which leaves vector m with outputs
//    [16 m, 16 m + 16) in order.
//  - 4-bit: its low nibble holds output 32 m + 4 L + q and its high one 32 m + 16 + 4 L + q, so
//    that vector m's low nibbles are outputs [32 m, 32 m + 16) and its high ones the next 16.
constexpr int StoredByte8(int p) { return 16 * ((p & 15) >> 2) + 4 * (p >> 4) + (p & 3); }
constexpr int StoredByte4(int p) { return 16 * ((p & 15) >> 2) + 4 * (p >> 5) + (p & 3); }
constexpr bool StoredHigh4(int p) { return (p >> 4) & 1; }

// How a type's quants become the integer form: its decoder (null: Q8_0 and Q4_0, read directly;
// kRequant: via F32 and Q8_0), the form, the offset added to its q, and whether it has mins.
struct Source {
  ColumnWeight::Form form;
  DecodeFn decode;
  int32_t offset;
  bool min;
  bool requant;
};

bool SourceFor(GgmlType type, Source* s) {
  using F = ColumnWeight::Form;
  namespace oi = ops_internal;
  switch (type) {
    case GgmlType::kQ8_0:
      *s = {F::kInt8, nullptr, 128, false, false};
      return true;
    case GgmlType::kQ4_0:
      *s = {F::kInt4, nullptr, 8, false, false};
      return true;
    case GgmlType::kQ4_1:
      *s = {F::kInt4, oi::DecodeQ4_1, 0, true, false};
      return true;
    case GgmlType::kQ4_K:
      *s = {F::kInt4, oi::DecodeQ4_K, 0, true, false};
      return true;
    case GgmlType::kQ5_0:
      *s = {F::kInt8, oi::DecodeQ5_0, 128, false, false};
      return true;
    case GgmlType::kQ5_1:
      *s = {F::kInt8, oi::DecodeQ5_1, 128, true, false};
      return true;
    case GgmlType::kQ5_K:
      *s = {F::kInt8, oi::DecodeQ5_K, 128, true, false};
      return true;
    case GgmlType::kIQ4_NL:
      *s = {F::kInt8, oi::DecodeIQ4_NL, 128, false, false};
      return true;
    case GgmlType::kIQ4_XS:
      *s = {F::kInt8, oi::DecodeIQ4_XS, 128, false, false};
      return true;
    // Scales per 16 inputs: requantized to Q8_0's 8 bits per 32.
    case GgmlType::kQ2_K:
    case GgmlType::kQ3_K:
    case GgmlType::kQ6_K:
      *s = {F::kInt8, nullptr, 128, false, true};
      return true;
    default:
      return false;
  }
}

bool HasIntegerKernel(Isa isa) { return isa != Isa::kScalar; }

// Row i of w as the integer form's u (in values) and its blocks' scales and mins, as floats
// (scale[b], min[b]). q8: a row of Q8_0 scratch for requantized types. False when a quant does
// not fit the form (a decoder's range the table above got wrong).
bool DecodeRow(const WeightView& w, const Source& s, int64_t i, uint8_t* u, float* scale,
               float* min, std::vector<uint8_t>& q8, std::vector<float>& f) {
  const int64_t in = w.cols;
  const uint8_t* row = w.row(i);
  const int32_t limit = s.form == ColumnWeight::Form::kInt4 ? 15 : 255;
  if (s.requant || w.type == GgmlType::kQ8_0) {
    const BlockQ8_0* blocks = reinterpret_cast<const BlockQ8_0*>(row);
    if (s.requant) {
      KernelsFor(w.type)->to_float(row, f.data(), in);
      QuantizeWeights(*KernelsFor(GgmlType::kQ8_0), f.data(), q8.data(), in);
      blocks = reinterpret_cast<const BlockQ8_0*>(q8.data());
    }
    for (int64_t b = 0; b < in / 32; ++b) {
      scale[b] = HalfToFloat(blocks[b].d);
      min[b] = 0.0f;
      for (int e = 0; e < 32; ++e) u[b * 32 + e] = static_cast<uint8_t>(blocks[b].qs[e] + 128);
    }
    return true;
  }
  if (w.type == GgmlType::kQ4_0) {
    const BlockQ4_0* blocks = reinterpret_cast<const BlockQ4_0*>(row);
    for (int64_t b = 0; b < in / 32; ++b) {
      scale[b] = HalfToFloat(blocks[b].d);
      min[b] = 0.0f;
      for (int e = 0; e < 16; ++e) {
        u[b * 32 + e] = blocks[b].qs[e] & 0x0F;
        u[b * 32 + e + 16] = blocks[b].qs[e] >> 4;
      }
    }
    return true;
  }
  const int64_t block = TypeInfo(w.type).block_size;
  DecodedBlock d;
  for (int64_t k = 0; k < in / block; ++k) {
    s.decode(row, k, &d);
    if (d.group != 32) return false;
    for (int g = 0; g < block / 32; ++g) {
      const int64_t b = k * block / 32 + g;
      scale[b] = d.d * static_cast<float>(d.sc[g]);
      min[b] = d.dm * static_cast<float>(d.mn[g]);
      for (int e = 0; e < 32; ++e) {
        const int32_t v = d.q[g * 32 + e] + s.offset;
        if (v < 0 || v > limit) return false;
        u[b * 32 + e] = static_cast<uint8_t>(v);
      }
    }
  }
  return true;
}

}  // namespace

ColumnWeight::Form ColumnWeight::FormFor(const WeightView& w, Isa isa) {
  Source s;
  if (!HasIntegerKernel(isa) || w.layout != WeightLayout::kRows || w.cols % kColumnBlock != 0 ||
      w.cols % TypeInfo(w.type).block_size != 0 || !SourceFor(w.type, &s)) {
    return Form::kFloat;
  }
  return s.form;
}

double ColumnWeight::BytesFor(const WeightView& w, Isa isa) {
  const Form form = FormFor(w, isa);
  if (form == Form::kFloat) {
    return static_cast<double>(RowBytes(InputSparseTType(w), w.rows)) * w.cols;
  }
  Source s;
  SourceFor(w.type, &s);
  const int64_t chunk = form == Form::kInt4 ? kColumnChunk4 : kColumnChunk;
  const double out_pad = static_cast<double>((w.rows + chunk - 1) / chunk) * chunk;
  const double values = out_pad * (form == Form::kInt4 ? 0.5 : 1.0) * w.cols;
  const double scales = out_pad * (w.cols / kColumnBlock) * 2.0 * (s.min ? 2 : 1);
  return values + scales;
}

absl::StatusOr<ColumnWeight> ColumnWeight::Build(ThreadPool& pool, const WeightView& w, Isa isa) {
  if (FormFor(w, isa) == Form::kFloat) {
    ColumnWeight c;
    c.in_ = w.cols;
    c.out_ = w.rows;
    absl::StatusOr<OwnedWeight> t = TransposeWeightAs(pool, w, InputSparseTType(w));
    if (!t.ok()) return t.status();
    c.rows_ = *std::move(t);
    return c;
  }
  const WeightView* parts[] = {&w};
  absl::StatusOr<ColumnWeight> c = BuildStacked(pool, parts, isa);
  // A scale beyond F16 or a quant outside the form: the float form holds any matrix.
  if (absl::IsFailedPrecondition(c.status())) return Build(pool, w, Isa::kScalar);
  return c;
}

absl::StatusOr<ColumnWeight> ColumnWeight::BuildStacked(ThreadPool& pool,
                                                        absl::Span<const WeightView* const> parts,
                                                        Isa isa) {
  if (parts.empty()) return absl::InvalidArgumentError("no matrices to lay out");
  const WeightView& w0 = *parts[0];
  ColumnWeight c;
  c.form_ = FormFor(w0, isa);
  c.in_ = w0.cols;
  // Part p's rows are outputs [first[p], first[p + 1]).
  std::vector<int64_t> first = {0};
  for (const WeightView* w : parts) {
    if (w->type != w0.type || w->layout != w0.layout || w->cols != w0.cols) {
      return absl::InvalidArgumentError(
          absl::StrCat("stacked column layout: ", TypeName(w->type), " (", w->rows, ", ", w->cols,
                       ") after ", TypeName(w0.type), " (", w0.rows, ", ", w0.cols, ")"));
    }
    first.push_back(first.back() + w->rows);
  }
  c.out_ = first.back();
  if (c.form_ == Form::kFloat) {
    return absl::FailedPreconditionError(
        absl::StrCat(TypeName(w0.type), ": no integer column layout on this CPU"));
  }
  Source s;
  SourceFor(w0.type, &s);
  const bool int4 = c.form_ == Form::kInt4;
  c.offset_ = s.offset;
  const int64_t chunk = c.chunk();
  c.out_pad_ = (c.out_ + chunk - 1) / chunk * chunk;
  c.row_bytes_ = static_cast<size_t>(int4 ? c.out_pad_ / 2 : c.out_pad_);
  c.storage_.resize(c.row_bytes_ * c.in_ + 64);  // every chunk of every row is written below
  const int64_t n_blocks = c.in_ / kColumnBlock;
  // Padding outputs: zero scales and mins, so whatever their values they add nothing.
  c.scales_.assign(static_cast<size_t>(n_blocks * c.out_pad_), 0);
  if (s.min) c.mins_.assign(c.scales_.size(), 0);
  uint8_t* values = const_cast<uint8_t*>(c.values());
  const int64_t n_chunks = c.out_pad_ / chunk;
  std::vector<int> bad(pool.size(), 0);
  // A chunk of outputs at a time: its rows decoded into (chunk, in) values, then written out as
  // the 64 contiguous bytes of each input's row.
  pool.ParallelFor(n_chunks, 1, [&](int thread, int64_t begin, int64_t end) {
    std::vector<uint8_t> u(static_cast<size_t>(chunk * c.in_), 0);
    constexpr int64_t kTile = 64;
    std::vector<uint8_t> tile(static_cast<size_t>(chunk * kTile));
    std::vector<float> scale(n_blocks), min(n_blocks), f(c.in_);
    std::vector<uint8_t> q8(RowBytes(GgmlType::kQ8_0, c.in_));
    for (int64_t ch = begin; ch < end; ++ch) {
      const int64_t rows = std::min<int64_t>(chunk, c.out_ - ch * chunk);
      for (int64_t p = 0; p < rows; ++p) {
        const int64_t i = ch * chunk + p;
        size_t part = 0;
        while (i >= first[part + 1]) ++part;
        if (!DecodeRow(*parts[part], s, i - first[part], u.data() + p * c.in_, scale.data(),
                       min.data(), q8, f)) {
          bad[thread] = 1;
          return;
        }
        for (int64_t b = 0; b < n_blocks; ++b) {
          const uint16_t sh = FloatToHalf(scale[b]), mh = FloatToHalf(min[b]);
          if (!std::isfinite(HalfToFloat(sh)) || !std::isfinite(HalfToFloat(mh))) {
            bad[thread] = 1;
            return;
          }
          c.scales_[b * c.out_pad_ + i] = sh;
          if (s.min) c.mins_[b * c.out_pad_ + i] = mh;
        }
      }
      // In tiles of kTile inputs: the chunk's rows copied out a tile at a time (contiguous
      // reads), then each input's line gathered from the tile, in L1.
      for (int64_t j0 = 0; j0 < c.in_; j0 += kTile) {
        const int64_t n = std::min(kTile, c.in_ - j0);
        for (int64_t p = 0; p < rows; ++p) {
          std::memcpy(tile.data() + p * kTile, u.data() + p * c.in_ + j0, n);
        }
        for (int64_t j = 0; j < n; ++j) {
          uint8_t line[kColumnStepBytes] = {};
          for (int p = 0; p < rows; ++p) {
            const uint8_t v = tile[p * kTile + j];
            if (int4) {
              line[StoredByte4(p)] |= static_cast<uint8_t>(StoredHigh4(p) ? v << 4 : v);
            } else {
              line[StoredByte8(p)] = v;
            }
          }
          std::memcpy(values + (j0 + j) * c.row_bytes_ + ch * kColumnStepBytes, line,
                      kColumnStepBytes);
        }
      }
    }
  });
  if (std::count(bad.begin(), bad.end(), 1) > 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(TypeName(w0.type), ": a scale beyond F16 or a quant outside the ",
                     int4 ? "4" : "8", "-bit form"));
  }
  return c;
}

// The device reads the integer form's lines through the inverse of StoredByte8 / StoredByte4.
static_assert([] {
  for (int p = 0; p < 128; ++p) {
    if (p < 64 && gpu::OutputOfByte8(StoredByte8(p)) != p) return false;
    if (gpu::OutputOfByte4(StoredByte4(p), StoredHigh4(p)) != p) return false;
  }
  return true;
}());

gpu::ColumnLayout ColumnWeight::layout() const {
  using F = gpu::ColumnLayout::Form;
  gpu::ColumnLayout c;
  if (in_ == 0 || out_ == 0) return c;
  c.in = in_;
  c.out = out_;
  if (form_ == Form::kFloat) {
    c.form = F::kRows;
    c.rows = rows_.view;
    return c;
  }
  c.form = form_ == Form::kInt4 ? F::kInt4 : F::kInt8;
  c.out_pad = out_pad_;
  c.row_bytes = row_bytes_;
  c.offset = offset_;
  c.values = values();
  c.scales = scales_.data();
  c.mins = mins_.empty() ? nullptr : mins_.data();
  return c;
}

size_t ColumnWeight::bytes() const {
  return storage_.size() + 2 * (scales_.size() + mins_.size()) + rows_.data.size();
}

double ColumnWeight::bytes_per_input() const {
  if (form_ == Form::kFloat) return static_cast<double>(rows_.view.row_bytes);
  return static_cast<double>(row_bytes_) +
         2.0 * out_pad_ * (mins_.empty() ? 1 : 2) / static_cast<double>(kColumnBlock);
}

void ColumnInput::Reserve(int64_t max_in) {
  const int64_t blocks = (max_in + kColumnBlock - 1) / kColumnBlock;
  block_.assign(blocks, 0);
  begin_.assign(blocks + 1, 0);
  scale_.assign(blocks, 0.0f);
  qsum_.assign(blocks, 0);
  // Each block's slots padded to a multiple of 4.
  slot_idx_.assign(max_in + 3 * blocks, 0);
  slot_q_.assign(max_in + 3 * blocks, 0);
}

void ColumnInput::Set(const int32_t* idx, const float* val, int64_t n) {
  idx_ = idx;
  val_ = val;
  n_ = n;
  n_blocks_ = 0;
  int32_t slot = 0;
  for (int64_t j = 0; j < n;) {
    const int32_t b = idx[j] / kColumnBlock;
    int64_t e = j;
    float amax = 0.0f;
    while (e < n && idx[e] / kColumnBlock == b) amax = std::max(amax, std::fabs(val[e++]));
    const float d = amax / 127.0f;
    // A block whose largest entry is under 127 · FLT_MIN counts as zero: 1 / d would overflow.
    const float id = d >= FLT_MIN ? 1.0f / d : 0.0f;
    int32_t sum = 0;
    block_[n_blocks_] = b;
    begin_[n_blocks_] = slot;
    for (int64_t k = j; k < e; ++k) {
      const int32_t q = static_cast<int32_t>(std::nearbyint(val[k] * id));
      slot_idx_[slot] = idx[k];
      slot_q_[slot++] = static_cast<int8_t>(q);
      sum += q;
    }
    while (slot % 4 != 0) {  // zero entries on the last kept column: read, and worth nothing
      slot_idx_[slot] = idx[e - 1];
      slot_q_[slot++] = 0;
    }
    scale_[n_blocks_] = d;
    qsum_[n_blocks_++] = sum;
    j = e;
  }
  begin_[n_blocks_] = slot;
}

int64_t ColumnSplit(const int32_t* idx, int64_t n, int part, int parts) {
  if (part <= 0) return 0;
  if (part >= parts) return n;
  int64_t e = n * part / parts;
  while (e > 0 && e < n && idx[e] / kColumnBlock == idx[e - 1] / kColumnBlock) ++e;
  return e;
}

void ColumnSparseAddReference(const ColumnWeight& w, const ColumnInput& x, int64_t c0, int64_t c1,
                              float* y) {
  const uint8_t* values = w.values();
  const bool int4 = w.form() == ColumnWeight::Form::kInt4;
  auto u = [&](int32_t j, int64_t i) -> int32_t {
    const uint8_t* line = values + j * w.row_bytes() + i / w.chunk() * kColumnStepBytes;
    const int p = static_cast<int>(i % w.chunk());
    if (!int4) return line[StoredByte8(p)];
    return StoredHigh4(p) ? line[StoredByte4(p)] >> 4 : line[StoredByte4(p)] & 0x0F;
  };
  for (int64_t k = 0; k < x.n_blocks(); ++k) {
    const uint16_t* scales = w.scales(x.block(k));
    const uint16_t* mins = w.mins(x.block(k));
    for (int64_t i = c0; i < c1; ++i) {
      int32_t acc = 0;
      for (int32_t s = x.begin(k); s < x.begin(k + 1); ++s) {
        acc += static_cast<int32_t>(x.slot_q()[s]) * u(x.slot_idx()[s], i);
      }
      acc -= w.offset() * x.qsum(k);
      float v = y[i - c0];
      v = std::fma(HalfToFloat(scales[i]), static_cast<float>(acc) * x.scale(k), v);
      if (mins != nullptr) v = std::fma(-HalfToFloat(mins[i]), x.scale(k) * x.qsum(k), v);
      y[i - c0] = v;
    }
  }
}

void ColumnSparseAdd(Isa isa, const ColumnWeight& w, const ColumnInput& x, int64_t c0, int64_t c1,
                     float* y) {
  if (c1 <= c0) return;
  if (w.form() == ColumnWeight::Form::kFloat) {
    SparseAxpyRows(isa, w.rows(), c0, c1 - c0, x.idx(), x.val(), x.n(), y);
  } else if (isa == Isa::kAvx512Vnni) {
    column_sparse_internal::AddVnni(w, x, c0, c1, y);
  } else if (isa == Isa::kAvx2 || isa == Isa::kAvx512) {
    column_sparse_internal::AddAvx2(w, x, c0, c1, y);
  } else {
    ColumnSparseAddReference(w, x, c0, c1, y);
  }
}

}  // namespace thermocline
