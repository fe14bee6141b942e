// The HTTP front end: OpenAI-compatible endpoints plus /tokenize, /detokenize, /health and
// /metrics over cpp-httplib. It translates HTTP into the native request model (through
// openai_request.h + request_builder.h), hands jobs to the scheduler and adapts their output
// to JSON or SSE; it never runs a model itself. API keys, body limits, the access log and the
// per-endpoint request counters live here.
#pragma once

#include <atomic>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "server/config.h"
#include "server/metrics.h"
#include "server/model_admin.h"
#include "server/model_registry.h"
#include "server/scheduler.h"

namespace httplib {
class Server;
struct Request;
struct Response;
}  // namespace httplib

namespace thermocline::server {

class HttpFrontEnd {
 public:
  HttpFrontEnd(const ServerConfig& config, ModelRegistry* registry, Metrics* metrics);
  ~HttpFrontEnd();

  // Binds host:port (port 0: any free port) and returns the port.
  absl::StatusOr<int> Bind();
  // Serves until Stop(); returns once every connection's handler has returned.
  void Listen();
  // Stops accepting connections; requests in flight go on. Thread-safe.
  void Stop();

  // Generation endpoints answer 503 "loading" until a started scheduler is set.
  void SetScheduler(Scheduler* scheduler) { scheduler_.store(scheduler); }
  // /admin/models answers 503 until the model admin is set (server/http_admin.cc).
  void SetAdmin(ModelAdmin* admin) { admin_.store(admin); }
  // Generation endpoints answer 503 "shutting_down" from now on; /health turns 503.
  void SetDraining() { draining_.store(true); }

 private:
  void Routes();
  void AdminRoutes();
  bool Authorized(const httplib::Request& req) const;
  // The admin key when one is configured, else Authorized.
  bool AdminAuthorized(const httplib::Request& req) const;
  void HandleGeneration(const httplib::Request& req, httplib::Response& res, ApiKind kind);
  void HandleModels(const httplib::Request& req, httplib::Response& res);
  void HandleTokenize(const httplib::Request& req, httplib::Response& res);
  void HandleDetokenize(const httplib::Request& req, httplib::Response& res);
  void HandleHealth(httplib::Response& res);
  void SendError(httplib::Response& res, const absl::Status& status) const;
  void AccessLog(const httplib::Request& req, const httplib::Response& res);

  const ServerConfig& config_;
  ModelRegistry* registry_;
  Metrics* metrics_;
  std::unique_ptr<httplib::Server> http_;
  std::atomic<Scheduler*> scheduler_{nullptr};
  std::atomic<ModelAdmin*> admin_{nullptr};
  std::atomic<bool> draining_{false};
};

}  // namespace thermocline::server
