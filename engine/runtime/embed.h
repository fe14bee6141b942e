// Embeddings: a prompt evaluated from position 0 through the same forward pass generation uses,
// its final hidden states (after the output norm, before the head) pooled into one vector of
// n_embd and, by default, scaled to unit length. What the daemon's /v1/embeddings and Ollama's
// /api/embed return.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/model/session.h"

namespace thermocline {

enum class Pooling {
  kMean,  // the mean over every position (BOS included when the prompt has it)
  kLast,  // the last position's state: the one that has attended to the whole prompt
};
// "mean", "last".
const char* PoolingName(Pooling pooling);
// The inverse of PoolingName; nullopt for any other text.
std::optional<Pooling> ParsePooling(std::string_view name);

struct EmbedOptions {
  Pooling pooling = Pooling::kMean;
  bool normalize = true;  // L2: the vector's Euclidean norm is 1 (a zero vector stays zero)
};

// Called between prefill chunks; false abandons the call (Cancelled).
using KeepGoing = std::function<bool()>;

// Resets `session`, evaluates `tokens` (1 .. n_ctx of them) and returns the pooled vector
// (n_embd). The session's KV cache holds `tokens` afterwards. Allocates one chunk of hidden
// states per call; sums in double so that a long prompt's mean does not lose precision.
absl::StatusOr<std::vector<float>> Embed(Session& session, absl::Span<const int32_t> tokens,
                                         const EmbedOptions& options,
                                         const KeepGoing& keep_going = nullptr);

}  // namespace thermocline
