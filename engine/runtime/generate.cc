#include "engine/runtime/generate.h"

#include <chrono>

#include "absl/status/status.h"

namespace thermocline {
namespace {
double SecondsSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}
}  // namespace

const char* StopReasonName(StopReason reason) {
  switch (reason) {
    case StopReason::kMaxTokens:
      return "length";
    case StopReason::kEndOfGeneration:
      return "eos";
    case StopReason::kStopped:
      return "stop";
    case StopReason::kContextFull:
      return "context_full";
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

  GenerationResult result;
  result.prompt_tokens = static_cast<int64_t>(prompt.size());
  result.tokens.reserve(options.max_tokens > 0 ? options.max_tokens : 0);
  std::vector<int32_t> history(prompt.begin(), prompt.end());
  history.reserve(prompt.size() + std::max(options.max_tokens, 0));

  auto start = std::chrono::steady_clock::now();
  if (absl::Status s = session.Eval(prompt); !s.ok()) return s;
  result.prompt_seconds = SecondsSince(start);

  Sampler sampler(options.sampling, static_cast<int32_t>(model.hparams().n_vocab));
  StreamingDetokenizer detok(tokenizer);
  std::vector<float> raw_logits(model.hparams().n_vocab);
  // The detokenizer starts a sequence at BOS; a prompt that begins with BOS has its leading
  // space handled there, so generated text continues it verbatim.
  detok.Push(prompt.front());
  for (size_t i = 1; i < prompt.size(); ++i) detok.Push(prompt[i]);

  start = std::chrono::steady_clock::now();
  for (int32_t i = 0; i < options.max_tokens; ++i) {
    float* logits = session.mutable_logits();
    std::copy_n(logits, raw_logits.size(), raw_logits.begin());
    const int32_t id = sampler.Sample(logits, history);
    if (options.stop_at_end_of_generation && tokenizer.IsEndOfGeneration(id)) {
      result.stop_reason = StopReason::kEndOfGeneration;
      break;
    }
    history.push_back(id);
    result.tokens.push_back(id);
    const std::string text = detok.Push(id);
    result.text += text;
    if (on_token && !on_token(GeneratedToken{id, i, text, raw_logits.data()})) {
      result.stop_reason = StopReason::kStopped;
      break;
    }
    if (i + 1 == options.max_tokens) break;
    if (session.n_past() >= session.n_ctx()) {
      result.stop_reason = StopReason::kContextFull;
      break;
    }
    if (absl::Status s = session.Eval({&id, 1}); !s.ok()) return s;
    ++result.decode_evals;
  }
  result.decode_seconds = SecondsSince(start);
  const std::string rest = detok.Flush();
  result.text += rest;
  return result;
}

}  // namespace thermocline
