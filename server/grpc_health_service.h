// grpc.health.v1.Health over the callback API: Check answers at once; Watch sends the status now
// and again on every change (Notify), without a thread per watcher, and ends after NOT_SERVING
// when the server stops. No key is needed (as for GET /health). SERVING: the models are loaded
// and the server is not stopping.
#pragma once

#include <mutex>
#include <set>

#include "grpc/health/v1/health.grpc.pb.h"
#include "server/grpc_common.h"

namespace thermocline::server {

class HealthService final : public grpc::health::v1::Health::CallbackService {
 public:
  explicit HealthService(GrpcShared* shared) : shared_(shared) {}

  // Service "" (the server) or one of the daemon's services: SERVING or NOT_SERVING; another
  // name is NOT_FOUND.
  grpc::ServerUnaryReactor* Check(grpc::CallbackServerContext* context,
                                  const grpc::health::v1::HealthCheckRequest* request,
                                  grpc::health::v1::HealthCheckResponse* response) override;
  // An unknown service name is watched as SERVICE_UNKNOWN (the protocol's rule).
  grpc::ServerWriteReactor<grpc::health::v1::HealthCheckResponse>* Watch(
      grpc::CallbackServerContext* context,
      const grpc::health::v1::HealthCheckRequest* request) override;

  // The serving state may have changed (scheduler set, draining): every watcher hears it.
  void Notify();

  class Watcher;

 private:
  friend class Watcher;
  // SERVING / NOT_SERVING for a known service, SERVICE_UNKNOWN else.
  grpc::health::v1::HealthCheckResponse::ServingStatus StatusOf(const std::string& service) const;
  void Remove(Watcher* w);

  GrpcShared* const shared_;
  std::mutex mu_;
  std::set<Watcher*> watchers_;
};

}  // namespace thermocline::server
