// QuantizeModel: the model's metadata copied, each tensor either kept or dequantized and
// quantized row by row (in parallel) into the type its mix gives it.
#include "engine/model/quantize.h"

#include <algorithm>
#include <filesystem>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/gguf/gguf.h"
#include "engine/ops/kernels.h"
#include "engine/ops/type_table.h"

namespace thermocline {
namespace {

// The model facts the mix rules read, from the metadata ({arch}.block_count, ...) and the
// tensor list. A per-layer head count (an array) counts as no grouping.
MixContext ContextOf(const GgufFile& in) {
  MixContext ctx;
  const std::string arch = in.GetString("general.architecture", "llama").value_or("llama");
  ctx.n_layer = in.GetInt(arch + ".block_count", 0).value_or(0);
  const int64_t heads = in.GetInt(arch + ".attention.head_count", 1).value_or(1);
  const int64_t kv_heads = in.GetInt(arch + ".attention.head_count_kv", heads).value_or(heads);
  ctx.n_gqa = kv_heads > 0 ? heads / kv_heads : 1;
  ctx.n_expert = std::max<int64_t>(1, in.GetInt(arch + ".expert_count", 1).value_or(1));
  ctx.has_output = in.FindTensor("output.weight") != nullptr;
  for (const GgufTensorInfo& t : in.tensors()) {
    if (t.name.find("attn_v.weight") != std::string::npos ||
        t.name.find("attn_qkv.weight") != std::string::npos ||
        t.name.find("attn_kv_b.weight") != std::string::npos) {
      ++ctx.n_attention_wv;
    }
  }
  return ctx;
}

}  // namespace

absl::StatusOr<QuantizeStats> QuantizeModel(const std::string& in_path, const std::string& out_path,
                                            const QuantMix& mix, ThreadPool& pool) {
  // The output replaces its path when complete: over the input, the model it came from is gone.
  std::error_code ec;
  if (std::filesystem::equivalent(in_path, out_path, ec)) {
    return absl::InvalidArgumentError(absl::StrCat(out_path, " is the input file: write the ",
                                                   mix.name, " model to another path"));
  }
  auto file = GgufFile::Open(in_path);
  if (!file.ok()) return file.status();
  const GgufFile& in = **file;

  // The target of every tensor, decided in llama-quantize's order (its counters run over it).
  const MixContext ctx = ContextOf(in);
  std::vector<const GgufTensorInfo*> order;
  for (const GgufTensorInfo& t : in.tensors()) order.push_back(&t);
  std::stable_sort(order.begin(), order.end(),
                   [](const GgufTensorInfo* a, const GgufTensorInfo* b) {
                     return MixOrderLess(a->name, b->name);
                   });
  MixCounters counters;
  std::vector<GgmlType> target(in.tensors().size());
  QuantizeStats stats;
  for (const GgufTensorInfo* t : order) {
    const size_t i = static_cast<size_t>(t - in.tensors().data());
    bool fallback = false;
    target[i] = QuantizedByMix(t->name, t->dims.size())
                    ? TensorTypeFor(mix, ctx, counters, t->name, t->dims[0], &fallback)
                    : t->type;
    stats.tensors_fallback += fallback;
  }

  GgufWriter writer;
  for (const GgufKeyValue& kv : in.metadata()) writer.Set(kv.key, kv.value);
  writer.SetUint32("general.file_type", mix.file_type);
  if (TypeInfo(mix.base).block_size > 1) writer.SetUint32("general.quantization_version", 2);

  for (size_t i = 0; i < in.tensors().size(); ++i) {
    const GgufTensorInfo& t = in.tensors()[i];
    stats.bytes_in += t.size_bytes;
    const GgmlType to = target[i];
    if (to == t.type) {
      if (absl::Status s = writer.AddTensor(t.name, t.type, t.dims, t.data, t.size_bytes);
          !s.ok()) {
        return s;
      }
      stats.bytes_out += t.size_bytes;
      ++stats.tensors_kept;
      continue;
    }
    if (FindWeightType(t.type) == nullptr) {
      return absl::UnimplementedError(
          absl::StrCat("tensor ", t.name, " has type ", TypeName(t.type),
                       ", which cannot be read (supported: ", WeightTypeNames(), ")"));
    }
    const TypeKernels* src = KernelsFor(t.type);
    const TypeKernels* dst = KernelsFor(to);
    const int64_t cols = t.dims[0];
    const int64_t rows = t.n_elements / cols;
    const size_t src_row = RowBytes(t.type, cols), dst_row = RowBytes(to, cols);
    std::vector<uint8_t> out(dst_row * rows);
    std::vector<std::vector<float>> tmp(pool.size(), std::vector<float>(cols));
    pool.ParallelFor(rows, 16, [&](int thread, int64_t begin, int64_t end) {
      float* buf = tmp[thread].data();
      for (int64_t r = begin; r < end; ++r) {
        src->to_float(t.data + r * src_row, buf, cols);
        QuantizeWeights(*dst, buf, out.data() + r * dst_row, cols);
      }
    });
    stats.bytes_out += out.size();
    ++stats.tensors_converted;
    if (absl::Status s = writer.AddTensorCopy(t.name, to, t.dims, std::move(out)); !s.ok()) {
      return s;
    }
  }
  if (absl::Status s = writer.Write(out_path); !s.ok()) return s;
  return stats;
}

}  // namespace thermocline
