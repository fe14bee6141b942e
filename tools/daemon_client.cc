// The client verbs' HTTP client (cpp-httplib): endpoint flags, JSON calls, SSE streams.
#include "tools/daemon_client.h"

#include <httplib.h>

#include <cstdio>
#include <cstdlib>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace thermocline::cli {
namespace {

constexpr int kCallTimeoutS = 120;
// Streams wait for tokens or job progress; a long silence is not an error.
constexpr int kStreamTimeoutS = 3600;
constexpr size_t kMaxErrorBody = 1 << 20;

absl::Status StatusForHttp(int status, const std::string& message) {
  switch (status) {
    case 400:
    case 413:
    case 422:
      return absl::InvalidArgumentError(message);
    case 401:
      return absl::UnauthenticatedError(message);
    case 403:
      return absl::PermissionDeniedError(message);
    case 404:
      return absl::NotFoundError(message);
    case 409:
      return absl::AlreadyExistsError(message);
    case 429:
    case 503:
      return absl::UnavailableError(message);
    case 500:
      return absl::InternalError(message);
    default:
      return absl::UnknownError(message);
  }
}

}  // namespace

std::string DaemonEndpoint::Url() const {
  const bool v6 = host.find(':') != std::string::npos;
  return absl::StrCat(scheme, "://", v6 ? "[" : "", host, v6 ? "]" : "", ":", port);
}

absl::Status ParseHostPort(const std::string& text, const std::string& what,
                           DaemonEndpoint* endpoint) {
  std::string rest(absl::StripAsciiWhitespace(text));
  const auto bad = [&](const std::string& why) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " '", text, "': ", why, "; use HOST:PORT or http://HOST:PORT, e.g. 127.0.0.1:8080"));
  };
  std::string scheme = endpoint->scheme;
  if (size_t sep = rest.find("://"); sep != std::string::npos) {
    scheme = absl::AsciiStrToLower(rest.substr(0, sep));
    if (scheme != "http" && scheme != "https") return bad("the scheme must be http or https");
    rest = rest.substr(sep + 3);
  }
  if (absl::EndsWith(rest, "/")) rest.pop_back();
  if (rest.find('/') != std::string::npos) return bad("a path is not allowed");
  std::string host = rest, port_text;
  if (absl::StartsWith(rest, "[")) {  // [v6]:port
    const size_t close = rest.find(']');
    if (close == std::string::npos) return bad("unclosed '['");
    host = rest.substr(1, close - 1);
    const std::string after = rest.substr(close + 1);
    if (!after.empty()) {
      if (after[0] != ':') return bad("expected ':' after ']'");
      port_text = after.substr(1);
    }
  } else if (size_t colon = rest.rfind(':'); colon != std::string::npos) {
    if (rest.find(':') != colon) return bad("write an IPv6 address in brackets, [::1]:8080");
    host = rest.substr(0, colon);
    port_text = rest.substr(colon + 1);
  }
  if (host.empty()) return bad("no host");
  int port = endpoint->port;
  if (!port_text.empty() && (!absl::SimpleAtoi(port_text, &port) || port < 1 || port > 65535)) {
    return bad("the port must be a number in [1, 65535]");
  }
  endpoint->scheme = scheme;
  endpoint->host = host;
  endpoint->port = port;
  return absl::OkStatus();
}

absl::StatusOr<DaemonEndpoint> EndpointFromArgs(const Args& args, bool admin) {
  DaemonEndpoint e;
  if (const char* env = std::getenv("THERMOCLINE_HOST"); env != nullptr && *env != '\0') {
    if (absl::Status s = ParseHostPort(env, "THERMOCLINE_HOST", &e); !s.ok()) return s;
  }
  if (const char* key = std::getenv("THERMOCLINE_API_KEY"); key != nullptr) e.api_key = key;
  if (const char* key = std::getenv("THERMOCLINE_ADMIN_KEY"); admin && key != nullptr && *key) {
    e.api_key = key;
  }
  if (auto url = args.Get("--url")) {
    if (args.Has("--host") || args.Has("--port")) {
      return absl::InvalidArgumentError("give either --url or --host/--port, not both");
    }
    if (url->find("://") == std::string::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("--url '", *url, "' needs a scheme, e.g. http://127.0.0.1:8080"));
    }
    if (absl::Status s = ParseHostPort(*url, "--url", &e); !s.ok()) return s;
  }
  if (auto host = args.Get("--host")) {
    if (host->empty()) return absl::InvalidArgumentError("--host must not be empty");
    e.host = *host;
    if (absl::StartsWith(e.host, "[") && absl::EndsWith(e.host, "]")) {
      e.host = e.host.substr(1, e.host.size() - 2);
    }
  }
  if (args.Has("--port")) {
    auto port = args.GetInt("--port", e.port);
    if (!port.ok()) return port.status();
    if (*port < 1 || *port > 65535) {
      return absl::InvalidArgumentError(absl::StrCat("--port ", *port, " is not in [1, 65535]"));
    }
    e.port = static_cast<int>(*port);
  }
  if (auto key = args.Get("--api-key")) e.api_key = *key;
  return e;
}

