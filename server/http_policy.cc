#include "server/http_policy.h"

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace thermocline::server {
namespace {

// Equal-time comparison, so a key cannot be guessed byte by byte from response times.
bool SameSecret(std::string_view given, std::string_view key) {
  if (key.empty()) return false;
  unsigned char diff = given.size() != key.size();
  for (size_t i = 0; i < given.size(); ++i) diff |= given[i] ^ key[i % key.size()];
  return diff == 0;
}

std::string Lower(absl::string_view s) { return absl::AsciiStrToLower(s); }

// "name:port", "[v6]:port", "name" -> the host name in lower case.
std::string HostName(std::string_view host_field) {
  absl::string_view host = absl::StripAsciiWhitespace(ToAbsl(host_field));
  if (!host.empty() && host.front() == '[') {
    const size_t close = host.find(']');
    return Lower(host.substr(1, close == absl::string_view::npos ? host.npos : close - 1));
  }
  const size_t colon = host.find(':');
  if (colon != absl::string_view::npos && host.find(':', colon + 1) == absl::string_view::npos) {
    host = host.substr(0, colon);
  }
  return Lower(host);
}

bool IsWildcardAddress(const std::string& host) {
  return host.empty() || host == "0.0.0.0" || host == "::" || host == "[::]" || host == "*";
}

bool IsJsonMediaType(std::string_view type) {
  const std::string t = Lower(absl::StripAsciiWhitespace(ToAbsl(type.substr(0, type.find(';')))));
  return t == "application/json" || absl::EndsWith(t, "+json");
}

ApiError Error(int status, const char* type, const char* code, std::string message) {
  ApiError e;
  e.http_status = status;
  e.type = type;
  e.code = code;
  e.message = std::move(message);
  return e;
}

}  // namespace

RouteAccess AccessOf(std::string_view method, std::string_view path) {
  if (method == "OPTIONS") return RouteAccess::kPublic;
  if (path == "/health") return RouteAccess::kPublic;
  if (path == "/admin" || absl::StartsWith(ToAbsl(path), "/admin/")) return RouteAccess::kAdmin;
  return RouteAccess::kApi;
}

bool TakesBody(std::string_view method, std::string_view path) {
  if (method == "POST") {
    static const char* const kPost[] = {
        "/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/tokenize",
        "/detokenize",          "/admin/models",   "/api/chat",      "/api/generate",
        "/api/embed",           "/api/embeddings", "/api/show"};
    for (const char* p : kPost) {
      if (path == p) return true;
    }
    // /admin/models/NAME/cancel
    absl::string_view rest = ToAbsl(path);
    return absl::ConsumePrefix(&rest, "/admin/models/") && absl::ConsumeSuffix(&rest, "/cancel") &&
           !rest.empty() && rest.find('/') == absl::string_view::npos;
  }
  if (method == "DELETE") {
    absl::string_view rest = ToAbsl(path);
    return absl::ConsumePrefix(&rest, "/admin/models/") && !rest.empty() &&
           rest.find('/') == absl::string_view::npos;
  }
  return false;
}

bool IsProbe(std::string_view method, std::string_view path) {
  return (method == "GET" || method == "HEAD") && (path == "/health" || path == "/metrics");
}

std::string RequestKey(std::string_view x_api_key, std::string_view authorization) {
  if (!x_api_key.empty()) return std::string(x_api_key);
  if (authorization.size() > 7 &&
      absl::EqualsIgnoreCase(ToAbsl(authorization.substr(0, 7)), "Bearer ")) {
    return std::string(absl::StripAsciiWhitespace(ToAbsl(authorization.substr(7))));
  }
  return "";
}

RequestPolicy::RequestPolicy(const ServerConfig& config)
    : api_keys_(config.api_keys), admin_key_(config.admin_key) {
  if (!config.allowed_hosts.empty()) {
    for (const std::string& h : config.allowed_hosts) {
      if (h == "*") any_host_ = true;
      hosts_.push_back(absl::StartsWith(h, "*.") ? Lower(h) : HostName(h));
    }
  } else if (IsWildcardAddress(config.host)) {
    any_host_ = true;  // the names of a machine serving its network are not known here
  } else {
    hosts_ = {"localhost", "127.0.0.1", "::1", HostName(config.host)};
  }
  for (const std::string& o : config.cors_allowed_origins) {
    if (o == "*") any_origin_ = true;
    origins_.push_back(Lower(absl::StripSuffix(o, "/")));
  }
}

bool RequestPolicy::HostAllowed(std::string_view host) const {
  if (any_host_) return true;
  const std::string name = HostName(host);
  for (const std::string& h : hosts_) {
    if (h == name) return true;
    if (absl::StartsWith(h, "*.") && absl::EndsWith(name, h.substr(1))) return true;
  }
  return false;
}

std::string RequestPolicy::AllowedOrigin(std::string_view origin) const {
  if (any_origin_) return "*";
  const std::string o = Lower(ToAbsl(origin));
  for (const std::string& allowed : origins_) {
    if (allowed == o) return std::string(origin);
  }
  return "";
}

std::vector<std::pair<std::string, std::string>> RequestPolicy::CorsHeaders(std::string_view origin,
                                                                            bool preflight) const {
  std::vector<std::pair<std::string, std::string>> out;
  const std::string allowed = origin.empty() ? "" : AllowedOrigin(origin);
  if (allowed.empty()) return out;
  out.emplace_back("Access-Control-Allow-Origin", allowed);
  if (allowed != "*") out.emplace_back("Vary", "Origin");
  if (preflight) {
    out.emplace_back("Access-Control-Allow-Methods", "GET, POST, DELETE, OPTIONS");
    out.emplace_back("Access-Control-Allow-Headers", "Authorization, Content-Type, X-Api-Key");
    out.emplace_back("Access-Control-Max-Age", "600");
  } else {
    out.emplace_back("Access-Control-Expose-Headers", "Retry-After");
  }
  return out;
}

bool RequestPolicy::Authorized(RouteAccess access, std::string_view key) const {
  switch (access) {
    case RouteAccess::kPublic:
      return true;
    case RouteAccess::kAdmin:
      if (!admin_key_.empty()) return SameSecret(key, admin_key_);
      [[fallthrough]];
    case RouteAccess::kApi: {
      if (api_keys_.empty()) return true;
      bool ok = false;
      for (const std::string& k : api_keys_) ok |= SameSecret(key, k);
      return ok;
    }
  }
  return false;
}

std::optional<ApiError> RequestPolicy::Check(std::string_view method, std::string_view path,
                                             const Fields& field, bool has_body) const {
  if (const std::string host = field("Host"); !host.empty() && !HostAllowed(host)) {
    return Error(403, "permission_error", "host_not_allowed",
                 absl::StrCat("this server does not answer to the host name '", HostName(host),
                              "' (server.allowed_hosts lists the names it answers to)"));
  }
  if (const std::string origin = field("Origin"); !origin.empty()) {
    // Same origin: a page served under this very host (e.g. behind a reverse proxy).
    absl::string_view bare = origin;
    const bool same =
        (absl::ConsumePrefix(&bare, "http://") || absl::ConsumePrefix(&bare, "https://")) &&
        Lower(bare) == Lower(field("Host"));
    if (!same && AllowedOrigin(origin).empty()) {
      return Error(403, "permission_error", "origin_not_allowed",
                   absl::StrCat("requests from pages of ", origin,
                                " are not allowed (server.cors_allowed_origins)"));
    }
  }
  const RouteAccess access = AccessOf(method, path);
  if (!Authorized(access, RequestKey(field("X-Api-Key"), field("Authorization")))) {
    return Error(401, "authentication_error", "invalid_api_key",
                 access == RouteAccess::kAdmin
                     ? "the admin API needs the admin key (or the API key when no admin key is "
                       "set): 'Authorization: Bearer KEY'"
                     : "a valid API key is required: send 'Authorization: Bearer KEY' or "
                       "'X-Api-Key: KEY'");
  }
  if (has_body) {
    if (!TakesBody(method, path)) {
      return Error(
          404, "not_found_error", "not_found",
          absl::StrCat("no route for ", ToAbsl(method), " ", ToAbsl(path), " with a body"));
    }
    // Ollama's routes take JSON whatever the type says, as Ollama does: its documented calls
    // are `curl -d '{...}'`, sent as a form. (Pages of other origins are refused above.)
    const bool ollama = absl::StartsWith(ToAbsl(path), "/api/");
    if (const std::string type = field("Content-Type");
        !ollama && !type.empty() && !IsJsonMediaType(type)) {
      return Error(
          415, "invalid_request_error", "unsupported_media_type",
          absl::StrCat("the body must be JSON (Content-Type: application/json), not '", type, "'"));
    }
    const std::string coding = Lower(absl::StripAsciiWhitespace(field("Content-Encoding")));
    if (!coding.empty() && coding != "identity" && coding != "gzip" && coding != "deflate" &&
        coding != "br") {
      return Error(415, "invalid_request_error", "unsupported_media_type",
                   absl::StrCat("unsupported Content-Encoding '", coding,
                                "'; send identity, gzip, deflate or br"));
    }
  }
  return std::nullopt;
}

}  // namespace thermocline::server
