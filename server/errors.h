// The daemon's error model. Every failure a request can meet is an absl::Status whose code and
// payloads say how a front end reports it: the HTTP front end maps it to a status and an
// OpenAI-style body {"error":{"message","type","code","param"}}; a gRPC front end would map the
// canonical code directly. Nothing here knows HTTP beyond the numeric status table.
#pragma once

#include <string>
#include <string_view>

#include "absl/status/status.h"

namespace thermocline::server {

// absl (built as C++17 here) has its own string_view type; std::string_view needs converting.
inline absl::string_view ToAbsl(std::string_view s) { return {s.data(), s.size()}; }

// 400 invalid_request_error naming the offending field (`param`, may be empty) and a machine
// code such as "invalid_value", "invalid_type", "missing_required_parameter".
absl::Status InvalidRequest(std::string_view param, std::string_view code,
                            std::string_view message);
// 400 exceed_context_size_error: prompt + max_tokens beyond the model's context.
absl::Status ContextExceeded(std::string_view message);
// 404 not_found_error ("model_not_found" for models, "not_found" for routes).
absl::Status NotFound(std::string_view code, std::string_view message);
// 401 authentication_error.
absl::Status Unauthenticated(std::string_view message);
// 403 permission_error: the request is understood and refused (e.g. "path_not_allowed").
absl::Status Forbidden(std::string_view code, std::string_view message);
// 503 unavailable_error: "queue_full", "model_loading", "shutting_down".
absl::Status Unavailable(std::string_view code, std::string_view message);

// How an error goes on the wire.
struct ApiError {
  int http_status = 500;
  std::string type;     // invalid_request_error, authentication_error, ...
  std::string code;     // machine-readable detail; may be empty (sent as null)
  std::string param;    // the request field at fault; may be empty (sent as null)
  std::string message;  // for humans: what was wrong and what to do
};

ApiError ToApiError(const absl::Status& status);
// {"error":{"message":...,"type":...,"code":...,"param":...}} (code/param null when empty).
std::string ApiErrorJson(const ApiError& error);

}  // namespace thermocline::server
