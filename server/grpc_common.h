// What every gRPC service of the daemon shares: the daemon's parts they call (GrpcShared),
// absl::Status (server/errors.h) to grpc::Status, the API-key check on the `authorization`
// metadata, and the call's deadline on the scheduler's clock. The mapping of codes is documented in
// docs/api.md ("gRPC").
#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "server/config.h"
#include "server/job.h"
#include "server/model_registry.h"
#include "server/scheduler.h"

namespace thermocline::server {

class ModelAdmin;

// The daemon's parts behind the services; owned by GrpcFrontEnd, read by every call.
struct GrpcShared {
  const ServerConfig* config = nullptr;
  ModelRegistry* registry = nullptr;
  ModelAdmin* admin = nullptr;                 // null: the admin service answers UNAVAILABLE
  std::atomic<Scheduler*> scheduler{nullptr};  // null while the models load
  std::atomic<bool> draining{false};           // the server is shutting down
  std::atomic<int> active_streams{0};          // Generate / Chat calls not yet done
  // grpc.health.v1 SERVING: the models are loaded and the server is not stopping.
  bool serving() const { return scheduler.load() != nullptr && !draining.load(); }
};

// INVALID_ARGUMENT (also a prompt beyond the context), NOT_FOUND, ALREADY_EXISTS, UNAUTHENTICATED,
// FAILED_PRECONDITION, RESOURCE_EXHAUSTED (the scheduler's queue is full), UNAVAILABLE (a model
// loading, the server shutting down), INTERNAL otherwise. The message is the absl message; the
// field at fault, when known, is prefixed ("temperature: ...").
grpc::Status ToGrpcStatus(const absl::Status& status);

// OK when `keys` is empty or the call's `authorization` metadata is "Bearer KEY" with KEY one of
// `keys`; else UNAUTHENTICATED saying what to send.
grpc::Status CheckApiKey(const grpc::ServerContextBase& context,
                         const std::vector<std::string>& keys);

// Text for a proto3 `string` field, which must be valid UTF-8 (clients refuse a message
// otherwise): ill-formed parts become U+FFFD, as in the HTTP API's JSON. Token pieces may be
// parts of a character (byte tokens); the text of all the tokens together is whole.
std::string ProtoText(std::string_view text);

// The call's deadline as a point on Clock (steady); Clock::time_point::max() when it has none.
Clock::time_point CallDeadline(const grpc::ServerContextBase& context);

}  // namespace thermocline::server
