// The OpenAI wire format of requests: JSON bodies of /v1/chat/completions, /v1/completions,
// /tokenize and /detokenize turned into front-end-neutral specs, with types checked and the
// field at fault named. Fields of the API that are not implemented are 400 naming them; unknown
// fields are ignored; null counts as absent. Chat messages keep
// their tool calls, tool_call_id and name, and the request its tools, for the chat template.
#pragma once

#include <string_view>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "server/request_builder.h"

namespace thermocline::server {

// Parses a body that must be a JSON object. Nesting deeper than 64 levels is refused before
// parsing, so no body can exhaust the stack.
absl::StatusOr<nlohmann::json> ParseJsonObject(std::string_view body);

// The "model" field (required, a string).
absl::StatusOr<std::string> RequestedModel(const nlohmann::json& body);

// `raw_body`: the body's text, when the caller has it; "tools" and "chat_template_kwargs" are
// read from it to keep their key order (nlohmann::json sorts keys).
absl::StatusOr<GenerationSpec> SpecFromOpenAi(const nlohmann::json& body, ApiKind kind,
                                              std::string_view raw_body = {});

}  // namespace thermocline::server
