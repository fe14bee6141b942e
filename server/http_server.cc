#include "server/http_server.h"

#include <httplib.h>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"
#include "server/engine_report.h"
#include "server/errors.h"
#include "server/http_access.h"
#include "server/http_connection.h"
#include "server/model_metrics.h"
#include "server/openai_request.h"
#include "spdlog/spdlog.h"

namespace thermocline::server {
namespace {

using nlohmann::json;

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
  static const char* const kMore[] = {"/v1/embeddings", "/api/chat",       "/api/generate",
                                      "/api/embed",     "/api/embeddings", "/api/tags",
                                      "/api/show",      "/api/ps",         "/api/version"};
  for (const char* k : kMore) {
    if (path == k) return k;
  }
  if (path == "/admin/models") return "/admin/models";
  if (absl::StartsWith(path, "/admin/models/")) return "/admin/models/{name}";
  return "other";
}

json ModelObject(const ServedModel& m) {
  const std::shared_ptr<const LoadedModel> loaded = m.loaded();
  const std::shared_ptr<const Engine> engine = loaded ? loaded->engine() : nullptr;
  const ModelState state = m.state.load();
  json model = {{"id", m.config.name},
                {"object", "model"},
                {"created", loaded ? loaded->created : 0},
                {"owned_by", "thermocline"},
                {"status", ModelStateName(state)},
                {"loaded", loaded != nullptr},
                {"context_length", loaded ? loaded->n_ctx : 0},
                {"chat_template", loaded ? loaded->chat_template->name() : ""},
                {"mode", m.mode()},
                {"placement", engine ? EnginePlacementSummaryJson(*engine) : json(nullptr)},
                {"runs_on", engine ? RunsOnJson(engine->placement()) : json(nullptr)}};
  if (state == ModelState::kFailed) model["error"] = m.error();
  if (const std::string warning = m.warning(); !warning.empty()) model["warning"] = warning;
  return model;
}

ConnectionLimits LimitsOf(const ServerConfig& c) {
  ConnectionLimits l;
  l.head.max_bytes = static_cast<size_t>(c.max_header_bytes);
  l.head.max_fields = static_cast<size_t>(c.max_headers);
  l.max_body_bytes = static_cast<uint64_t>(c.max_body_bytes);
  l.header_timeout = std::chrono::seconds(c.header_timeout_s);
  l.body_timeout = std::chrono::seconds(c.body_timeout_s);
  l.read_timeout = std::chrono::seconds(c.read_timeout_s);
  l.idle_timeout = std::chrono::seconds(c.keep_alive_s);
  l.write_timeout = std::chrono::seconds(c.write_timeout_s);
  l.workers = c.http_threads;
  l.max_connections = c.max_connections;
  l.max_connections_per_client = c.max_connections_per_client;
  l.max_inflight_bytes = static_cast<uint64_t>(c.max_inflight_bytes);
  l.backlog = c.listen_backlog;
  return l;
}

// Paths are client-chosen (and URL-decoded): no control characters into the log.
std::string LoggedPath(const std::string& path) {
  std::string out = path.substr(0, 256);
  for (char& c : out) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = '?';
  }
  return out;
}

}  // namespace

HttpFrontEnd::HttpFrontEnd(const ServerConfig& config, ModelRegistry* registry, Metrics* metrics)
    : config_(config),
      registry_(registry),
      metrics_(metrics),
      policy_(config),
      paths_(config.allowed_paths) {
  http_ = std::make_unique<GuardedServer>(
      LimitsOf(config_),
      [this](const RequestHead& head) {
        return HeadVerdict{RefusedByHead(head), IsProbe(head.method, head.path)};
      },
      // Requests the connection layer answered itself: counted and logged like the others.
      [this](const Refusal& r) {
        metrics_->CountRequest("http", EndpointLabel(r.method, r.path), std::to_string(r.status));
        if (!config_.access_log) return;
        spdlog::info("{} {} {} {} total=0.000s refused: {}", r.remote_addr,
                     r.method.empty() ? "-" : r.method, r.path.empty() ? "-" : LoggedPath(r.path),
                     r.status, r.code);
      });
  http_->set_read_timeout(config_.read_timeout_s, 0);
  http_->set_write_timeout(config_.write_timeout_s, 0);
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
  if (!http_->ApplyBacklog()) {
    spdlog::warn("cannot raise the listen backlog to {}", config_.listen_backlog);
  }
  return port;
}

void HttpFrontEnd::Listen() { http_->listen_after_bind(); }
void HttpFrontEnd::Stop() { http_->stop(); }

bool HttpFrontEnd::RefusedByHead(const RequestHead& head) const {
  const bool has_body = head.framing != BodyFraming::kNone &&
                        !(head.framing == BodyFraming::kLength && head.content_length == 0);
  return policy_
      .Check(
          head.method, head.path, [&](std::string_view name) { return head.Field(name); }, has_body)
      .has_value();
}

void HttpFrontEnd::SendError(httplib::Response& res, const absl::Status& status) const {
  SendApiError(res, ToApiError(status));
}

void HttpFrontEnd::SendApiError(httplib::Response& res, const ApiError& e) const {
  res.status = e.http_status;
  if (e.http_status == 503) res.set_header("Retry-After", std::to_string(config_.retry_after_s));
  res.set_content(ApiErrorJson(e), "application/json");
}

ApiError HttpFrontEnd::PayloadTooLarge() const {
  return ApiError{413, "invalid_request_error", "payload_too_large", "",
                  absl::StrCat("the request body is larger than ", config_.max_body_bytes,
                               " bytes (server.max_body_bytes; counted after decompression)")};
}

