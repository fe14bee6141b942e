#include "server/openai_response.h"

#include <ctime>
#include <random>

#include "engine/tokenizer/utf8.h"
#include "server/json_text.h"
#include "server/tool_calls.h"

namespace thermocline::server {
namespace {

std::string RandomId(const char* prefix) {
  static constexpr char kAlphabet[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  thread_local std::mt19937_64 rng{std::random_device{}()};
  std::string id = prefix;
  for (int i = 0; i < 24; ++i) id.push_back(kAlphabet[rng() % (sizeof(kAlphabet) - 1)]);
  return id;
}

void AppendBytes(std::string_view piece, std::string* out) {
  out->push_back('[');
  for (size_t i = 0; i < piece.size(); ++i) {
    if (i) out->push_back(',');
    AppendInt(out, static_cast<unsigned char>(piece[i]));
  }
  out->push_back(']');
}

// {"token":..,"logprob":..,"bytes":[..]}
void AppendChatTokenLogprob(const Tokenizer& tok, int32_t id, float logprob, std::string* out) {
  const std::string piece = tok.TokenToPiece(id);
  out->append("{\"token\":");
  AppendJsonString(out, SanitizeUtf8(piece));
  out->append(",\"logprob\":");
  AppendFloat(out, logprob);
  out->append(",\"bytes\":");
  AppendBytes(piece, out);
}

void AppendLogprobs(const ResponseMeta& meta, absl::Span<const TokenLogprobs> lps,
                    std::string* out) {
  const Tokenizer& tok = *meta.tokenizer;
  if (meta.kind == ApiKind::kChat) {
    out->append("{\"content\":[");
    for (size_t i = 0; i < lps.size(); ++i) {
      if (i) out->push_back(',');
      AppendChatTokenLogprob(tok, lps[i].id, lps[i].logprob, out);
      out->append(",\"top_logprobs\":[");
      for (size_t k = 0; k < lps[i].top.size(); ++k) {
        if (k) out->push_back(',');
        AppendChatTokenLogprob(tok, lps[i].top[k].id, lps[i].top[k].logprob, out);
        out->push_back('}');
      }
      out->append("]}");
    }
    out->append("],\"refusal\":null}");
    return;
  }
  // Legacy completions shape: parallel arrays.
  out->append("{\"tokens\":[");
  for (size_t i = 0; i < lps.size(); ++i) {
    if (i) out->push_back(',');
    AppendJsonString(out, SanitizeUtf8(tok.TokenToPiece(lps[i].id)));
  }
  out->append("],\"token_logprobs\":[");
  for (size_t i = 0; i < lps.size(); ++i) {
    if (i) out->push_back(',');
    AppendFloat(out, lps[i].logprob);
  }
  out->append("],\"top_logprobs\":");
  if (lps.empty() || lps[0].top.empty()) {
    out->append(lps.empty() ? "[]" : "null");
  } else {
    out->push_back('[');
    for (size_t i = 0; i < lps.size(); ++i) {
      if (i) out->push_back(',');
      out->push_back('{');
      for (size_t k = 0; k < lps[i].top.size(); ++k) {
        if (k) out->push_back(',');
        AppendJsonString(out, SanitizeUtf8(tok.TokenToPiece(lps[i].top[k].id)));
        out->push_back(':');
        AppendFloat(out, lps[i].top[k].logprob);
      }
      out->push_back('}');
    }
    out->push_back(']');
  }
  out->append(",\"text_offset\":[");
  for (size_t i = 0; i < lps.size(); ++i) {
    if (i) out->push_back(',');
    AppendInt(out, static_cast<int64_t>(lps[i].text_offset));
  }
  out->append("]}");
}

void AppendUsage(const GenerationStats& s, std::string* out) {
  out->append("{\"prompt_tokens\":");
  AppendInt(out, s.prompt_tokens);
  out->append(",\"completion_tokens\":");
  AppendInt(out, s.completion_tokens);
  out->append(",\"total_tokens\":");
  AppendInt(out, s.prompt_tokens + s.completion_tokens);
  out->append(",\"prompt_tokens_details\":{\"cached_tokens\":");
  AppendInt(out, s.cached_tokens);
  out->append("}}");
}

// One choice: the text as `delta`/`message` content (chat) or `text` (completions).
void AppendChoice(const ResponseMeta& meta, const char* role, const std::string_view* text,
                  absl::Span<const TokenLogprobs> lps, const char* finish, std::string* out) {
  const bool chat = meta.kind == ApiKind::kChat;
  out->append("{\"index\":0,");
  if (chat) {
    out->append(meta.stream ? "\"delta\":{" : "\"message\":{");
    bool comma = false;
    if (role != nullptr) {
      out->append("\"role\":\"");
      out->append(role);
      out->push_back('"');
      comma = true;
    }
    if (text != nullptr) {
      if (comma) out->push_back(',');
      out->append("\"content\":");
      AppendJsonString(out, *text);
    }
    out->append("},");
  } else {
    out->append("\"text\":");
    AppendJsonString(out, text != nullptr ? *text : std::string_view());
    out->push_back(',');
  }
  out->append("\"logprobs\":");
  if (meta.logprobs && (!lps.empty() || !meta.stream)) {
    AppendLogprobs(meta, lps, out);
  } else {
    out->append("null");
  }
  out->append(",\"finish_reason\":");
  if (finish != nullptr) {
    out->push_back('"');
    out->append(finish);
    out->push_back('"');
  } else {
    out->append("null");
  }
  out->push_back('}');
}

void AppendChunk(const ResponseMeta& meta, const char* role, const std::string_view* text,
                 absl::Span<const TokenLogprobs> lps, const char* finish, std::string* out) {
  out->append("data: ");
  out->append(meta.prefix);
  out->append("\"choices\":[");
  AppendChoice(meta, role, text, lps, finish, out);
  out->push_back(']');
  if (meta.include_usage) out->append(",\"usage\":null");
  out->append("}\n\n");
}

}  // namespace

ResponseMeta NewResponseMeta(const GenerationRequest& request, const Tokenizer& tokenizer) {
  ResponseMeta m;
  m.kind = request.kind;
  m.stream = request.stream;
  m.logprobs = request.logprobs;
  m.include_usage = request.stream && request.include_usage;
  m.tokenizer = &tokenizer;
  m.parse_tool_calls = request.parse_tool_calls;
  m.tool_format = request.tool_format;
  m.parallel_tool_calls = request.parallel_tool_calls;
  const bool chat = m.kind == ApiKind::kChat;
  m.id = RandomId(chat ? "chatcmpl-" : "cmpl-");
  m.prefix = "{\"id\":\"" + m.id + "\",\"object\":\"";
  m.prefix += chat ? (m.stream ? "chat.completion.chunk" : "chat.completion") : "text_completion";
  m.prefix += "\",\"created\":";
  AppendInt(&m.prefix, static_cast<int64_t>(std::time(nullptr)));
  m.prefix += ",\"model\":";
  AppendJsonString(&m.prefix, request.model);
  m.prefix += ",\"system_fingerprint\":\"thermocline\",";
  return m;
}

const char* FinishReasonText(StopReason reason) {
  return reason == StopReason::kEndOfGeneration || reason == StopReason::kStopSequence ? "stop"
                                                                                       : "length";
}

const char* FinishReasonText(StopReason reason, int tool_calls) {
  const bool ended = reason == StopReason::kEndOfGeneration || reason == StopReason::kStopSequence;
  return ended && tool_calls > 0 ? "tool_calls" : FinishReasonText(reason);
}

void AppendToolCallStartEvent(const ResponseMeta& meta, int index, std::string_view id,
                              std::string_view name, std::string* out) {
  out->append("data: ");
  out->append(meta.prefix);
  out->append("\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":");
  AppendInt(out, index);
  out->append(",\"id\":");
  AppendJsonString(out, id);
  out->append(",\"type\":\"function\",\"function\":{\"name\":");
  AppendJsonString(out, SanitizeUtf8(name));
  out->append(",\"arguments\":\"\"}}]},\"logprobs\":null,\"finish_reason\":null}]");
  if (meta.include_usage) out->append(",\"usage\":null");
  out->append("}\n\n");
}

void AppendToolCallArgumentsEvent(const ResponseMeta& meta, int index, std::string_view piece,
                                  std::string* out) {
  out->append("data: ");
  out->append(meta.prefix);
  out->append("\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":");
  AppendInt(out, index);
  out->append(",\"function\":{\"arguments\":");
  AppendJsonString(out, SanitizeUtf8(piece));
  out->append("}}]},\"logprobs\":null,\"finish_reason\":null}]");
  if (meta.include_usage) out->append(",\"usage\":null");
  out->append("}\n\n");
}

void AppendRoleEvent(const ResponseMeta& meta, std::string* out) {
  const std::string_view empty;
  AppendChunk(meta, "assistant", &empty, {}, nullptr, out);
}

void AppendDeltaEvent(const ResponseMeta& meta, std::string_view text,
                      absl::Span<const TokenLogprobs> logprobs, std::string* out) {
  AppendChunk(meta, nullptr, &text, logprobs, nullptr, out);
}

void AppendFinishEvent(const ResponseMeta& meta, const char* finish_reason, std::string* out) {
  AppendChunk(meta, nullptr, nullptr, {}, finish_reason, out);
}

void AppendUsageEvent(const ResponseMeta& meta, const GenerationStats& stats, std::string* out) {
  out->append("data: ");
  out->append(meta.prefix);
  out->append("\"choices\":[],\"usage\":");
  AppendUsage(stats, out);
  out->append("}\n\n");
}

void AppendDoneEvent(std::string* out) { out->append("data: [DONE]\n\n"); }

void AppendErrorEvent(const ApiError& error, std::string* out) {
  out->append("data: ");
  out->append(ApiErrorJson(error));
  out->append("\n\n");
}

std::string BuildResponseBody(const ResponseMeta& meta, std::string_view text,
                              absl::Span<const TokenLogprobs> logprobs, const char* finish_reason,
                              const GenerationStats& stats) {
  std::string out = meta.prefix;
  out.append("\"choices\":[");
  AppendChoice(meta, meta.kind == ApiKind::kChat ? "assistant" : nullptr, &text, logprobs,
               finish_reason, &out);
  out.append("],\"usage\":");
  AppendUsage(stats, &out);
  out.push_back('}');
  return out;
}

std::string BuildResponseBody(const ResponseMeta& meta, const ParsedOutput& output,
                              absl::Span<const TokenLogprobs> logprobs, const char* finish_reason,
                              const GenerationStats& stats) {
  std::string out = meta.prefix;
  out.append("\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\",\"content\":");
  if (output.content.empty() && !output.calls.empty()) {
    out.append("null");
  } else {
    AppendJsonString(&out, SanitizeUtf8(output.content));
  }
  if (!output.calls.empty()) {
    out.append(",\"tool_calls\":[");
    for (size_t i = 0; i < output.calls.size(); ++i) {
      const ParsedToolCall& c = output.calls[i];
      if (i) out.push_back(',');
      out.append("{\"id\":");
      AppendJsonString(&out, c.id);
      out.append(",\"type\":\"function\",\"function\":{\"name\":");
      AppendJsonString(&out, SanitizeUtf8(c.name));
      out.append(",\"arguments\":");
      AppendJsonString(&out, SanitizeUtf8(c.arguments));
      out.append("}}");
    }
    out.push_back(']');
  }
  out.append("},\"logprobs\":");
  if (meta.logprobs) {
    AppendLogprobs(meta, logprobs, &out);
  } else {
    out.append("null");
  }
  out.append(",\"finish_reason\":\"");
  out.append(finish_reason);
  out.append("\"}],\"usage\":");
  AppendUsage(stats, &out);
  out.push_back('}');
  return out;
}

}  // namespace thermocline::server
