// The HTTP front end: OpenAI-compatible endpoints plus /tokenize, /detokenize, /health and
// /metrics over cpp-httplib. It translates HTTP into the native request model (through
// openai_request.h + request_builder.h), hands jobs to the scheduler and adapts their output
// to JSON or SSE; it never runs a model itself. Connections are read by the connection layer
// (server/http_connection.h); who may send what is server/http_policy.h; the access log and the
// per-endpoint request counters live here.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "server/config.h"
#include "server/http_policy.h"
#include "server/metrics.h"
#include "server/model_admin.h"
#include "server/model_registry.h"
#include "server/path_policy.h"
#include "server/scheduler.h"

namespace httplib {
struct Request;
struct Response;
class ContentReader;
}  // namespace httplib

namespace thermocline::server {

class GuardedServer;
struct RequestHead;

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
  // A handler of a route that takes a JSON body: reads the body (decoded, at most
  // max_body_bytes) and passes it on; answers 413 / 400 itself when it cannot.
  using BodyHandler =
      std::function<void(const httplib::Request&, httplib::Response&, const std::string& body)>;
  std::function<void(const httplib::Request&, httplib::Response&, const httplib::ContentReader&)>
  WithBody(BodyHandler handler);
  // What the connection layer may decide from the head alone (server/http_connection.h).
  bool RefusedByHead(const RequestHead& head) const;
  void HandleGeneration(const httplib::Request& req, httplib::Response& res,
                        const std::string& body, ApiKind kind);
  void HandleModels(const httplib::Request& req, httplib::Response& res);
  void HandleTokenize(const std::string& body, httplib::Response& res);
  void HandleDetokenize(const std::string& body, httplib::Response& res);
  void HandleHealth(httplib::Response& res);
  // /v1/embeddings and Ollama's /api/* routes (server/http_ollama.cc).
  void OllamaRoutes();
  void HandleEmbeddings(const httplib::Request& req, httplib::Response& res,
                        const std::string& body);
  void HandleOllamaGeneration(const httplib::Request& req, httplib::Response& res,
                              const std::string& body, bool chat);
  void HandleOllamaEmbedding(const httplib::Request& req, httplib::Response& res,
                             const std::string& body, bool legacy);
  void HandleOllamaShow(httplib::Response& res, const std::string& body);
  void HandleOllamaModels(httplib::Response& res, bool running);
  void SendOllamaError(httplib::Response& res, const absl::Status& status) const;
  void SendError(httplib::Response& res, const absl::Status& status) const;
  void SendApiError(httplib::Response& res, const ApiError& error) const;
  ApiError PayloadTooLarge() const;
  void AccessLog(const httplib::Request& req, const httplib::Response& res);

  const ServerConfig& config_;
  ModelRegistry* registry_;
  Metrics* metrics_;
  const RequestPolicy policy_;
  const PathPolicy paths_;
  std::unique_ptr<GuardedServer> http_;
  std::atomic<Scheduler*> scheduler_{nullptr};
  std::atomic<ModelAdmin*> admin_{nullptr};
  std::atomic<bool> draining_{false};
};

}  // namespace thermocline::server
