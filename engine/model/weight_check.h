// A load-time check of a model's weights: a file whose weights hold NaN or Inf loads, runs and
// answers with nothing but garbage (every logit NaN). Reading every weight would cost a pass
// over the whole file at each load, so a sample is read: every row of the small tensors (norms,
// biases, anything of up to kFullCheckRows rows) and kSampledRows rows spread over each large
// one, first and last included.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "engine/gguf/gguf.h"

namespace thermocline {

inline constexpr int64_t kFullCheckRows = 64;
inline constexpr int64_t kSampledRows = 16;

// OK when every sampled value of every tensor the engine can dequantize is finite; else
// InvalidArgumentError naming the tensor and the row. Tensors of types without kernels are
// skipped (the loader refuses those on its own).
absl::Status CheckWeightsFinite(const GgufFile& file);

}  // namespace thermocline
