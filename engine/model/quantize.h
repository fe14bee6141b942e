// Model conversion: rewrite a GGUF model with its weight matrices in another type, as
// llama.cpp's llama-quantize does for the same file type name (quant_mix.h: "q4_k_m" keeps
// some tensors at Q6_K, ...), readable by llama.cpp.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "engine/model/quant_mix.h"
#include "engine/util/thread_pool.h"

namespace thermocline {

struct QuantizeStats {
  int64_t tensors_converted = 0;
  int64_t tensors_kept = 0;      // 1-D tensors (norms) and those already in the right type
  int64_t tensors_fallback = 0;  // rows not a multiple of the mix's block size: another type
  uint64_t bytes_in = 0;
  uint64_t bytes_out = 0;
};

// 2-D weights get the types of `mix` (quant_mix.h's TensorTypeFor), tensor by tensor, with the
// quantizers llama-quantize runs without an importance matrix (the same bytes for the same
// input); 1-D tensors stay as they are. general.file_type is the mix's. InvalidArgument where
// out_path names the input file (a link to it included).
absl::StatusOr<QuantizeStats> QuantizeModel(const std::string& in_path, const std::string& out_path,
                                            const QuantMix& mix, ThreadPool& pool);

}  // namespace thermocline
