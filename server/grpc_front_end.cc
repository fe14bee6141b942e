#include "server/grpc_front_end.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <thread>

#include "absl/strings/str_cat.h"
#include "server/grpc_admin_service.h"
#include "server/grpc_inference_service.h"
#include "spdlog/spdlog.h"

namespace thermocline::server {

GrpcFrontEnd::GrpcFrontEnd(const ServerConfig& config, ModelRegistry* registry, ModelAdmin* admin)
    : config_(config) {
  shared_.config = &config;
  shared_.registry = registry;
  shared_.admin = admin;
  inference_ = std::make_unique<InferenceService>(&shared_);
  admin_ = std::make_unique<AdminService>(&shared_);
  health_ = std::make_unique<HealthService>(&shared_);
}

GrpcFrontEnd::~GrpcFrontEnd() { Shutdown(Clock::now()); }

absl::StatusOr<int> GrpcFrontEnd::Start() {
  // Registers the reflection service with every builder made after it (process-wide, once).
  static const bool reflection = [] {
    grpc::reflection::InitProtoReflectionServerBuilderPlugin();
    return true;
  }();
  (void)reflection;
  const bool ipv6 = config_.host.find(':') != std::string::npos;
  const std::string address = ipv6 ? absl::StrCat("[", config_.host, "]:", config_.grpc_port)
                                   : absl::StrCat(config_.host, ":", config_.grpc_port);
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(address, grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(inference_.get());
  builder.RegisterService(admin_.get());
  builder.RegisterService(health_.get());
  // A generation request is small; a prompt of token ids may be long, but 16 MiB is plenty.
  builder.SetMaxReceiveMessageSize(16 << 20);
  server_ = builder.BuildAndStart();
  if (server_ == nullptr || port == 0) {
    server_.reset();
    return absl::UnavailableError(
        absl::StrCat("cannot serve gRPC on ", address,
                     " (in use, or not an address of this machine): choose another with "
                     "--grpc-port N (0 = any free port) or turn it off with --grpc-port "
                     "off"));
  }
  return port;
}

void GrpcFrontEnd::Shutdown(Clock::time_point deadline) {
  std::lock_guard<std::mutex> lock(shutdown_mu_);
  if (shut_down_ || server_ == nullptr) return;
  shut_down_ = true;
  // Streams in flight may finish within the grace period; meanwhile new calls are answered
  // UNAVAILABLE by the services (a gRPC server that is shutting down would only cancel them).
  SetDraining();
  while (shared_.active_streams.load() > 0 && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  const auto left = deadline - Clock::now();
  server_->Shutdown(std::chrono::system_clock::now() +
                    std::chrono::duration_cast<std::chrono::system_clock::duration>(left));
  server_->Wait();
}

}  // namespace thermocline::server
