// The HTTP client the daemon's client verbs (`models ...`, `run`) share: where the daemon is
// (--url / --host / --port / THERMOCLINE_HOST, --api-key / THERMOCLINE_API_KEY), JSON requests
// whose errors carry the server's message, and server-sent-event streams read event by event.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <set>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "tools/args.h"

namespace httplib {
class Client;
}

namespace thermocline::cli {

// The value flags every client verb accepts (add them to Args::Parse's value flags).
inline const std::set<std::string> kDaemonFlags = {"--url", "--host", "--port", "--api-key"};
constexpr char kDaemonUsage[] =
    "  --url URL                the daemon, http://HOST:PORT (overrides --host/--port)\n"
    "  --host HOST              the daemon's host (default: THERMOCLINE_HOST, else 127.0.0.1)\n"
    "  --port N                 the daemon's port (default: THERMOCLINE_HOST's, else 8080)\n"
    "  --api-key KEY            the daemon's API key (default: THERMOCLINE_API_KEY; for\n"
    "                           `models`, THERMOCLINE_ADMIN_KEY first)\n";

struct DaemonEndpoint {
  std::string scheme = "http";
  std::string host = "127.0.0.1";
  int port = 8080;
  std::string api_key;
  std::string Url() const;  // "http://127.0.0.1:8080" (IPv6 hosts in brackets)
};

// Parses "HOST", "HOST:PORT", "[V6]:PORT", "http://HOST:PORT" into `endpoint` (a missing port
// keeps endpoint->port). `what` names the source in the error ("--url", "THERMOCLINE_HOST").
absl::Status ParseHostPort(const std::string& text, const std::string& what,
                           DaemonEndpoint* endpoint);

// Defaults, then THERMOCLINE_HOST / THERMOCLINE_API_KEY, then the flags. For the admin verbs
// (`admin`), THERMOCLINE_ADMIN_KEY wins over THERMOCLINE_API_KEY.
absl::StatusOr<DaemonEndpoint> EndpointFromArgs(const Args& args, bool admin = false);

// An HTTP error answered by the daemon: the canonical code follows the HTTP status (404
// NotFound, 409 AlreadyExists, 401 Unauthenticated, ...), the message is the server's
// error.message. A daemon that cannot be reached is Unavailable with a message saying so.
class DaemonClient {
 public:
  explicit DaemonClient(DaemonEndpoint endpoint);
  ~DaemonClient();
  DaemonClient(const DaemonClient&) = delete;
  DaemonClient& operator=(const DaemonClient&) = delete;

  const DaemonEndpoint& endpoint() const { return endpoint_; }

  // One request; a JSON body when `body` is not null. The parsed JSON answer of a 2xx reply.
  absl::StatusOr<nlohmann::json> Call(const std::string& method, const std::string& path,
                                      const nlohmann::json& body = nullptr);

  // A request answered with server-sent events: `on_data` gets each event's data (without the
  // "data: " prefix) as soon as it arrives and returns false to stop reading. OK when the
  // stream ended or on_data stopped it.
  absl::Status Stream(const std::string& method, const std::string& path,
                      const nlohmann::json& body,
                      const std::function<bool(const std::string& data)>& on_data);

 private:
  absl::Status Unreachable() const;

  DaemonEndpoint endpoint_;
  std::unique_ptr<httplib::Client> http_;
};

// A name as one URL path segment (percent-encoded).
std::string PathSegment(const std::string& name);

// The error of an HTTP reply: the server's error.message when the body has one, else the
// status and body; the code follows the status.
absl::Status HttpError(int status, const std::string& body);

// Prints "thermocline: <message>" to stderr and returns 1.
int ClientFail(const absl::Status& status);

}  // namespace thermocline::cli
