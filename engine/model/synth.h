// Random-weight llama models of any shape, written as GGUF, for benchmarks at scales no model
// can be downloaded for here. Deterministic for a seed.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "engine/model/hparams.h"
#include "engine/ops/ggml_types.h"
#include "engine/util/thread_pool.h"

namespace thermocline {

struct SynthOptions {
  int64_t n_layer = 2;
  int64_t n_embd = 256;
  int64_t n_ff = 688;
  int64_t n_head = 4;
  int64_t n_head_kv = 4;
  int64_t n_vocab = 512;
  int64_t n_ctx = 2048;
  GgmlType type = GgmlType::kF16;  // weight matrices; norms stay f32
  FfnActivation activation = FfnActivation::kSilu;
  uint64_t seed = 42;
};

absl::Status SynthesizeModel(const SynthOptions& options, const std::string& path,
                             ThreadPool& pool);

}  // namespace thermocline
