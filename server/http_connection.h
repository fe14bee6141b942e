// The connection layer under cpp-httplib: every accepted socket goes to one event loop (epoll)
// that reads request heads and bodies without a thread per connection, with deadlines (header,
// body, idle) and bounds (head size and field count, body size, request bytes held at once,
// connections per client and in all). Only a complete request goes to a worker thread, which
// runs cpp-httplib's request processing over the buffered bytes, so a slow or silent client never
// holds a worker; /health and /metrics have workers of their own, so they are answered while
// every other worker is busy, and a few connections beyond the connection limits are kept for
// them alone. A keep-alive connection goes back to the loop between requests.
// cpp-httplib 0.11 stays the HTTP parser and router: it hands accepted sockets to its task queue
// and process_and_close_socket (virtual), both of which GuardedServer replaces.
#pragma once

#include <httplib.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "server/http_head.h"

namespace thermocline::server {

struct ConnectionLimits {
  HeadLimits head;
  uint64_t max_body_bytes = 4 << 20;                // Content-Length, or the data of a chunked body
  std::chrono::milliseconds header_timeout{10000};  // first byte of a head to its end
  std::chrono::milliseconds body_timeout{60000};    // end of the head to the end of the body
  std::chrono::milliseconds read_timeout{30000};    // longest pause between bytes of a request
  std::chrono::milliseconds idle_timeout{5000};     // keep-alive: between requests
  std::chrono::milliseconds write_timeout{30000};   // longest a response write may block
  int workers = 16;                                 // threads serving requests
  int priority_workers = 2;                         // threads serving only /health and /metrics
  int max_connections = 1024;                       // open at once, idle ones included
  int max_connections_per_client = 0;               // per remote address; 0: no limit
  uint64_t max_inflight_bytes = 64 << 20;           // request bodies held at once
  int backlog = 1024;                               // listen(2) backlog
  int max_requests_per_connection = 1000;
};

// What the front end decides from a request's head alone, before the body is read.
struct HeadVerdict {
  bool refuse = false;    // its handler will refuse it (key, host, origin): do not read a body
  bool priority = false;  // served by the priority workers (/health, /metrics)
};
using HeadPolicy = std::function<HeadVerdict(const RequestHead&)>;

// A response the connection layer wrote itself: the request never reached a handler.
struct Refusal {
  std::string remote_addr;
  std::string method;  // "" when no request line was read
  std::string path;
  int status = 0;
  std::string code;
};
using RefusalListener = std::function<void(const Refusal&)>;

// The connection of the request the calling thread serves, for handlers.
class ServedConnection {
 public:
  // The ServedConnection of the calling worker thread; null outside a request.
  static ServedConnection* Current();

  // True once the client has gone. A client that only half-closed its side (shutdown(SHUT_WR))
  // still gets its response: after its FIN the connection is probed with an interim
  // `102 Processing` response, which fails once the client has really closed.
  virtual bool PeerGone() = 0;
  // Whether cpp-httplib has read the whole request body.
  virtual bool BodyRead() const = 0;

 protected:
  ~ServedConnection() = default;
};

class GuardedServer : public httplib::Server {
 public:
  // `policy` and `refused` run on the event loop's thread; both must be cheap and thread-safe.
  GuardedServer(ConnectionLimits limits, HeadPolicy policy, RefusalListener refused);
  ~GuardedServer() override;

  // After bind_to_port / bind_to_any_port: listens with limits.backlog (cpp-httplib uses 5).
  bool ApplyBacklog();
  // set_post_routing_handler, plus what the connection layer adds to every response before it
  // goes out: `Connection: close` when the request's body was not read (the connection cannot
  // be reused), and the end of the request's claim on max_inflight_bytes.
  void SetPostRoutingHandler(Handler handler);

  // Connections open now (idle, reading, served), for tests and metrics.
  int open_connections() const;

 private:
  bool process_and_close_socket(socket_t sock) override;

  class Front;
  std::unique_ptr<Front> front_;
  ConnectionLimits limits_;
};

}  // namespace thermocline::server
