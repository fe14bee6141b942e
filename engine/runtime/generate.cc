#include "engine/runtime/generate.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <limits>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace thermocline {
namespace {
double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Masks the logits to what the grammar allows next. Stop tokens that are not the vocabulary's
// end tokens stay allowed where the grammar can end. No allocation.
absl::Status MaskLogits(GrammarMatcher& grammar, const GenerateOptions& options, float* logits) {
  const TokenMask& mask = grammar.ComputeMask();
  const bool can_end = grammar.CanEnd() && options.stop_at_end_of_generation;
  if (mask.count() == 0 && !can_end) {
    return absl::FailedPreconditionError(
        "grammar: no token of the model's vocabulary can continue the output here (the grammar "
        "needs text that no token spells)");
  }
  constexpr size_t kMaxKept = 8;
  std::array<float, kMaxKept> kept;
  const size_t n_kept = can_end ? std::min(options.stop_tokens.size(), kMaxKept) : 0;
  for (size_t k = 0; k < n_kept; ++k) kept[k] = logits[options.stop_tokens[k]];
  const absl::Span<const uint64_t> words = mask.words();
  const int32_t n_vocab = mask.vocab_size();
  for (size_t w = 0; w < words.size(); ++w) {
    const uint64_t bits = words[w];
    if (bits == ~uint64_t{0}) continue;
    const int32_t base = static_cast<int32_t>(w) * 64;
    const int32_t end = std::min(base + 64, n_vocab);
    for (int32_t id = base; id < end; ++id) {
      if (!((bits >> (id - base)) & 1)) logits[id] = kNegInf;
    }
  }
  for (size_t k = 0; k < n_kept; ++k) logits[options.stop_tokens[k]] = kept[k];
  return absl::OkStatus();
}

}  // namespace

const char* StopReasonName(StopReason reason) {
  switch (reason) {
    case StopReason::kLength:
      return "length";
    case StopReason::kEndOfGeneration:
      return "eos";
    case StopReason::kStopSequence:
      return "stop";
    case StopReason::kCancelled:
      return "cancelled";
    case StopReason::kContextFull:
      return "context_full";
    case StopReason::kError:
      return "error";
  }
  return "?";
}

absl::StatusOr<GenerationResult> Generate(Session& session, absl::Span<const int32_t> prompt,
                                          const GenerateOptions& options,
                                          const TokenCallback& on_token) {
  if (prompt.empty()) return absl::InvalidArgumentError("the prompt is empty");
  if (absl::Status s = options.sampling.Validate(); !s.ok()) return s;
  const LlamaModel& model = session.model();
  const Tokenizer& tokenizer = model.tokenizer();
  const int32_t n_vocab = static_cast<int32_t>(model.hparams().n_vocab);
  for (const auto& [id, bias] : options.logit_bias) {
    if (id < 0 || id >= n_vocab) {
      return absl::InvalidArgumentError(
          absl::StrCat("logit bias for token ", id, ", outside the vocabulary [0, ", n_vocab, ")"));
    }
  }

  const int64_t n_prompt = static_cast<int64_t>(prompt.size());
  if (options.cached_prompt < 0 || options.cached_prompt >= n_prompt ||
      options.cached_prompt != session.n_past()) {
    return absl::InvalidArgumentError(
        absl::StrCat("cached_prompt is ", options.cached_prompt, " with a prompt of ", n_prompt,
                     " tokens and ", session.n_past(),
                     " in the session; it must equal the session's length and leave at least one "
                     "prompt token to evaluate"));
  }

  GenerationResult result;
  result.prompt_tokens = n_prompt;
  result.prompt_cached = options.cached_prompt;
  const int32_t max_tokens = std::max(options.max_tokens, 0);
  result.tokens.reserve(max_tokens);
  std::vector<int32_t> history(prompt.begin(), prompt.end());
  history.reserve(prompt.size() + max_tokens);

  auto start = std::chrono::steady_clock::now();
  // In the session's own chunks, so that a cancellation is seen between them and the chunks are
  // those of one Eval of the whole rest.
  const int64_t chunk = std::max<int64_t>(session.max_batch(), 1);
  for (int64_t at = options.cached_prompt; at < n_prompt; at += chunk) {
    if (at > options.cached_prompt && options.cancel_prefill && options.cancel_prefill()) {
      result.prompt_seconds = SecondsSince(start);
      result.stop_reason = StopReason::kCancelled;
      return result;
    }
    const int64_t n = std::min(chunk, n_prompt - at);
    if (absl::Status s = session.Eval(prompt.subspan(at, n)); !s.ok()) return s;
    result.prompt_computed += n;
  }
  result.prompt_seconds = SecondsSince(start);

  Sampler sampler(options.sampling, n_vocab);
  // Generated text continues the prompt: the detokenizer sees the prompt first (a prompt that
  // begins with BOS has its leading space handled there).
  StreamingDetokenizer detok(tokenizer);
  for (int32_t id : prompt) detok.Push(id);
  std::vector<float> raw_logits(options.raw_logits ? n_vocab : 0);
  auto ends_generation = [&](int32_t id) {
    return options.stop_at_end_of_generation &&
           (tokenizer.IsEndOfGeneration(id) ||
            std::find(options.stop_tokens.begin(), options.stop_tokens.end(), id) !=
                options.stop_tokens.end());
  };

  GrammarMatcher* grammar = options.grammar;
  start = std::chrono::steady_clock::now();
  for (int32_t i = 0; i < max_tokens; ++i) {
    float* logits = session.mutable_logits();
    if (options.raw_logits) std::copy_n(logits, n_vocab, raw_logits.begin());
    for (const auto& [id, bias] : options.logit_bias) logits[id] += bias;
    if (grammar != nullptr) {
      if (grammar->IsComplete()) {
        result.stop_reason = StopReason::kEndOfGeneration;
        break;
      }
      if (absl::Status s = MaskLogits(*grammar, options, logits); !s.ok()) return s;
    }
    const int32_t id = sampler.Sample(logits, history);
    if (ends_generation(id)) {
      result.stop_reason = StopReason::kEndOfGeneration;
      break;
    }
    if (grammar != nullptr && !grammar->AcceptToken(id)) {
      return absl::InternalError(
          absl::StrCat("grammar: the sampler chose token ", id, ", which the mask did not allow"));
    }
    history.push_back(id);
    result.tokens.push_back(id);
    const std::string text = detok.Push(id);
    result.text += text;
    if (on_token) {
      const TokenAction action =
          on_token(GeneratedToken{id, i, text, options.raw_logits ? raw_logits.data() : nullptr});
      if (action != TokenAction::kContinue) {
        result.stop_reason =
            action == TokenAction::kStop ? StopReason::kStopSequence : StopReason::kCancelled;
        break;
      }
    }
    if (i + 1 == max_tokens) break;
    if (session.n_past() >= session.n_ctx()) {
      result.stop_reason = StopReason::kContextFull;
      break;
    }
    if (absl::Status s = session.Eval({&id, 1}); !s.ok()) return s;
    ++result.decode_evals;
  }
  result.decode_seconds = SecondsSince(start);
  result.final_text = detok.Flush();
  result.text += result.final_text;
  return result;
}

}  // namespace thermocline
