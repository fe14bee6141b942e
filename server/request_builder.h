// Validation and resolution of a generation request, shared by every front end: a front end
// extracts a GenerationSpec from its wire format (types checked there), and BuildRequest checks
// ranges, renders the chat template, tokenizes, checks the context (or, with the context
// overflow policy "truncate", drops the oldest non-system chat messages until the request fits)
// and fills the native GenerationRequest. Errors are the statuses of server/errors.h naming the
// field at fault.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "server/chat_template.h"
#include "server/config.h"
#include "server/model_registry.h"
#include "server/request.h"

namespace thermocline::server {

struct GenerationSpec {
  ApiKind kind = ApiKind::kCompletion;
  std::string model;
  std::vector<ChatMessage> messages;               // chat
  nlohmann::ordered_json tools;                    // chat: OpenAI function tools; null: none
  nlohmann::ordered_json chat_template_kwargs;     // chat: extra template variables; null: none
  std::optional<std::string> prompt_text;          // completion
  std::optional<std::vector<int64_t>> prompt_ids;  // completion given as token ids
  std::optional<double> temperature, top_p, min_p, repeat_penalty, presence_penalty,
      frequency_penalty;
  std::optional<int64_t> top_k, seed, max_tokens, n, top_logprobs, penalty_last_n;
  std::string max_tokens_field = "max_tokens";  // the wire name it came from, for errors
  std::vector<std::string> stop;
  std::vector<std::pair<int64_t, double>> logit_bias;
  bool logprobs = false;
  bool ignore_eos = false;
  bool stream = false;
  bool include_usage = false;
  // "refuse" or "truncate" (ServerConfig::context_overflow); unset: the config's.
  std::optional<std::string> context_overflow;

  // Constrained output: a GBNF grammar, and response_format "text", "json_object" or
  // "json_schema" (with its schema, key order kept, and strict flag).
  std::optional<std::string> grammar;
  std::string response_format = "text";
  nlohmann::ordered_json json_schema;  // null: none given (any JSON object)
  bool json_schema_strict = false;
  // Chat: tool_choice "auto", "none", "required" or "function" (named by tool_choice_function);
  // "" when absent (auto with tools).
  std::string tool_choice;
  std::string tool_choice_function;
  bool parallel_tool_calls = true;
};

// A chat message's role as the chat templates know it: "developer" becomes "system"; a role
// other than system, user, assistant or tool is an InvalidRequest naming `param`.
absl::Status NormalizeChatRole(std::string_view param, std::string* role);

absl::StatusOr<GenerationRequest> BuildRequest(const GenerationSpec& spec, const LoadedModel& model,
                                               const ServerConfig& config);

}  // namespace thermocline::server
