// Who may send what to the HTTP front end, decided from a request's method, path and header
// fields alone, so that a refused request is answered before its body is read: the Host header
// against the names the server answers to (DNS rebinding), the Origin against the CORS policy
// (off by default; a page of another origin is refused, not only kept from reading the answer),
// the API or admin key, and the body's media type and coding (JSON only, identity, gzip,
// deflate or br). Also the route table of which requests carry a body, and the CORS headers.
// Pure and thread-safe once built.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "server/config.h"
#include "server/errors.h"

namespace thermocline::server {

enum class RouteAccess {
  kPublic,  // /health, CORS preflights
  kApi,     // the OpenAI API, tokenizer, /metrics: an API key when keys are configured
  kAdmin    // /admin/*: the admin key (else an API key)
};
RouteAccess AccessOf(std::string_view method, std::string_view path);

// Whether (method, path) is a route whose handler reads a request body. Any other request with
// a body is refused before it is read (cpp-httplib would otherwise read, and inflate, it whole).
bool TakesBody(std::string_view method, std::string_view path);
// /health and /metrics: answered by the connection layer's priority workers.
bool IsProbe(std::string_view method, std::string_view path);

// The key a request carries: `X-Api-Key`, else `Authorization: Bearer KEY`.
std::string RequestKey(std::string_view x_api_key, std::string_view authorization);

class RequestPolicy {
 public:
  // Header field by name (case-insensitive), "" when absent.
  using Fields = std::function<std::string(std::string_view)>;

  explicit RequestPolicy(const ServerConfig& config);

  // The error a request gets before its handler runs, or nullopt. In order: 403 host_not_allowed,
  // 403 origin_not_allowed, 401 invalid_api_key, 415 unsupported_media_type (a body that is not
  // JSON, or an unknown Content-Encoding; Ollama's /api/ routes take any Content-Type), 404
  // not_found (a body on a route that takes none).
  std::optional<ApiError> Check(std::string_view method, std::string_view path, const Fields& field,
                                bool has_body) const;

  bool HostAllowed(std::string_view host) const;
  // What Access-Control-Allow-Origin says for `origin`: "*" or the origin itself; "" when the
  // origin may not call the API.
  std::string AllowedOrigin(std::string_view origin) const;
  // CORS headers of a response to a request from `origin` (none when it is not allowed), and,
  // with `preflight`, those that answer an OPTIONS preflight.
  std::vector<std::pair<std::string, std::string>> CorsHeaders(std::string_view origin,
                                                               bool preflight) const;
  bool Authorized(RouteAccess access, std::string_view key) const;

 private:
  bool any_host_ = false;
  std::vector<std::string> hosts_;  // lower case; "*.suffix" entries match subdomains
  bool any_origin_ = false;
  std::vector<std::string> origins_;  // lower case, no trailing '/'
  std::vector<std::string> api_keys_;
  std::string admin_key_;
};

}  // namespace thermocline::server
