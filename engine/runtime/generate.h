// The decode loop of one request, the one every caller runs (`generate`, the daemon's slots):
// prefill the prompt, then sample, detokenize and evaluate token by token, handing each token to
// a callback that can stop generation. The daemon's stop strings, deadline, streaming and
// metrics live in its callback (server/decode_loop.cc); this loop owns sampling, the logit bias,
// end-of-generation and stop tokens, the grammar mask, the context limit, the raw logits for
// logprobs, a prompt prefix already in the session's KV cache (the daemon's prefix cache) and
// prefill in chunks that can be cancelled between them.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/model/session.h"
#include "engine/sampling/grammar_matcher.h"
#include "engine/sampling/sampler.h"

namespace thermocline {

// Why generation ended.
enum class StopReason {
  kLength,           // max_tokens were generated
  kEndOfGeneration,  // the model produced an end-of-generation token (EOS, EOT, a stop token)
  kStopSequence,     // the callback found the end (a stop string): TokenAction::kStop
  kCancelled,        // the callback cancelled (client gone, deadline): TokenAction::kCancel
  kContextFull,      // the context is full
  // Generation failed (the status says why). Generate returns the error itself; this is for
  // callers that report an outcome (the daemon's sinks).
  kError,
};
// "length", "eos", "stop", "cancelled", "context_full", "error".
const char* StopReasonName(StopReason reason);

struct GenerateOptions {
  int32_t max_tokens = 128;
  SamplingParams sampling;
  // End-of-generation tokens (EOS/EOT) and stop_tokens end generation and are not emitted;
  // false: they are generated like any other token.
  bool stop_at_end_of_generation = true;
  std::vector<int32_t> stop_tokens;
  std::vector<std::pair<int32_t, float>> logit_bias;  // added to the logits before sampling
  // GeneratedToken::logits carries each token's logits before bias and sampling (logprobs).
  bool raw_logits = false;
  // The first cached_prompt tokens of the prompt are in the session's KV cache already
  // (positions 0 .. cached_prompt - 1, so n_past() == cached_prompt): only the rest is
  // evaluated. At most prompt.size() - 1: the last prompt token is always evaluated, for its
  // logits.
  int64_t cached_prompt = 0;
  // Asked before each prefill chunk (the session's max_batch tokens) but the first; true
  // abandons the request (kCancelled) before any token is generated. nullptr: never.
  std::function<bool()> cancel_prefill;
  // Grammar-constrained sampling (not owned; its state is advanced past every generated
  // token): tokens the grammar does not allow next are masked out before sampling, end tokens
  // (and stop_tokens) are allowed only where the grammar can end, and generation ends with
  // kEndOfGeneration once the grammar is complete. A state no token can continue is an error.
  GrammarMatcher* grammar = nullptr;
};

struct GeneratedToken {
  int32_t id;
  int32_t index;          // 0 for the first generated token
  std::string_view text;  // UTF-8 text that became complete with this token (maybe empty)
  const float* logits;    // (n_vocab) the raw logits it was sampled from; null unless raw_logits
};

// What the callback tells the loop after a token.
enum class TokenAction {
  kContinue,
  kStop,    // generation is complete (a stop string): kStopSequence
  kCancel,  // generation is abandoned (client gone, deadline): kCancelled
};
using TokenCallback = std::function<TokenAction(const GeneratedToken&)>;

struct GenerationResult {
  std::vector<int32_t> tokens;
  std::string text;  // all generated text, final_text included
  // Text the detokenizer held back until the end (an incomplete UTF-8 sequence, a pending
  // space); the callback never saw it.
  std::string final_text;
  StopReason stop_reason = StopReason::kLength;
  int64_t prompt_tokens = 0;
  int64_t prompt_cached = 0;    // of them, found in the KV cache (options.cached_prompt)
  int64_t prompt_computed = 0;  // of them, evaluated (fewer than the rest when cancelled)
  double prompt_seconds = 0;    // prefill
  double decode_seconds = 0;    // evaluating generated tokens
  int64_t decode_evals = 0;     // single-token forward passes timed by decode_seconds
  double prompt_tokens_per_s() const {
    return prompt_seconds > 0 ? prompt_computed / prompt_seconds : 0;
  }
  double decode_tokens_per_s() const {
    return decode_seconds > 0 ? decode_evals / decode_seconds : 0;
  }
};

// Continues `session` (empty, or holding options.cached_prompt tokens of the prompt) with the
// rest of `prompt` and generates. The session's KV cache holds the prompt and the output but its
// last token afterwards (its first n_past() tokens of prompt + tokens). Allocates per call,
// never per token.
absl::StatusOr<GenerationResult> Generate(Session& session, absl::Span<const int32_t> prompt,
                                          const GenerateOptions& options,
                                          const TokenCallback& on_token = nullptr);

}  // namespace thermocline
