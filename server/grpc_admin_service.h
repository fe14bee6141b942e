// thermocline.v1.Admin (proto/thermocline/v1/admin.proto) over server/model_admin.h, and the
// grpc.health.v1 health service. Both are synchronous services: their calls are rare, and
// WatchModel / Health.Watch block on the registry (ModelAdmin::WaitForChange) or poll, which a
// thread per watcher makes simple. Admin calls need the admin key when one is configured, else the
// API key; health needs none (as GET /health).
#pragma once

#include "grpc/health/v1/health.grpc.pb.h"
#include "server/grpc_common.h"
#include "server/model_admin.h"
#include "thermocline/v1/admin.grpc.pb.h"

namespace thermocline::server {

// The proto shape of a ModelInfo (placement and report as google.protobuf.Struct).
void ToProto(const ModelInfo& info, thermocline::v1::ModelInfo* out);

class AdminService final : public thermocline::v1::Admin::Service {
 public:
  explicit AdminService(GrpcShared* shared) : shared_(shared) {}

  grpc::Status RegisterModel(grpc::ServerContext* context,
                             const thermocline::v1::RegisterModelRequest* request,
                             thermocline::v1::ModelInfo* response) override;
  grpc::Status GetModel(grpc::ServerContext* context,
                        const thermocline::v1::GetModelRequest* request,
                        thermocline::v1::ModelInfo* response) override;
  grpc::Status ListModels(grpc::ServerContext* context,
                          const thermocline::v1::ListRegisteredModelsRequest* request,
                          thermocline::v1::ListRegisteredModelsResponse* response) override;
  grpc::Status DeleteModel(grpc::ServerContext* context,
                           const thermocline::v1::DeleteModelRequest* request,
                           thermocline::v1::DeleteModelResponse* response) override;
  grpc::Status CancelJob(grpc::ServerContext* context,
                         const thermocline::v1::CancelJobRequest* request,
                         thermocline::v1::ModelInfo* response) override;
  grpc::Status WatchModel(grpc::ServerContext* context,
                          const thermocline::v1::WatchModelRequest* request,
                          grpc::ServerWriter<thermocline::v1::ModelInfo>* writer) override;

 private:
  // The admin key check, and UNAVAILABLE when the daemon has no model admin.
  grpc::Status Admit(const grpc::ServerContext& context) const;

  GrpcShared* const shared_;
};

class HealthService final : public grpc::health::v1::Health::Service {
 public:
  explicit HealthService(GrpcShared* shared) : shared_(shared) {}

  // Service "" (the server) or one of the daemon's services: SERVING once the models are loaded and
  // until shutdown starts, NOT_SERVING otherwise; another name is NOT_FOUND.
  grpc::Status Check(grpc::ServerContext* context,
                     const grpc::health::v1::HealthCheckRequest* request,
                     grpc::health::v1::HealthCheckResponse* response) override;
  // The status now, then on every change; ends (after NOT_SERVING) when the server stops.
  grpc::Status Watch(grpc::ServerContext* context,
                     const grpc::health::v1::HealthCheckRequest* request,
                     grpc::ServerWriter<grpc::health::v1::HealthCheckResponse>* writer) override;

 private:
  GrpcShared* const shared_;
};

}  // namespace thermocline::server
