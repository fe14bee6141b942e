#include "engine/model/quantize.h"

#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "engine/gguf/gguf.h"
#include "engine/ops/kernels.h"

namespace thermocline {
namespace {

// llama.cpp's general.file_type values (enum llama_ftype).
uint32_t FileTypeOf(GgmlType type) {
  switch (type) {
    case GgmlType::kF32:
      return 0;
    case GgmlType::kF16:
      return 1;
    case GgmlType::kQ4_0:
      return 2;
    case GgmlType::kQ8_0:
      return 7;
    case GgmlType::kBF16:
      return 32;
    default:
      return 0;
  }
}

}  // namespace

absl::StatusOr<QuantizeStats> QuantizeModel(const std::string& in_path, const std::string& out_path,
                                            GgmlType type, ThreadPool& pool) {
  if (KernelsFor(type) == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot quantize to ", TypeName(type), " (f32, f16, bf16, q8_0, q4_0)"));
  }
  auto file = GgufFile::Open(in_path);
  if (!file.ok()) return file.status();
  const GgufFile& in = **file;
  const bool tied = in.FindTensor("output.weight") == nullptr;

  GgufWriter writer;
  for (const GgufKeyValue& kv : in.metadata()) writer.Set(kv.key, kv.value);
  writer.SetUint32("general.file_type", FileTypeOf(type));
  if (type == GgmlType::kQ4_0 || type == GgmlType::kQ8_0) {
    writer.SetUint32("general.quantization_version", 2);
  }

  QuantizeStats stats;
  for (const GgufTensorInfo& t : in.tensors()) {
    stats.bytes_in += t.size_bytes;
    GgmlType target = t.type;
    const bool matrix = t.dims.size() == 2 && absl::EndsWith(t.name, ".weight");
    if (matrix) {
      target = type;
      const bool output_head = t.name == "output.weight" || (tied && t.name == "token_embd.weight");
      if (type == GgmlType::kQ4_0 && output_head) target = GgmlType::kQ8_0;
      if (t.dims[0] % TypeInfo(target).block_size != 0) {
        target = GgmlType::kF16;
        ++stats.tensors_fallback;
      }
    }
    const TypeKernels* src = KernelsFor(t.type);
    if (target == t.type || src == nullptr) {
      if (matrix && src == nullptr) {
        return absl::UnimplementedError(absl::StrCat("tensor ", t.name, " has type ",
                                                     TypeName(t.type), ", which cannot be read"));
      }
      if (absl::Status s = writer.AddTensor(t.name, t.type, t.dims, t.data, t.size_bytes);
          !s.ok()) {
        return s;
      }
      stats.bytes_out += t.size_bytes;
      ++stats.tensors_kept;
      continue;
    }
    const int64_t cols = t.dims[0];
    const int64_t rows = t.n_elements / cols;
    const size_t src_row = RowBytes(t.type, cols), dst_row = RowBytes(target, cols);
    std::vector<uint8_t> out(dst_row * rows);
    const TypeKernels* dst = KernelsFor(target);
    std::vector<std::vector<float>> tmp(pool.size(), std::vector<float>(cols));
    pool.ParallelFor(rows, 16, [&](int thread, int64_t begin, int64_t end) {
      float* buf = tmp[thread].data();
      for (int64_t r = begin; r < end; ++r) {
        src->to_float(t.data + r * src_row, buf, cols);
        dst->from_float(buf, out.data() + r * dst_row, cols);
      }
    });
    stats.bytes_out += out.size();
    ++stats.tensors_converted;
    if (absl::Status s = writer.AddTensorCopy(t.name, target, t.dims, std::move(out)); !s.ok()) {
      return s;
    }
  }
  if (absl::Status s = writer.Write(out_path); !s.ok()) return s;
  return stats;
}

}  // namespace thermocline
