// What a request's `grammar`, `response_format`, `tools` and `tool_choice` mean for its
// generation: the messages the chat template renders (tools dropped for tool_choice "none",
// described in the system message for templates that do not render them), the grammar the
// output must match (compiled here, so a bad one is a 400 naming its field), and whether and
// how tool calls are parsed out of the output. Shared by every front end through BuildRequest.
#pragma once

#include <vector>

#include "absl/status/status.h"
#include "nlohmann/json.hpp"
#include "server/model_registry.h"
#include "server/request_builder.h"

namespace thermocline::server {

// The tools the chat template gets (null: none) and the messages it renders, from the request's
// `messages` (all of spec.messages, or what context_overflow "truncate" kept of them).
struct ChatInputs {
  nlohmann::ordered_json tools;
  std::vector<ChatMessage> messages;
};
ChatInputs ChatInputsFor(const GenerationSpec& spec, const std::vector<ChatMessage>& messages,
                         const ChatTemplate& chat_template);

// Fills request->grammar, vocab_trie and the tool-call fields. At most one of `grammar`,
// response_format json_object / json_schema and a forcing tool_choice may constrain the output.
absl::Status ApplyOutputConstraints(const GenerationSpec& spec, const LoadedModel& model,
                                    GenerationRequest* request);

}  // namespace thermocline::server
