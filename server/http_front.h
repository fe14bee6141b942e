// The connection layer's machinery behind GuardedServer (server/http_connection.h), shared by
// its two files: the event loop that reads requests (http_event_loop.cc) and the worker pools,
// accounting and cpp-httplib glue (http_connection.cc). Internal to them.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <vector>

#include "server/http_connection.h"
#include "server/http_stream.h"

namespace thermocline::server {
namespace connection_internal {

using Clock = std::chrono::steady_clock;

// After a refusal or a response that ends the connection: the client's unread bytes are drained
// for this long (or this many) before the socket closes, so that closing does not reset the
// connection before the client has read the response.
inline constexpr auto kLinger = std::chrono::seconds(2);
inline constexpr size_t kLingerBytes = 1 << 20;
inline constexpr size_t kReadChunk = 16 << 10;
// Beyond the connection limits a few connections more are kept for /health and /metrics only,
// with a short head deadline: a probe from the address of a client that holds all its
// connections (or when the server holds all it may) is still answered.
inline constexpr int kProbeOnlyConnections = 16;
inline constexpr auto kProbeOnlyHeaderTimeout = std::chrono::seconds(2);

// Whether the bytes of a probe-only connection can still become a /health or /metrics request.
bool CouldBeProbe(std::string_view bytes);
// A canned response of the connection layer: the API's JSON error body; the connection ends.
std::string CannedResponse(int status, const std::string& code, const std::string& message);

}  // namespace connection_internal

// The event loop, the worker pools and the connection accounting.
class GuardedServer::Front {
 public:
  using Clock = connection_internal::Clock;

  Front(GuardedServer* server, const ConnectionLimits& limits, HeadPolicy policy,
        RefusalListener refused);
  ~Front() { Shutdown(); }

  void Adopt(int fd);  // from the accept thread
  void Shutdown();     // closes what waits, serves what was dispatched, joins; idempotent
  int open() {
    std::lock_guard<std::mutex> lock(mu_);
    return open_;
  }
  void ReleaseBody(ConnectionState* c) {
    inflight_ -= c->reserved;
    c->reserved = 0;
  }
  uint64_t inflight() const { return inflight_.load(); }

 private:
  struct Pool {
    std::mutex mu;
    std::condition_variable cv;
    std::deque<std::unique_ptr<ConnectionState>> queue;
    std::vector<std::thread> threads;
    bool stop = false;
  };

  void LoopMain();
  void Register(std::unique_ptr<ConnectionState> c);
  // Reads what the socket has (up to what the current phase may buffer).
  void Read(ConnectionState* c);
  // Moves a connection through its phases; may dispatch, refuse or close it.
  void Advance(int fd);
  void Dispatch(int fd);
  void Refuse(ConnectionState* c, int status, const std::string& code, const std::string& message);
  void StartLinger(ConnectionState* c);
  void Drop(int fd);  // closes and forgets
  void Expire(Clock::time_point now);
  bool Reserve(ConnectionState* c, uint64_t bytes);
  void Forget(ConnectionState* c);  // leaves the per-client and total counts
  void WorkerMain(Pool* pool);
  void Serve(std::unique_ptr<ConnectionState> c);
  void HandBack(std::unique_ptr<ConnectionState> c);
  void Wake() {
    const uint64_t one = 1;
    [[maybe_unused]] ssize_t n = ::write(wake_fd_, &one, sizeof(one));
  }

  GuardedServer* const server_;
  const ConnectionLimits limits_;
  const HeadPolicy policy_;
  const RefusalListener refused_;
  int epoll_fd_ = -1;
  int wake_fd_ = -1;
  std::thread loop_;
  Pool regular_, priority_;
  std::unordered_map<int, std::unique_ptr<ConnectionState>> conns_;  // the loop's own

  std::mutex mu_;  // incoming_, per_client_, open_, stopping_
  std::vector<std::unique_ptr<ConnectionState>> incoming_;
  std::unordered_map<std::string, int> per_client_;
  int open_ = 0;
  int probe_only_ = 0;  // connections beyond the limits, for /health and /metrics
  bool stopping_ = false;
  bool shut_down_ = false;
  std::atomic<uint64_t> inflight_{0};
};

}  // namespace thermocline::server
