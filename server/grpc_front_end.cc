#include "server/grpc_front_end.h"

#include <google/protobuf/descriptor.h>
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/support/server_interceptor.h>

#include <algorithm>
#include <chrono>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "server/errors.h"
#include "server/grpc_admin_service.h"
#include "server/grpc_health_service.h"
#include "server/grpc_inference_service.h"
#include "spdlog/spdlog.h"

namespace thermocline::server {

namespace {

namespace gx = grpc::experimental;

// At shutdown, after the streams in flight: how long the other calls get to end by themselves.
constexpr auto kCallsGrace = std::chrono::milliseconds(300);

const char* StatusCodeName(grpc::StatusCode code) {
  static const char* const kNames[] = {"OK",
                                       "CANCELLED",
                                       "UNKNOWN",
                                       "INVALID_ARGUMENT",
                                       "DEADLINE_EXCEEDED",
                                       "NOT_FOUND",
                                       "ALREADY_EXISTS",
                                       "PERMISSION_DENIED",
                                       "RESOURCE_EXHAUSTED",
                                       "FAILED_PRECONDITION",
                                       "ABORTED",
                                       "OUT_OF_RANGE",
                                       "UNIMPLEMENTED",
                                       "INTERNAL",
                                       "UNAVAILABLE",
                                       "DATA_LOSS",
                                       "UNAUTHENTICATED"};
  const int i = static_cast<int>(code);
  return i >= 0 && i < static_cast<int>(std::size(kNames)) ? kNames[i] : "UNKNOWN";
}

// The method as a metric label: "/package.Service/Method" when the process knows the method
// (our services, health, reflection), else "other", so clients cannot grow the label set.
std::string MethodLabel(const char* method) {
  const std::string_view m = method != nullptr ? method : "";
  if (m.size() < 2 || m[0] != '/') return "other";
  const std::string full = absl::StrReplaceAll(ToAbsl(m.substr(1)), {{"/", "."}});
  if (google::protobuf::DescriptorPool::generated_pool()->FindMethodByName(full) == nullptr) {
    return "other";
  }
  return std::string(m);
}

// On every call: counts it in thermocline_requests_total{frontend="grpc"} (when there are
// metrics), as the HTTP front end counts its requests: when the status goes out (so a client that
// has its answer sees it counted), or as CANCELLED when the call ends without one. And repairs
// the status of a request that does not parse: gRPC 1.51 answers it UNIMPLEMENTED (callback
// methods) or INTERNAL (synchronous ones), with no message; our handlers never send either
// without one, so for a method this server has, that status means an unparseable request.
class FrontInterceptor final : public gx::Interceptor {
 public:
  FrontInterceptor(Metrics* metrics, std::string method)
      : metrics_(metrics), method_(std::move(method)) {}
  ~FrontInterceptor() override {
    if (!counted_ && metrics_ != nullptr) metrics_->CountRequest("grpc", method_, "CANCELLED");
  }

  void Intercept(gx::InterceptorBatchMethods* methods) override {
    if (!counted_ &&
        methods->QueryInterceptionHookPoint(gx::InterceptionHookPoints::PRE_SEND_STATUS)) {
      counted_ = true;
      grpc::Status status = methods->GetSendStatus();
      if (method_ != "other" && status.error_message().empty() &&
          (status.error_code() == grpc::StatusCode::UNIMPLEMENTED ||
           status.error_code() == grpc::StatusCode::INTERNAL)) {
        status = grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                              "the request message could not be parsed as the method's request "
                              "type (see proto/thermocline/v1)");
        methods->ModifySendStatus(status);
      }
      if (metrics_ != nullptr) {
        metrics_->CountRequest("grpc", method_, StatusCodeName(status.error_code()));
      }
    }
    methods->Proceed();
  }

 private:
  Metrics* const metrics_;
  const std::string method_;
  bool counted_ = false;
};

class FrontInterceptorFactory final : public gx::ServerInterceptorFactoryInterface {
 public:
  explicit FrontInterceptorFactory(Metrics* metrics) : metrics_(metrics) {}
  gx::Interceptor* CreateServerInterceptor(gx::ServerRpcInfo* info) override {
    return new FrontInterceptor(metrics_, MethodLabel(info->method()));
  }

 private:
  Metrics* const metrics_;
};

}  // namespace

GrpcFrontEnd::GrpcFrontEnd(const ServerConfig& config, ModelRegistry* registry, ModelAdmin* admin,
                           Metrics* metrics)
    : config_(config), metrics_(metrics) {
  shared_.config = &config;
  shared_.registry = registry;
  shared_.admin = admin;
  inference_ = std::make_unique<InferenceService>(&shared_);
  admin_ = std::make_unique<AdminService>(&shared_);
  health_ = std::make_unique<HealthService>(&shared_);
}

GrpcFrontEnd::~GrpcFrontEnd() { Shutdown(Clock::now()); }

void GrpcFrontEnd::SetScheduler(Scheduler* scheduler) {
  shared_.scheduler.store(scheduler);
  health_->Notify();
}

void GrpcFrontEnd::SetDraining() {
  shared_.draining.store(true);
  health_->Notify();
}

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
  std::vector<std::unique_ptr<gx::ServerInterceptorFactoryInterface>> interceptors;
  interceptors.push_back(std::make_unique<FrontInterceptorFactory>(metrics_));
  builder.experimental().SetInterceptorCreators(std::move(interceptors));
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
  // What may remain are short unary calls and watchers, which end on their own once draining
  // (within their 200 ms poll): a moment for them, then the server cancels the rest and closes
  // the connections. A later deadline would also wait that long for every client that keeps an
  // idle connection open to hang up (seconds), although nothing runs on it.
  const auto end = std::min(deadline, Clock::now() + kCallsGrace);
  server_->Shutdown(std::chrono::system_clock::now() +
                    std::chrono::duration_cast<std::chrono::system_clock::duration>(
                        std::max(end - Clock::now(), Clock::duration::zero())));
  server_->Wait();
}

}  // namespace thermocline::server
