#include "server/request_builder.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "server/constrained_output.h"
#include "server/errors.h"
#include "spdlog/spdlog.h"

namespace thermocline::server {
namespace {

absl::Status OutOfRange(const char* param, double v, const char* range) {
  return InvalidRequest(param, "invalid_value",
                        absl::StrCat("'", param, "' is ", v, "; it must be in ", range));
}

absl::Status CheckRange(const char* param, const std::optional<double>& v, double lo, double hi,
                        bool lo_open, const char* range) {
  if (!v) return absl::OkStatus();
  const bool ok = std::isfinite(*v) && (lo_open ? *v > lo : *v >= lo) && *v <= hi;
  return ok ? absl::OkStatus() : OutOfRange(param, *v, range);
}

absl::StatusOr<SamplingParams> BuildSampling(const GenerationSpec& spec,
                                             const ServerConfig& config) {
  SamplingParams p = config.sampling;
  p.seed = SamplingParams::kRandomSeed;
  for (absl::Status s :
       {CheckRange("temperature", spec.temperature, 0, 2, false, "[0, 2]"),
        CheckRange("top_p", spec.top_p, 0, 1, false, "[0, 1]"),
        CheckRange("min_p", spec.min_p, 0, 1, false, "[0, 1]"),
        CheckRange("repeat_penalty", spec.repeat_penalty, 0, 10, true, "(0, 10]"),
        CheckRange("presence_penalty", spec.presence_penalty, -2, 2, false, "[-2, 2]"),
        CheckRange("frequency_penalty", spec.frequency_penalty, -2, 2, false, "[-2, 2]")}) {
    if (!s.ok()) return s;
  }
  if (spec.temperature) p.temperature = static_cast<float>(*spec.temperature);
  if (spec.top_p) {
    // top_p = 0 keeps only the most likely token: greedy.
    if (*spec.top_p == 0) p.temperature = 0;
    p.top_p = *spec.top_p == 0 ? 1.0f : static_cast<float>(*spec.top_p);
  }
  if (spec.min_p) p.min_p = static_cast<float>(*spec.min_p);
  if (spec.repeat_penalty) p.repeat_penalty = static_cast<float>(*spec.repeat_penalty);
  if (spec.presence_penalty) p.presence_penalty = static_cast<float>(*spec.presence_penalty);
  if (spec.frequency_penalty) p.frequency_penalty = static_cast<float>(*spec.frequency_penalty);
  if (spec.top_k) {
    if (*spec.top_k < 0 || *spec.top_k > (1 << 24)) {
      return OutOfRange("top_k", static_cast<double>(*spec.top_k), "[0, 16777216] (0: off)");
    }
    p.top_k = static_cast<int32_t>(*spec.top_k);
  }
  if (spec.penalty_last_n) {
    if (*spec.penalty_last_n < -1 || *spec.penalty_last_n > (1 << 24)) {
      return OutOfRange("penalty_last_n", static_cast<double>(*spec.penalty_last_n),
                        "[-1, 16777216]");
    }
    p.penalty_last_n = static_cast<int32_t>(*spec.penalty_last_n);
  }
  if (spec.seed) p.seed = static_cast<uint64_t>(*spec.seed);
  if (absl::Status s = p.Validate(); !s.ok()) {
    return InvalidRequest("", "invalid_value", std::string(s.message()));
  }
  return p;
}

absl::StatusOr<std::vector<int32_t>> RenderChat(const GenerationSpec& spec,
                                                const std::vector<ChatMessage>& messages,
                                                const LoadedModel& model) {
  ChatInputs inputs = ChatInputsFor(spec, messages, *model.chat_template);
  ChatRenderOptions options;
  options.tools = std::move(inputs.tools);
  options.variables = spec.chat_template_kwargs;
  auto text = model.chat_template->Render(inputs.messages, options);
  if (!text.ok()) {
    return InvalidRequest("messages", "invalid_value", std::string(text.status().message()));
  }
  return model.encoder->Encode(*text, model.tokenizer().add_bos());
}

absl::StatusOr<std::vector<int32_t>> BuildPrompt(const GenerationSpec& spec,
                                                 const LoadedModel& model) {
  const Tokenizer& tok = model.tokenizer();
  std::vector<int32_t> prompt;
  if (spec.kind == ApiKind::kChat) {
    if (spec.messages.empty()) {
      return InvalidRequest("messages", "invalid_value", "'messages' must not be empty");
    }
    auto rendered = RenderChat(spec, spec.messages, model);
    if (!rendered.ok()) return rendered.status();
    prompt = *std::move(rendered);
  } else if (spec.prompt_ids) {
    for (int64_t id : *spec.prompt_ids) {
      if (id < 0 || id >= tok.vocab_size()) {
        return InvalidRequest(
            "prompt", "invalid_value",
            absl::StrCat("prompt token id ", id, " is outside the vocabulary [0, ",
                         tok.vocab_size(), ")"));
      }
      prompt.push_back(static_cast<int32_t>(id));
    }
  } else {
    prompt = model.encoder->Encode(spec.prompt_text.value_or(""), tok.add_bos());
  }
  if (prompt.empty()) {
    return InvalidRequest(spec.kind == ApiKind::kChat ? "messages" : "prompt", "invalid_value",
                          "the prompt is empty");
  }
  return prompt;
}

// Drops the oldest non-system messages, a turn at a time (a user message and the replies up to
// the next one), but never the last message, until the rendered prompt leaves room for `room`
// tokens. The system messages stay where they are. The dropped count is in *dropped; the prompt
// stays too long when nothing more can go.
absl::StatusOr<std::vector<int32_t>> TruncateChat(const GenerationSpec& spec,
                                                  const LoadedModel& model, int64_t room,
                                                  std::vector<int32_t> prompt, int32_t* dropped) {
  std::vector<ChatMessage> messages = spec.messages;
  *dropped = 0;
  auto oldest = [&]() -> int64_t {  // the first non-system message but the last; -1: none
    for (size_t i = 0; i + 1 < messages.size(); ++i) {
      if (messages[i].role != "system") return static_cast<int64_t>(i);
    }
    return -1;
  };
  while (static_cast<int64_t>(prompt.size()) + room > model.n_ctx) {
    int64_t i = oldest();
    if (i < 0) break;
    // The message, then what follows it up to the next user message: the rest begins a turn.
    do {
      messages.erase(messages.begin() + i);
      ++*dropped;
      i = oldest();
    } while (i >= 0 && messages[i].role != "user");
    auto rendered = RenderChat(spec, messages, model);
    if (!rendered.ok()) return rendered.status();
    prompt = *std::move(rendered);
  }
  return prompt;
}

}  // namespace

absl::Status NormalizeChatRole(std::string_view param, std::string* role) {
  if (*role == "developer") *role = "system";
  if (*role == "system" || *role == "user" || *role == "assistant" || *role == "tool") {
    return absl::OkStatus();
  }
  return InvalidRequest(
      param, "invalid_value",
      absl::StrCat("role '", *role, "' is not one of system, developer, user, assistant, tool"));
}

absl::StatusOr<GenerationRequest> BuildRequest(const GenerationSpec& spec, const LoadedModel& model,
                                               const ServerConfig& config) {
  GenerationRequest r;
  r.kind = spec.kind;
  r.model = model.config().name;
  if (spec.n && *spec.n != 1) {
    return InvalidRequest("n", "unsupported_value",
                          absl::StrCat("n = ", *spec.n, " is not supported; only n = 1 is"));
  }
  auto sampling = BuildSampling(spec, config);
  if (!sampling.ok()) return sampling.status();
  r.sampling = *sampling;

  r.logprobs = spec.logprobs;
  if (spec.top_logprobs) {
    if (*spec.top_logprobs < 0 || *spec.top_logprobs > 20) {
      return OutOfRange("top_logprobs", static_cast<double>(*spec.top_logprobs), "[0, 20]");
    }
    if (!spec.logprobs && *spec.top_logprobs > 0) {
      return InvalidRequest("top_logprobs", "invalid_value",
                            "'top_logprobs' needs 'logprobs' set to true");
    }
    r.top_logprobs = static_cast<int32_t>(*spec.top_logprobs);
  }

  if (static_cast<int64_t>(spec.stop.size()) > config.max_stop_strings) {
    return InvalidRequest("stop", "invalid_value",
                          absl::StrCat("at most ", config.max_stop_strings,
                                       " stop strings are allowed, got ", spec.stop.size()));
  }
  for (const std::string& s : spec.stop) {
    if (static_cast<int64_t>(s.size()) > config.max_stop_length) {
      return InvalidRequest("stop", "invalid_value",
                            absl::StrCat("a stop string is ", s.size(), " bytes; at most ",
                                         config.max_stop_length, " are allowed"));
    }
    if (!s.empty()) r.stop.push_back(s);
  }
  if (spec.kind == ApiKind::kChat) {
    for (const std::string& s : model.chat_template->implied_stops()) r.stop.push_back(s);
    r.stop_tokens = model.end_of_turn_tokens;
  }

  const int32_t n_vocab = model.tokenizer().vocab_size();
  for (const auto& [id, bias] : spec.logit_bias) {
    if (id < 0 || id >= n_vocab) {
      return InvalidRequest("logit_bias", "invalid_value",
                            absl::StrCat("logit_bias token id ", id,
                                         " is outside the vocabulary [0, ", n_vocab, ")"));
    }
    if (!(bias >= -100 && bias <= 100)) return OutOfRange("logit_bias", bias, "[-100, 100]");
    r.logit_bias.emplace_back(static_cast<int32_t>(id), static_cast<float>(bias));
  }
  if (absl::Status s = ApplyOutputConstraints(spec, model, &r); !s.ok()) return s;
  r.ignore_eos = spec.ignore_eos;
  r.stream = spec.stream;
  r.include_usage = spec.include_usage;

  const std::string& overflow = spec.context_overflow.value_or(config.context_overflow);
  if (overflow != "refuse" && overflow != "truncate") {
    return InvalidRequest("context_overflow", "invalid_value",
                          absl::StrCat("'context_overflow' is '", overflow,
                                       "'; it must be \"refuse\" or \"truncate\""));
  }
  if (spec.context_overflow == "truncate" && spec.kind != ApiKind::kChat) {
    return InvalidRequest("context_overflow", "unsupported_value",
                          "'context_overflow': \"truncate\" drops chat messages; a completion "
                          "prompt is never cut: shorten it instead");
  }
  if (spec.max_tokens && (*spec.max_tokens < 1 || *spec.max_tokens > (1 << 24))) {
    return OutOfRange(spec.max_tokens_field.c_str(), static_cast<double>(*spec.max_tokens),
                      "[1, 16777216]");
  }

  auto prompt = BuildPrompt(spec, model);
  if (!prompt.ok()) return prompt.status();
  r.prompt = std::move(*prompt);
  // Room the prompt must leave: max_tokens, or at least one token to generate.
  const int64_t room = spec.max_tokens.value_or(1);
  int64_t n_prompt = static_cast<int64_t>(r.prompt.size());
  if (overflow == "truncate" && spec.kind == ApiKind::kChat && n_prompt + room > model.n_ctx) {
    auto cut = TruncateChat(spec, model, room, std::move(r.prompt), &r.truncated_messages);
    if (!cut.ok()) return cut.status();
    r.prompt = *std::move(cut);
    const int64_t before = n_prompt;
    n_prompt = static_cast<int64_t>(r.prompt.size());
    spdlog::info(
        "model '{}': context_overflow truncate dropped {} of {} messages ({} -> {} prompt "
        "tokens){}",
        model.config().name, r.truncated_messages, spec.messages.size(), before, n_prompt,
        n_prompt + room > model.n_ctx ? "; still too long, refused" : "");
  }
  const char* const hint = overflow == "truncate"
                               ? "; the system messages and the last message alone do not fit: "
                                 "shorten them or lower max_tokens"
                               : "; shorten the prompt or lower max_tokens, or send "
                                 "\"context_overflow\": \"truncate\" to drop the oldest turns";
  if (spec.max_tokens) {
    if (n_prompt + *spec.max_tokens > model.n_ctx) {
      return ContextExceeded(absl::StrCat(
          "this request needs ", n_prompt + *spec.max_tokens, " tokens (", n_prompt,
          " in the prompt, ", *spec.max_tokens, " to generate) but the context of model '",
          model.config().name, "' is ", model.n_ctx, " tokens",
          spec.kind == ApiKind::kChat ? hint : "; shorten the prompt or lower max_tokens"));
    }
    r.max_tokens = static_cast<int32_t>(*spec.max_tokens);
  } else {
    if (n_prompt >= model.n_ctx) {
      return ContextExceeded(
          absl::StrCat("the prompt has ", n_prompt, " tokens but the context of model '",
                       model.config().name, "' is ", model.n_ctx, " tokens",
                       spec.kind == ApiKind::kChat ? hint : "; shorten the prompt"));
    }
    int64_t room = model.n_ctx - n_prompt;
    if (config.default_max_tokens > 0) room = std::min<int64_t>(room, config.default_max_tokens);
    r.max_tokens = static_cast<int32_t>(room);
  }
  return r;
}

}  // namespace thermocline::server
