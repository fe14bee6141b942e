// The gRPC front end: thermocline.v1.Inference, thermocline.v1.Admin, grpc.health.v1.Health and
// server reflection on one port (server.grpc_port, loopback by default). Like the HTTP front end it
// only translates: generation goes through front_end_ops.h and the scheduler, the admin service
// through server/model_admin.h. The daemon starts it after the HTTP port is bound and stops it with
// the same grace period.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "server/grpc_common.h"
#include "server/metrics.h"

namespace grpc {
class Server;
}  // namespace grpc

namespace thermocline::server {

class InferenceService;
class AdminService;
class HealthService;

class GrpcFrontEnd {
 public:
  // `admin` may be null (the admin service then answers UNAVAILABLE); `metrics` may be null (calls
  // are not counted). All must outlive this.
  GrpcFrontEnd(const ServerConfig& config, ModelRegistry* registry, ModelAdmin* admin,
               Metrics* metrics = nullptr);
  ~GrpcFrontEnd();  // Shutdown(now)

  // Binds config.host:config.grpc_port (0: any free port), starts serving and returns the port.
  absl::StatusOr<int> Start();
  // Generation calls answer UNAVAILABLE "loading" and health NOT_SERVING until a started scheduler
  // is set. Thread-safe.
  void SetScheduler(Scheduler* scheduler);
  // New generation calls answer UNAVAILABLE, health turns NOT_SERVING, watches end. Thread-safe.
  void SetDraining();
  // Drains: new calls are refused (UNAVAILABLE) while the streams in flight get until `deadline`
  // to finish; then stops the server, cancelling what still runs (the jobs stop after their
  // current token). Blocks until every call has ended. Idempotent.
  void Shutdown(Clock::time_point deadline);

 private:
  const ServerConfig& config_;
  Metrics* const metrics_;
  GrpcShared shared_;
  std::unique_ptr<InferenceService> inference_;
  std::unique_ptr<AdminService> admin_;
  std::unique_ptr<HealthService> health_;
  std::unique_ptr<grpc::Server> server_;
  std::mutex shutdown_mu_;
  bool shut_down_ = false;
};

}  // namespace thermocline::server
