// The OpenAI wire format of responses, written by hand into caller-owned buffers so that a
// stream chunk costs no allocation beyond the buffer's growth: chat.completion(.chunk) and
// text_completion objects, SSE events (`data: {json}\n\n`, `data: [DONE]\n\n`), logprobs in
// the chat and the legacy shapes, and error events.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/types/span.h"
#include "engine/tokenizer/tokenizer.h"
#include "server/errors.h"
#include "server/job.h"
#include "server/request.h"

namespace thermocline::server {

struct ResponseMeta {
  ApiKind kind = ApiKind::kCompletion;
  bool stream = false;
  bool logprobs = false;
  bool include_usage = false;
  const Tokenizer* tokenizer = nullptr;
  std::string id;      // chatcmpl-... / cmpl-...
  std::string prefix;  // {"id":...,"object":...,"created":...,"model":...,"system_fingerprint":...,
  // Chat with tools: tool calls are parsed out of the output (server/tool_calls.h).
  bool parse_tool_calls = false;
  ToolCallFormat tool_format = ToolCallFormat::kHermes;
  bool parallel_tool_calls = true;
};

struct ParsedOutput;

ResponseMeta NewResponseMeta(const GenerationRequest& request, const Tokenizer& tokenizer);
// "stop" or "length" (cancellations by deadline end as "length").
const char* FinishReasonText(StopReason reason);

void AppendRoleEvent(const ResponseMeta& meta, std::string* out);  // chat: the first chunk
void AppendDeltaEvent(const ResponseMeta& meta, std::string_view text,
                      absl::Span<const TokenLogprobs> logprobs, std::string* out);
void AppendFinishEvent(const ResponseMeta& meta, const char* finish_reason, std::string* out);
// Chat: a tool call's first chunk (index, id, type, name, empty arguments) and its arguments'
// next piece, as OpenAI streams delta.tool_calls.
void AppendToolCallStartEvent(const ResponseMeta& meta, int index, std::string_view id,
                              std::string_view name, std::string* out);
void AppendToolCallArgumentsEvent(const ResponseMeta& meta, int index, std::string_view piece,
                                  std::string* out);
void AppendUsageEvent(const ResponseMeta& meta, const GenerationStats& stats, std::string* out);
void AppendDoneEvent(std::string* out);
void AppendErrorEvent(const ApiError& error, std::string* out);

// "tool_calls" when the output held calls and ended on its own, else FinishReasonText.
const char* FinishReasonText(StopReason reason, int tool_calls);

// The body of a non-streamed response.
std::string BuildResponseBody(const ResponseMeta& meta, std::string_view text,
                              absl::Span<const TokenLogprobs> logprobs, const char* finish_reason,
                              const GenerationStats& stats);
// The same for chat output split into content (null when empty) and tool calls.
std::string BuildResponseBody(const ResponseMeta& meta, const ParsedOutput& output,
                              absl::Span<const TokenLogprobs> logprobs, const char* finish_reason,
                              const GenerationStats& stats);

}  // namespace thermocline::server
