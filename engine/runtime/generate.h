// The decode loop of one request: prefill the prompt, then sample and evaluate token by token,
// streaming each token through a callback that can stop generation.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/model/session.h"
#include "engine/sampling/sampler.h"

namespace thermocline {

enum class StopReason { kMaxTokens, kEndOfGeneration, kStopped, kContextFull };
const char* StopReasonName(StopReason reason);

struct GenerateOptions {
  int32_t max_tokens = 128;
  SamplingParams sampling;
  bool stop_at_end_of_generation = true;  // EOS/EOT end generation (and are not emitted)
};

struct GeneratedToken {
  int32_t id;
  int32_t index;          // 0 for the first generated token
  std::string_view text;  // UTF-8 text that became complete with this token (maybe empty)
  const float* logits;    // the raw logits this token was sampled from (n_vocab)
};

struct GenerationResult {
  std::vector<int32_t> tokens;
  std::string text;
  StopReason stop_reason = StopReason::kMaxTokens;
  int64_t prompt_tokens = 0;
  double prompt_seconds = 0;  // prefill
  double decode_seconds = 0;  // evaluating generated tokens
  int64_t decode_evals = 0;   // single-token forward passes timed by decode_seconds
  double prompt_tokens_per_s() const {
    return prompt_seconds > 0 ? prompt_tokens / prompt_seconds : 0;
  }
  double decode_tokens_per_s() const {
    return decode_seconds > 0 ? decode_evals / decode_seconds : 0;
  }
};

// Returns false to stop generation after this token.
using TokenCallback = std::function<bool(const GeneratedToken&)>;

// Continues `session` (normally empty) with `prompt` and generates. The session's KV cache
// holds prompt and output afterwards.
absl::StatusOr<GenerationResult> Generate(Session& session, absl::Span<const int32_t> prompt,
                                          const GenerateOptions& options,
                                          const TokenCallback& on_token = nullptr);

}  // namespace thermocline
