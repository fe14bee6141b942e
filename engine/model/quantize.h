// Model conversion: rewrite a GGUF model with its weight matrices in another type
// (f32, f16, bf16, q8_0, q4_0), readable by llama.cpp too.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "engine/ops/ggml_types.h"
#include "engine/util/thread_pool.h"

namespace thermocline {

struct QuantizeStats {
  int64_t tensors_converted = 0;
  int64_t tensors_kept = 0;      // 1-D tensors (norms) and those already in the right type
  int64_t tensors_fallback = 0;  // rows not a multiple of the block size: written as f16
  uint64_t bytes_in = 0;
  uint64_t bytes_out = 0;
};

// 2-D weights become `type`, except that with q4_0 the output head (output.weight, or a tied
// token_embd.weight) is written as q8_0, as llama.cpp also keeps it at higher precision, and
// matrices whose rows do not fill whole blocks fall back to f16. 1-D tensors stay as they are.
absl::StatusOr<QuantizeStats> QuantizeModel(const std::string& in_path, const std::string& out_path,
                                            GgmlType type, ThreadPool& pool);

}  // namespace thermocline
