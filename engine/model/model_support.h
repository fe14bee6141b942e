// What a model file can do before and after loading: the cheap check a registration makes
// (architecture, tokenizer, tensors; no weights read), and the checks of the engine paths that
// implement only part of the families (the GPU layers and the sparse / GPU FFN compute llama's
// layer and a single gated FFN), so that such a path refuses a model it would compute wrongly.
#pragma once

#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/gguf/gguf.h"
#include "engine/model/llama_model.h"

namespace thermocline {

// LlamaModel::CheckSupported on an open file, or on the file at `path` (opened, its header and
// tensor table parsed, no weight read). The error names the architecture, tokenizer or tensor
// that is not supported and what is.
absl::StatusOr<ModelSupport> CheckModelSupported(const GgufFile& file,
                                                 const ModelOptions& options = {});
absl::StatusOr<ModelSupport> CheckModelSupported(const std::string& path,
                                                 const ModelOptions& options = {});

// OK when every layer of `model` computes exactly llama's layer: adjacent-pair RoPE, no
// biases, Q/K norms, post-norms, soft-caps, sliding windows or experts, values as long as
// keys, the 1/sqrt(head_dim) attention scale, a SwiGLU/ReGLU/dReLU FFN. Else
// FailedPreconditionError: "<path> cannot run <arch> models yet: <what differs>".
absl::Status RequireLlamaLayers(const LlamaModel& model, std::string_view path);

// OK when every layer's FFN is one gated FFN with SwiGLU, ReGLU or dReLU (what the sparse FFN,
// the profiler's predictors and the GPU FFN executor compute); else FailedPreconditionError
// naming `path` and the mixture of experts or the activation.
absl::Status RequireGatedFfn(const LlamaModel& model, std::string_view path);

}  // namespace thermocline
