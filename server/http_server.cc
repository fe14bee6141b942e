#include "server/http_server.h"

#include <httplib.h>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "server/engine_report.h"
#include "server/errors.h"
#include "server/http_access.h"
#include "server/model_metrics.h"
#include "server/openai_request.h"
#include "spdlog/spdlog.h"

namespace thermocline::server {
namespace {

using nlohmann::json;

// Equal-time comparison, so a key cannot be guessed byte by byte from response times.
bool SameSecret(std::string_view given, std::string_view key) {
  if (key.empty()) return false;
  unsigned char diff = given.size() != key.size();
  for (size_t i = 0; i < given.size(); ++i) diff |= given[i] ^ key[i % key.size()];
  return diff == 0;
}

std::string Dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

// Route patterns as metric labels: bounded cardinality, whatever paths clients send.
const char* EndpointLabel(const std::string& method, const std::string& path) {
  static const char* const kKnown[] = {
      "/v1/chat/completions", "/v1/completions", "/v1/models", "/tokenize",
      "/detokenize",          "/health",         "/metrics"};
  for (const char* k : kKnown) {
    if (path == k) return k;
  }
  if (method == "GET" && absl::StartsWith(path, "/v1/models/")) return "/v1/models/{id}";
  if (path == "/admin/models") return "/admin/models";
  if (absl::StartsWith(path, "/admin/models/")) return "/admin/models/{name}";
  return "other";
}

json ModelObject(const ServedModel& m) {
  const std::shared_ptr<const LoadedModel> loaded = m.loaded();
  const std::shared_ptr<const Engine> engine = loaded ? loaded->engine() : nullptr;
  return {{"id", m.config.name},
          {"object", "model"},
          {"created", loaded ? loaded->created : 0},
          {"owned_by", "thermocline"},
          {"status", ModelStateName(m.state.load())},
          {"loaded", loaded != nullptr},
          {"context_length", loaded ? loaded->n_ctx : 0},
          {"chat_template", loaded ? loaded->chat_template->name() : ""},
          {"mode", m.mode()},
          {"placement", engine ? EnginePlacementSummaryJson(*engine) : json(nullptr)},
          {"runs_on", engine ? RunsOnJson(engine->placement()) : json(nullptr)}};
}

}  // namespace

HttpFrontEnd::HttpFrontEnd(const ServerConfig& config, ModelRegistry* registry, Metrics* metrics)
    : config_(config),
      registry_(registry),
      metrics_(metrics),
      http_(std::make_unique<httplib::Server>()) {
  const size_t threads = static_cast<size_t>(config_.http_threads);
  http_->new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  http_->set_payload_max_length(static_cast<size_t>(config_.max_body_bytes));
  http_->set_read_timeout(config_.read_timeout_s, 0);
  http_->set_write_timeout(config_.write_timeout_s, 0);
  http_->set_keep_alive_timeout(2);
  Routes();
}

HttpFrontEnd::~HttpFrontEnd() = default;

absl::StatusOr<int> HttpFrontEnd::Bind() {
  int port = config_.port;
  if (port == 0) {
    port = http_->bind_to_any_port(config_.host);
    if (port < 0) port = 0;
  } else if (!http_->bind_to_port(config_.host, port)) {
    port = 0;
  }
  if (port == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", config_.host, ":", config_.port,
                                               " (address in use or not available?)"));
  }
  return port;
}

void HttpFrontEnd::Listen() { http_->listen_after_bind(); }
void HttpFrontEnd::Stop() { http_->stop(); }

namespace {

std::string RequestKey(const httplib::Request& req) {
  std::string key = req.get_header_value("X-Api-Key");
  const std::string auth = req.get_header_value("Authorization");
  if (key.empty() && auth.size() > 7 && absl::EqualsIgnoreCase(auth.substr(0, 7), "Bearer ")) {
    key = std::string(absl::StripAsciiWhitespace(auth.substr(7)));
  }
  return key;
}

}  // namespace

bool HttpFrontEnd::AdminAuthorized(const httplib::Request& req) const {
  if (config_.admin_key.empty()) return Authorized(req);
  return SameSecret(RequestKey(req), config_.admin_key);
}

bool HttpFrontEnd::Authorized(const httplib::Request& req) const {
  if (config_.api_keys.empty()) return true;
  const std::string key = RequestKey(req);
  bool ok = false;
  for (const std::string& k : config_.api_keys) ok |= SameSecret(key, k);
  return ok;
}

void HttpFrontEnd::SendError(httplib::Response& res, const absl::Status& status) const {
  const ApiError e = ToApiError(status);
  res.status = e.http_status;
  if (e.http_status == 503) res.set_header("Retry-After", std::to_string(config_.retry_after_s));
  res.set_content(ApiErrorJson(e), "application/json");
}

