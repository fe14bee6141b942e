#include "server/grpc_admin_service.h"

#include <google/protobuf/util/json_util.h>

#include <chrono>
#include <string>
#include <thread>

namespace thermocline::server {
namespace {

namespace pb = thermocline::v1;

// The one mapping of the lifecycle to the gRPC enum (a job's states; the serving states a
// registered model's job never takes map to unspecified).
pb::ModelInfo::State StateOf(ModelState state) {
  switch (state) {
    case ModelState::kRegistered:
      return pb::ModelInfo::REGISTERED;
    case ModelState::kProfiling:
      return pb::ModelInfo::PROFILING;
    case ModelState::kReady:
      return pb::ModelInfo::READY;
    case ModelState::kFailed:
      return pb::ModelInfo::FAILED;
    case ModelState::kUnloading:
      return pb::ModelInfo::UNLOADING;
    case ModelState::kLoading:
    case ModelState::kUnloaded:
      break;
  }
  return pb::ModelInfo::STATE_UNSPECIFIED;
}

void ToStruct(const nlohmann::json& j, google::protobuf::Struct* out) {
  if (!j.is_object()) return;
  // Struct's JSON mapping is the object itself; the dump is valid JSON, so this cannot fail short
  // of a number protobuf cannot hold (then the field stays partial).
  (void)google::protobuf::util::JsonStringToMessage(
      j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace), out);
}

bool Terminal(const ModelInfo& info) { return IsSettled(info.state); }

}  // namespace

void ToProto(const ModelInfo& info, pb::ModelInfo* out) {
  out->set_name(info.name);
  out->set_path(ProtoText(info.path));
  out->set_activation(info.activation);
  out->set_state(StateOf(info.state));
  out->set_stage(info.stage);
  out->set_percent(info.percent);
  out->set_eta_s(info.eta_s);
  out->set_last_error(ProtoText(info.last_error));
  out->set_sidecar_path(ProtoText(info.sidecar_path));
  out->set_mode(info.mode);
  out->set_loaded(info.loaded);
  out->set_created_at(info.created_at);
  out->set_updated_at(info.updated_at);
  ToStruct(info.placement, out->mutable_placement());
  ToStruct(info.report, out->mutable_report());
  ToStruct(info.runs_on, out->mutable_runs_on());
  out->set_gpu_memory(info.gpu_memory);
  out->set_gpu_layers(info.gpu_layers);
  out->set_warning(ProtoText(info.warning));
  if (!info.placement.is_object()) out->clear_placement();
  if (!info.report.is_object()) out->clear_report();
  out->set_version(info.version);
}

grpc::Status AdminService::Admit(const grpc::ServerContext& context) const {
  const ServerConfig& config = *shared_->config;
  const std::vector<std::string> admin_keys = {config.admin_key};
  grpc::Status s = CheckApiKey(context, config.admin_key.empty() ? config.api_keys : admin_keys);
  if (!s.ok()) return s;
  if (shared_->admin == nullptr) {
    return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                        "this daemon has no model registry (see [registry] state_dir)");
  }
  return grpc::Status::OK;
}

grpc::Status AdminService::RegisterModel(grpc::ServerContext* context,
                                         const pb::RegisterModelRequest* request,
                                         pb::ModelInfo* response) {
  if (grpc::Status s = Admit(*context); !s.ok()) return s;
  RegisterSpec spec;
  spec.path = request->path();
  spec.name = request->name();
  spec.activation = request->activation();
  spec.corpus = request->corpus();
  spec.profile_tokens = request->profile_tokens();
  spec.gpu_memory = request->gpu_memory();
  spec.gpu_layers = request->gpu_layers();
  spec.target_ppl_increase = request->target_ppl_increase();
  if (absl::Status s = paths_.ConfineRegistration(&spec); !s.ok()) return ToGrpcStatus(s);
  auto info = shared_->admin->Register(spec);
  if (!info.ok()) return ToGrpcStatus(info.status());
  ToProto(*info, response);
  return grpc::Status::OK;
}

grpc::Status AdminService::GetModel(grpc::ServerContext* context,
                                    const pb::GetModelRequest* request, pb::ModelInfo* response) {
  if (grpc::Status s = Admit(*context); !s.ok()) return s;
  auto info = shared_->admin->Get(request->name());
  if (!info.ok()) return ToGrpcStatus(info.status());
  ToProto(*info, response);
  return grpc::Status::OK;
}

grpc::Status AdminService::ListModels(grpc::ServerContext* context,
                                      const pb::ListRegisteredModelsRequest* request,
                                      pb::ListRegisteredModelsResponse* response) {
  if (grpc::Status s = Admit(*context); !s.ok()) return s;
  for (const ModelInfo& info : shared_->admin->List()) ToProto(info, response->add_models());
  return grpc::Status::OK;
}

grpc::Status AdminService::DeleteModel(grpc::ServerContext* context,
                                       const pb::DeleteModelRequest* request,
                                       pb::DeleteModelResponse* response) {
  if (grpc::Status s = Admit(*context); !s.ok()) return s;
  if (absl::Status s = shared_->admin->Delete(request->name()); !s.ok()) return ToGrpcStatus(s);
  response->set_name(request->name());
  response->set_deleted(true);
  return grpc::Status::OK;
}

grpc::Status AdminService::CancelJob(grpc::ServerContext* context,
                                     const pb::CancelJobRequest* request, pb::ModelInfo* response) {
  if (grpc::Status s = Admit(*context); !s.ok()) return s;
  if (absl::Status s = shared_->admin->Cancel(request->name()); !s.ok()) return ToGrpcStatus(s);
  auto info = shared_->admin->Get(request->name());
  if (!info.ok()) return ToGrpcStatus(info.status());
  ToProto(*info, response);
  return grpc::Status::OK;
}

grpc::Status AdminService::WatchModel(grpc::ServerContext* context,
                                      const pb::WatchModelRequest* request,
                                      grpc::ServerWriter<pb::ModelInfo>* writer) {
  if (grpc::Status s = Admit(*context); !s.ok()) return s;
  auto info = shared_->admin->Get(request->name());
  if (!info.ok()) return ToGrpcStatus(info.status());
  pb::ModelInfo message;
  // Short waits: a cancelled call or a stopping server is noticed within one.
  constexpr auto kPoll = std::chrono::milliseconds(200);
  while (true) {
    message.Clear();
    ToProto(*info, &message);
    if (!writer->Write(message)) {
      return grpc::Status(grpc::StatusCode::CANCELLED, "the client went away");
    }
    if (Terminal(*info) && !request->follow()) return grpc::Status::OK;
    const int64_t seen = info->version;
    while (true) {
      if (context->IsCancelled()) {
        return grpc::Status(grpc::StatusCode::CANCELLED, "the client cancelled the watch");
      }
      if (shared_->draining.load()) {
        return grpc::Status(grpc::StatusCode::UNAVAILABLE, "the server is shutting down");
      }
      info = shared_->admin->WaitForChange(request->name(), seen, kPoll);
      if (!info.ok()) return ToGrpcStatus(info.status());
      if (info->version > seen) break;
    }
  }
}

}  // namespace thermocline::server
