#include "server/errors.h"

#include "absl/strings/cord.h"
#include "nlohmann/json.hpp"

namespace thermocline::server {
namespace {

constexpr char kTypeKey[] = "thermocline.dev/type";
constexpr char kCodeKey[] = "thermocline.dev/code";
constexpr char kParamKey[] = "thermocline.dev/param";

absl::Status Make(absl::StatusCode code, std::string_view type, std::string_view error_code,
                  std::string_view param, std::string_view message) {
  absl::Status s(code, ToAbsl(message));
  s.SetPayload(kTypeKey, absl::Cord(ToAbsl(type)));
  if (!error_code.empty()) s.SetPayload(kCodeKey, absl::Cord(ToAbsl(error_code)));
  if (!param.empty()) s.SetPayload(kParamKey, absl::Cord(ToAbsl(param)));
  return s;
}

std::string Payload(const absl::Status& s, const char* key) {
  auto p = s.GetPayload(key);
  return p ? std::string(*p) : std::string();
}

}  // namespace

absl::Status InvalidRequest(std::string_view param, std::string_view code,
                            std::string_view message) {
  return Make(absl::StatusCode::kInvalidArgument, "invalid_request_error", code, param, message);
}

absl::Status ContextExceeded(std::string_view message) {
  return Make(absl::StatusCode::kOutOfRange, "exceed_context_size_error", "context_length_exceeded",
              "", message);
}

absl::Status NotFound(std::string_view code, std::string_view message) {
  return Make(absl::StatusCode::kNotFound, "not_found_error", code, "", message);
}

absl::Status Unauthenticated(std::string_view message) {
  return Make(absl::StatusCode::kUnauthenticated, "authentication_error", "invalid_api_key", "",
              message);
}

absl::Status Forbidden(std::string_view code, std::string_view message) {
  return Make(absl::StatusCode::kPermissionDenied, "permission_error", code, "", message);
}

absl::Status Unavailable(std::string_view code, std::string_view message) {
  return Make(absl::StatusCode::kUnavailable, "unavailable_error", code, "", message);
}

ApiError ToApiError(const absl::Status& status) {
  ApiError e;
  e.message = std::string(status.message());
  e.type = Payload(status, kTypeKey);
  e.code = Payload(status, kCodeKey);
  e.param = Payload(status, kParamKey);
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
    case absl::StatusCode::kFailedPrecondition:
      e.http_status = 400;
      if (e.type.empty()) e.type = "invalid_request_error";
      break;
    case absl::StatusCode::kAlreadyExists:
      e.http_status = 409;
      if (e.type.empty()) e.type = "invalid_request_error";
      if (e.code.empty()) e.code = "already_exists";
      break;
    case absl::StatusCode::kUnauthenticated:
      e.http_status = 401;
      if (e.type.empty()) e.type = "authentication_error";
      break;
    case absl::StatusCode::kPermissionDenied:
      e.http_status = 403;
      if (e.type.empty()) e.type = "permission_error";
      break;
    case absl::StatusCode::kNotFound:
      e.http_status = 404;
      if (e.type.empty()) e.type = "not_found_error";
      break;
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kResourceExhausted:
      e.http_status = 503;
      if (e.type.empty()) e.type = "unavailable_error";
      break;
    default:
      e.http_status = 500;
      e.type = "server_error";
      break;
  }
  if (e.message.empty()) e.message = "internal error";
  return e;
}

std::string ApiErrorJson(const ApiError& error) {
  nlohmann::json j = {
      {"error",
       {{"message", error.message},
        {"type", error.type},
        {"code", error.code.empty() ? nlohmann::json() : nlohmann::json(error.code)},
        {"param", error.param.empty() ? nlohmann::json() : nlohmann::json(error.param)}}}};
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace thermocline::server