void HttpFrontEnd::Routes() {
  using httplib::Request;
  using httplib::Response;
  // Every handler but /health needs the key when one is configured. The body has been read by
  // then (bounded by max_body_bytes), so the connection stays usable.
  auto guarded = [this](auto handler) {
    return [this, handler](const Request& req, Response& res) {
      if (!Authorized(req)) {
        SendError(res, Unauthenticated("a valid API key is required: send 'Authorization: "
                                       "Bearer KEY' or 'X-Api-Key: KEY'"));
        return;
      }
      handler(req, res);
    };
  };
  http_->set_pre_routing_handler([](const Request&, Response&) {
    CurrentAccess() = AccessRecord{std::chrono::steady_clock::now()};
    return httplib::Server::HandlerResponse::Unhandled;
  });
  http_->Post("/v1/chat/completions", guarded([this](const Request& req, Response& res) {
                HandleGeneration(req, res, ApiKind::kChat);
              }));
  http_->Post("/v1/completions", guarded([this](const Request& req, Response& res) {
                HandleGeneration(req, res, ApiKind::kCompletion);
              }));
  http_->Get("/v1/models",
             guarded([this](const Request& req, Response& res) { HandleModels(req, res); }));
  http_->Get(R"(/v1/models/(.+))",
             guarded([this](const Request& req, Response& res) { HandleModels(req, res); }));
  http_->Post("/tokenize",
              guarded([this](const Request& req, Response& res) { HandleTokenize(req, res); }));
  http_->Post("/detokenize",
              guarded([this](const Request& req, Response& res) { HandleDetokenize(req, res); }));
  http_->Get("/metrics", guarded([this](const Request&, Response& res) {
               res.set_content(metrics_->Render() + RenderModelMetrics(*registry_),
                               "text/plain; version=0.0.4; charset=utf-8");
             }));
  http_->Get("/health", [this](const Request&, Response& res) { HandleHealth(res); });
  AdminRoutes();
  // Statuses cpp-httplib sets by itself (404 no route, 413 body too large, 400 bad request
  // line) get the same JSON error body as ours.
  http_->set_error_handler([this](const Request& req, Response& res) {
    if (!res.body.empty()) return;
    if (res.status == 404) {
      SendError(res,
                NotFound("not_found", absl::StrCat("no route for ", req.method, " ", req.path)));
    } else if (res.status == 413) {
      SendError(res, InvalidRequest("", "payload_too_large",
                                    absl::StrCat("the request body is larger than ",
                                                 config_.max_body_bytes, " bytes")));
      res.status = 413;
    } else {
      ApiError e{res.status, res.status >= 500 ? "server_error" : "invalid_request_error", "", "",
                 absl::StrCat("HTTP ", res.status)};
      res.set_content(ApiErrorJson(e), "application/json");
    }
  });
  http_->set_exception_handler([this](const Request&, Response& res, std::exception_ptr ep) {
    std::string what = "unknown exception";
    try {
      std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    spdlog::error("handler threw: {}", what);
    SendError(res, absl::InternalError(absl::StrCat("internal error: ", what)));
  });
  // Counted just before the response goes out, so a client that has its answer sees it in
  // /metrics; the access log line waits for the end of a stream.
  http_->set_post_routing_handler([this](const Request& req, Response& res) {
    metrics_->CountRequest("http", EndpointLabel(req.method, req.path), std::to_string(res.status));
  });
  http_->set_logger([this](const Request& req, const Response& res) { AccessLog(req, res); });
}

void HttpFrontEnd::AccessLog(const httplib::Request& req, const httplib::Response& res) {
  const AccessRecord& a = CurrentAccess();
  // Paths are client-chosen (and URL-decoded): no control characters into the log.
  std::string path = req.path.substr(0, 256);
  for (char& c : path) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = '?';
  }
  if (!config_.access_log) return;
  const double total =
      a.start == std::chrono::steady_clock::time_point{}
          ? 0
          : std::chrono::duration<double>(std::chrono::steady_clock::now() - a.start).count();
  if (a.prompt_tokens >= 0) {
    spdlog::info("{} {} {} {} prompt={} completion={} ttft={:.3f}s total={:.3f}s{}{}",
                 req.remote_addr, req.method, path, res.status, a.prompt_tokens,
                 std::max<int64_t>(a.completion_tokens, 0), std::max(a.ttft_seconds, 0.0), total,
                 *a.outcome ? " " : "", a.outcome);
  } else {
    spdlog::info("{} {} {} {} total={:.3f}s", req.remote_addr, req.method, path, res.status, total);
  }
}

void HttpFrontEnd::HandleHealth(httplib::Response& res) {
  const char* status = "ok";
  if (draining_.load()) {
    status = "shutting_down";
  } else if (scheduler_.load() == nullptr || !registry_->all_ready()) {
    status = "loading";
  }
  res.status = std::string_view(status) == "ok" ? 200 : 503;
  if (res.status == 503) res.set_header("Retry-After", std::to_string(config_.retry_after_s));
  res.set_content(json{{"status", status}}.dump(), "application/json");
}

void HttpFrontEnd::HandleModels(const httplib::Request& req, httplib::Response& res) {
  if (req.matches.size() > 1) {
    const std::string id = req.matches[1];
    for (const ServedModel* m : registry_->models()) {
      if (m->config.name == id) {
        res.set_content(Dump(ModelObject(*m)), "application/json");
        return;
      }
    }
    SendError(res, NotFound("model_not_found", absl::StrCat("model '", id, "' does not exist")));
    return;
  }
  json data = json::array();
  for (const ServedModel* m : registry_->models()) data.push_back(ModelObject(*m));
  res.set_content(Dump(json{{"object", "list"}, {"data", data}}), "application/json");
}

}  // namespace thermocline::server
