// thermocline.v1.Admin (proto/thermocline/v1/admin.proto) over server/model_admin.h. A
// synchronous service: its calls are rare and authenticated, and WatchModel blocks on the registry
// (ModelAdmin::WaitForChange), which a thread per watcher makes simple. Calls need the admin key
// when one is configured, else the API key; registered files must lie in the allowed folders
// (server/path_policy.h).
#pragma once

#include "server/grpc_common.h"
#include "server/model_admin.h"
#include "server/path_policy.h"
#include "thermocline/v1/admin.grpc.pb.h"

namespace thermocline::server {

// The proto shape of a ModelInfo (placement and report as google.protobuf.Struct).
void ToProto(const ModelInfo& info, thermocline::v1::ModelInfo* out);

class AdminService final : public thermocline::v1::Admin::Service {
 public:
  explicit AdminService(GrpcShared* shared)
      : shared_(shared), paths_(shared->config->allowed_paths) {}

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
  const PathPolicy paths_;
};

}  // namespace thermocline::server