std::function<void(const httplib::Request&, httplib::Response&, const httplib::ContentReader&)>
HttpFrontEnd::WithBody(BodyHandler handler) {
  return [this, handler = std::move(handler)](const httplib::Request& req, httplib::Response& res,
                                              const httplib::ContentReader& reader) {
    // The decoded bytes count (a small gzip body may inflate a thousandfold): reading stops at
    // the limit instead of inflating the rest.
    const size_t limit = static_cast<size_t>(config_.max_body_bytes);
    std::string body;
    bool too_large = false;
    const bool ok = reader([&](const char* data, size_t n) {
      if (body.size() + n > limit) {
        too_large = true;
        return false;
      }
      body.append(data, n);
      return true;
    });
    if (too_large) return SendApiError(res, PayloadTooLarge());
    if (!ok) {
      return SendError(res, InvalidRequest("", "invalid_body",
                                           "the request body could not be read (a broken "
                                           "chunked framing or compressed stream)"));
    }
    handler(req, res, body);
  };
}

void HttpFrontEnd::Routes() {
  using httplib::Request;
  using httplib::Response;
  // Before any body is read: the policy (host, origin, key, media type), and a fresh access
  // record. The connection layer has refused the same requests from their head already; this
  // is where their answer is written.
  http_->set_pre_routing_handler([this](const Request& req, Response& res) {
    CurrentAccess() = AccessRecord{std::chrono::steady_clock::now()};
    const bool has_body =
        req.has_header("Transfer-Encoding") ||
        httplib::detail::get_header_value<uint64_t>(req.headers, "Content-Length", 0, 0) > 0;
    auto refusal = policy_.Check(
        req.method, req.path,
        [&](std::string_view name) { return req.get_header_value(std::string(name)); }, has_body);
    if (!refusal) return httplib::Server::HandlerResponse::Unhandled;
    SendApiError(res, *refusal);
    if (absl::StartsWith(req.path, "/api/")) {  // Ollama's routes: Ollama's error shape
      res.set_content(Dump(json{{"error", refusal->message}}), "application/json");
    }
    return httplib::Server::HandlerResponse::Handled;
  });
  http_->Post("/v1/chat/completions",
              WithBody([this](const Request& req, Response& res, const std::string& body) {
                HandleGeneration(req, res, body, ApiKind::kChat);
              }));
  http_->Post("/v1/completions",
              WithBody([this](const Request& req, Response& res, const std::string& body) {
                HandleGeneration(req, res, body, ApiKind::kCompletion);
              }));
  http_->Get("/v1/models", [this](const Request& req, Response& res) { HandleModels(req, res); });
  http_->Get(R"(/v1/models/(.+))",
             [this](const Request& req, Response& res) { HandleModels(req, res); });
  http_->Post("/tokenize", WithBody([this](const Request&, Response& res, const std::string& body) {
                HandleTokenize(body, res);
              }));
  http_->Post("/detokenize",
              WithBody([this](const Request&, Response& res, const std::string& body) {
                HandleDetokenize(body, res);
              }));
  http_->Get("/metrics", [this](const Request&, Response& res) {
    res.set_content(metrics_->Render() + RenderModelMetrics(*registry_),
                    "text/plain; version=0.0.4; charset=utf-8");
  });
  http_->Get("/health", [this](const Request&, Response& res) { HandleHealth(res); });
  // CORS preflights (the policy has refused those of origins that are not allowed).
  http_->Options(".*", [this](const Request& req, Response& res) {
    res.status = 204;
    res.set_header("Allow", "GET, POST, DELETE, OPTIONS");
    for (const auto& [k, v] : policy_.CorsHeaders(req.get_header_value("Origin"), true)) {
      res.set_header(k, v);
    }
  });
  AdminRoutes();
  OllamaRoutes();
  // Statuses cpp-httplib sets by itself (404 no route, 413 body too large, 400 bad request
  // line) get the same JSON error body as ours.
  http_->set_error_handler([this](const Request& req, Response& res) {
    if (!res.body.empty()) return;
    if (res.status == 404 && absl::StartsWith(req.path, "/api/")) {
      res.set_content(Dump(json{{"error", absl::StrCat("no route for ", req.method, " ", req.path,
                                                       " (docs/api.md lists Ollama's routes "
                                                       "served here)")}}),
                      "application/json");
    } else if (res.status == 404) {
      SendError(res,
                NotFound("not_found", absl::StrCat("no route for ", req.method, " ", req.path)));
    } else if (res.status == 413) {
      SendApiError(res, PayloadTooLarge());
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
  http_->SetPostRoutingHandler([this](const Request& req, Response& res) {
    for (const auto& [k, v] : policy_.CorsHeaders(req.get_header_value("Origin"), false)) {
      if (!res.has_header(k.c_str())) res.set_header(k, v);
    }
    metrics_->CountRequest("http", EndpointLabel(req.method, req.path), std::to_string(res.status));
  });
  http_->set_logger([this](const Request& req, const Response& res) {
    AccessLog(req, res);
    CurrentAccess() = AccessRecord{};  // the next request on this thread starts clean
  });
}

void HttpFrontEnd::AccessLog(const httplib::Request& req, const httplib::Response& res) {
  const AccessRecord& a = CurrentAccess();
  if (!config_.access_log) return;
  const std::string path = LoggedPath(req.path);
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
  registry_->CheckFiles();  // a model whose file changed is listed failed, with why
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