DaemonClient::DaemonClient(DaemonEndpoint endpoint)
    : endpoint_(std::move(endpoint)), http_(std::make_unique<httplib::Client>(endpoint_.Url())) {
  http_->set_connection_timeout(5, 0);
  http_->set_write_timeout(30, 0);
  if (!endpoint_.api_key.empty()) {
    http_->set_default_headers({{"Authorization", "Bearer " + endpoint_.api_key}});
  }
}

DaemonClient::~DaemonClient() = default;

absl::Status DaemonClient::Unreachable() const {
  return absl::UnavailableError(absl::StrCat("cannot reach the daemon at ", endpoint_.Url(),
                                             " (is `thermocline serve` running?)"));
}

absl::StatusOr<nlohmann::json> DaemonClient::Call(const std::string& method,
                                                  const std::string& path,
                                                  const nlohmann::json& body) {
  httplib::Request req;
  req.method = method;
  req.path = path;
  if (!body.is_null()) {
    req.body = body.dump();
    req.set_header("Content-Type", "application/json");
  }
  http_->set_read_timeout(kCallTimeoutS, 0);
  httplib::Response res;
  httplib::Error error = httplib::Error::Success;
  if (!http_->send(req, res, error)) {
    if (error == httplib::Error::Connection || error == httplib::Error::ConnectionTimeout) {
      return Unreachable();
    }
    return absl::UnavailableError(
        absl::StrCat(method, " ", endpoint_.Url(), path, " failed: ", httplib::to_string(error)));
  }
  if (res.status < 200 || res.status >= 300) return HttpError(res.status, res.body);
  if (res.body.empty()) return nlohmann::json(nullptr);
  nlohmann::json j = nlohmann::json::parse(res.body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    return absl::InternalError(
        absl::StrCat("the daemon answered ", method, " ", path,
                     " with something that is not JSON: ", res.body.substr(0, 200)));
  }
  return j;
}

absl::Status DaemonClient::Stream(const std::string& method, const std::string& path,
                                  const nlohmann::json& body,
                                  const std::function<bool(const std::string& data)>& on_data) {
  httplib::Request req;
  req.method = method;
  req.path = path;
  req.set_header("Accept", "text/event-stream");
  if (!body.is_null()) {
    req.body = body.dump();
    req.set_header("Content-Type", "application/json");
  }
  int status = 0;
  bool stopped = false;
  std::string pending;     // bytes of an event not yet complete
  std::string error_body;  // the body of a non-2xx reply
  req.response_handler = [&](const httplib::Response& r) {
    status = r.status;
    return true;
  };
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    if (status < 200 || status >= 300) {
      error_body.append(data,
                        std::min(n, kMaxErrorBody - std::min(kMaxErrorBody, error_body.size())));
      return true;
    }
    for (size_t i = 0; i < n; ++i) {
      if (data[i] != '\r') pending.push_back(data[i]);
    }
    size_t end;
    while ((end = pending.find("\n\n")) != std::string::npos) {
      std::string event_data;
      bool has_data = false;
      size_t pos = 0;
      while (pos < end) {
        size_t eol = pending.find('\n', pos);
        if (eol == std::string::npos || eol > end) eol = end;
        const std::string_view line(pending.data() + pos, eol - pos);
        if (line.substr(0, 5) == "data:") {
          std::string_view value = line.substr(5);
          if (!value.empty() && value[0] == ' ') value.remove_prefix(1);
          if (has_data) event_data += '\n';
          event_data.append(value);
          has_data = true;
        }
        pos = eol + 1;
      }
      pending.erase(0, end + 2);
      if (has_data && !on_data(event_data)) {
        stopped = true;
        return false;
      }
    }
    return true;
  };
  http_->set_read_timeout(kStreamTimeoutS, 0);
  httplib::Response res;
  httplib::Error error = httplib::Error::Success;
  const bool ok = http_->send(req, res, error);
  if (stopped) return absl::OkStatus();
  if (!ok) {
    if (error == httplib::Error::Connection || error == httplib::Error::ConnectionTimeout) {
      return Unreachable();
    }
    return absl::UnavailableError(absl::StrCat("the stream from the daemon at ", endpoint_.Url(),
                                               " broke off: ", httplib::to_string(error)));
  }
  if (status < 200 || status >= 300) return HttpError(status, error_body);
  return absl::OkStatus();
}

std::string PathSegment(const std::string& name) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : name) {
    if (absl::ascii_isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out.push_back(static_cast<char>(c));
    } else {
      out += '%';
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  return out;
}

absl::Status HttpError(int status, const std::string& body) {
  const nlohmann::json j = nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (!j.is_discarded() && j.is_object() && j.contains("error")) {
    const nlohmann::json& e = j["error"];
    if (e.is_object() && e.contains("message") && e["message"].is_string()) {
      return StatusForHttp(status, e["message"].get<std::string>());
    }
    if (e.is_string()) return StatusForHttp(status, e.get<std::string>());
  }
  return StatusForHttp(status, absl::StrCat("the daemon answered HTTP ", status,
                                            body.empty() ? "" : ": ", body.substr(0, 300)));
}

int ClientFail(const absl::Status& status) {
  std::fprintf(stderr, "thermocline: %s\n", std::string(status.message()).c_str());
  return 1;
}

}  // namespace thermocline::cli
