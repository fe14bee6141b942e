#include "server/grpc_common.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "engine/tokenizer/utf8.h"
#include "server/errors.h"

namespace thermocline::server {

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  const ApiError e = ToApiError(status);
  std::string message = e.message;
  grpc::StatusCode code = grpc::StatusCode::INTERNAL;
  switch (status.code()) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:  // context exceeded: a property of the
                                         // request
      code = grpc::StatusCode::INVALID_ARGUMENT;
      break;
    case absl::StatusCode::kNotFound:
      code = grpc::StatusCode::NOT_FOUND;
      break;
    case absl::StatusCode::kAlreadyExists:
      code = grpc::StatusCode::ALREADY_EXISTS;
      break;
    case absl::StatusCode::kUnauthenticated:
      code = grpc::StatusCode::UNAUTHENTICATED;
      break;
    case absl::StatusCode::kPermissionDenied:
      code = grpc::StatusCode::PERMISSION_DENIED;
      break;
    case absl::StatusCode::kFailedPrecondition:
      code = grpc::StatusCode::FAILED_PRECONDITION;
      break;
    case absl::StatusCode::kResourceExhausted:
      code = grpc::StatusCode::RESOURCE_EXHAUSTED;
      break;
    case absl::StatusCode::kUnavailable:
      // The HTTP API folds a full queue into 503; gRPC has a code of its own for it.
      code = e.code == "queue_full" ? grpc::StatusCode::RESOURCE_EXHAUSTED
                                    : grpc::StatusCode::UNAVAILABLE;
      break;
    case absl::StatusCode::kCancelled:
      code = grpc::StatusCode::CANCELLED;
      break;
    case absl::StatusCode::kDeadlineExceeded:
      code = grpc::StatusCode::DEADLINE_EXCEEDED;
      break;
    default:
      break;
  }
  if (!e.param.empty() && message.find(e.param) == std::string::npos) {
    message = absl::StrCat(e.param, ": ", message);
  }
  return grpc::Status(code, message);
}

grpc::Status CheckApiKey(const grpc::ServerContextBase& context,
                         const std::vector<std::string>& keys) {
  if (keys.empty()) return grpc::Status::OK;
  const auto& metadata = context.client_metadata();
  const auto it = metadata.find("authorization");
  if (it == metadata.end()) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                        "this server needs an API key: send the metadata "
                        "'authorization: Bearer KEY'");
  }
  const std::string_view value(it->second.data(), it->second.size());
  constexpr std::string_view kBearer = "Bearer ";
  if (value.substr(0, kBearer.size()) == kBearer) {
    const std::string_view key = value.substr(kBearer.size());
    for (const std::string& k : keys) {
      if (key == k) return grpc::Status::OK;
    }
  }
  return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                      "the API key is wrong: send the metadata 'authorization: "
                      "Bearer KEY' with "
                      "one of the server's keys");
}

std::string ProtoText(std::string_view text) { return SanitizeUtf8(text); }

Clock::time_point CallDeadline(const grpc::ServerContextBase& context) {
  const std::chrono::system_clock::time_point deadline = context.deadline();
  if (deadline == std::chrono::system_clock::time_point::max()) return Clock::time_point::max();
  const auto left = deadline - std::chrono::system_clock::now();
  // A deadline decades away is no deadline (and would overflow the steady clock).
  if (left > std::chrono::hours(24 * 365)) return Clock::time_point::max();
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(left);
}

}  // namespace thermocline::server
