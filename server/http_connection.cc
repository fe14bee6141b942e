#include "server/http_connection.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/errors.h"
#include "server/http_stream.h"
#include "spdlog/spdlog.h"

namespace thermocline::server {
namespace {

using Clock = std::chrono::steady_clock;

// After a refusal or a response that ends the connection: the client's unread bytes are drained
// for this long (or this many) before the socket closes, so that closing does not reset the
// connection before the client has read the response.
constexpr auto kLinger = std::chrono::seconds(2);
constexpr size_t kLingerBytes = 1 << 20;
constexpr size_t kReadChunk = 16 << 10;
// Beyond the connection limits a few connections more are kept for /health and /metrics only,
// with a short head deadline: a probe from the address of a client that holds all its
// connections (or when the server holds all it may) is still answered.
constexpr int kProbeOnlyConnections = 16;
constexpr auto kProbeOnlyHeaderTimeout = std::chrono::seconds(2);

// Whether the bytes of a probe-only connection can still become a /health or /metrics request.
bool CouldBeProbe(std::string_view bytes) {
  for (std::string_view probe : {"GET /health", "GET /metrics", "HEAD /health", "HEAD /metrics"}) {
    const size_t n = std::min(bytes.size(), probe.size());
    if (bytes.substr(0, n) != probe.substr(0, n)) continue;
    if (bytes.size() <= probe.size()) return true;
    const char next = bytes[probe.size()];
    if (next == ' ' || next == '?') return true;
  }
  return false;
}

std::string AddressText(const sockaddr_storage& a, int* port) {
  char text[INET6_ADDRSTRLEN] = "";
  if (a.ss_family == AF_INET) {
    const auto* v4 = reinterpret_cast<const sockaddr_in*>(&a);
    ::inet_ntop(AF_INET, &v4->sin_addr, text, sizeof(text));
    *port = ntohs(v4->sin_port);
  } else if (a.ss_family == AF_INET6) {
    const auto* v6 = reinterpret_cast<const sockaddr_in6*>(&a);
    ::inet_ntop(AF_INET6, &v6->sin6_addr, text, sizeof(text));
    *port = ntohs(v6->sin6_port);
  }
  return text;
}

// A canned response of the connection layer: the API's JSON error body, then the connection ends.
std::string CannedResponse(int status, const std::string& code, const std::string& message) {
  ApiError e;
  e.http_status = status;
  e.type = status >= 500 ? (status == 503 ? "unavailable_error" : "server_error")
                         : "invalid_request_error";
  e.code = code;
  e.message = message;
  const std::string body = ApiErrorJson(e);
  return absl::StrCat("HTTP/1.1 ", status, " ", HttpReason(status),
                      "\r\nContent-Type: application/json\r\nContent-Length: ", body.size(),
                      status == 503 ? "\r\nRetry-After: 1" : "", "\r\nConnection: close\r\n\r\n",
                      body);
}

}  // namespace

// The event loop, the worker pools and the connection accounting.
class GuardedServer::Front {
 public:
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

GuardedServer::Front::Front(GuardedServer* server, const ConnectionLimits& limits,
                            HeadPolicy policy, RefusalListener refused)
    : server_(server), limits_(limits), policy_(std::move(policy)), refused_(std::move(refused)) {
  epoll_fd_ = ::epoll_create1(EPOLL_CLOEXEC);
  wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = wake_fd_;
  ::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, wake_fd_, &ev);
  loop_ = std::thread([this] { LoopMain(); });
  for (int i = 0; i < limits_.workers; ++i) {
    regular_.threads.emplace_back([this] { WorkerMain(&regular_); });
  }
  for (int i = 0; i < limits_.priority_workers; ++i) {
    priority_.threads.emplace_back([this] { WorkerMain(&priority_); });
  }
}

void GuardedServer::Front::Adopt(int fd) {
  auto c = std::make_unique<ConnectionState>();
  c->fd = fd;
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    c->remote_addr = AddressText(addr, &c->remote_port);
  }
  len = sizeof(addr);
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    c->local_addr = AddressText(addr, &c->local_port);
  }
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
  const auto now = Clock::now();
  c->deadline = now + limits_.header_timeout;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) {
      ::close(fd);
      return;
    }
    int& mine = per_client_[c->remote_addr];
    std::string over;
    if (open_ >= limits_.max_connections) {
      over = absl::StrCat("the server has ", open_,
                          " connections open, its limit (server.max_connections)");
    } else if (limits_.max_connections_per_client > 0 &&
               mine >= limits_.max_connections_per_client) {
      over = absl::StrCat("this client has ", mine,
                          " connections open, the limit per client "
                          "(server.max_connections_per_client); reuse connections");
    }
    if (over.empty()) {
      ++mine;
      ++open_;
      c->counted = true;
    } else if (probe_only_ < kProbeOnlyConnections) {
      ++probe_only_;
      c->probe_only = true;
      c->refuse_message = std::move(over);
      c->deadline = now + kProbeOnlyHeaderTimeout;
    } else {
      c->refuse_status = 503;
      c->refuse_message = std::move(over);
    }
    if (mine == 0) per_client_.erase(c->remote_addr);
    incoming_.push_back(std::move(c));
  }
  Wake();
}

void GuardedServer::Front::Shutdown() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (shut_down_) return;
    shut_down_ = stopping_ = true;
  }
  Wake();
  if (loop_.joinable()) loop_.join();
  for (Pool* p : {&regular_, &priority_}) {
    {
      std::lock_guard<std::mutex> lock(p->mu);
      p->stop = true;
    }
    p->cv.notify_all();
    for (std::thread& t : p->threads) t.join();
  }
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& c : incoming_) ::close(c->fd);
  incoming_.clear();
  ::close(epoll_fd_);
  ::close(wake_fd_);
}

void GuardedServer::Front::Register(std::unique_ptr<ConnectionState> c) {
  const int fd = c->fd;
  epoll_event ev{};
  ev.events = EPOLLIN | EPOLLRDHUP;
  ev.data.fd = fd;
  ::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev);
  ConnectionState* raw = c.get();
  conns_[fd] = std::move(c);
  if (raw->refuse_status != 0) {
    Refuse(raw, raw->refuse_status, "too_many_connections", raw->refuse_message);
  } else if (raw->phase == ConnectionState::Phase::kLinger) {
    raw->deadline = Clock::now() + kLinger;
  } else if (!raw->buffer.empty()) {
    Advance(fd);  // a pipelined request is already here
  }
}

void GuardedServer::Front::LoopMain() {
  std::vector<epoll_event> events(256);
  auto next_expiry = Clock::now();
  while (true) {
    const int n = ::epoll_wait(epoll_fd_, events.data(), static_cast<int>(events.size()), 50);
    std::vector<std::unique_ptr<ConnectionState>> incoming;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_) break;
      incoming.swap(incoming_);
    }
    for (auto& c : incoming) Register(std::move(c));
    for (int i = 0; i < n; ++i) {
      const int fd = events[i].data.fd;
      if (fd == wake_fd_) {
        uint64_t v;
        [[maybe_unused]] ssize_t r = ::read(wake_fd_, &v, sizeof(v));
        continue;
      }
      auto it = conns_.find(fd);
      if (it == conns_.end()) continue;
      Read(it->second.get());
      Advance(fd);
    }
    const auto now = Clock::now();
    if (now >= next_expiry) {
      Expire(now);
      next_expiry = now + std::chrono::milliseconds(50);
    }
  }
  for (auto& [fd, c] : conns_) {
    inflight_ -= c->reserved;
    Forget(c.get());
    ::close(fd);
  }
  conns_.clear();
}

void GuardedServer::Front::Read(ConnectionState* c) {
  using Phase = ConnectionState::Phase;
  char buf[kReadChunk];
  while (true) {
    size_t want = kReadChunk;
    if (c->phase == Phase::kIdle || c->phase == Phase::kHead) {
      const size_t cap = limits_.head.max_bytes + 8;
      if (c->buffer.size() > cap) return;
      want = std::min(want, cap + 1 - c->buffer.size());
    } else if (c->phase == Phase::kBody && c->head.framing == BodyFraming::kLength) {
      if (c->buffer.size() >= c->span) return;
      want = std::min<size_t>(want, c->span - c->buffer.size());
    }
    const ssize_t got = ::recv(c->fd, buf, want, MSG_DONTWAIT);
    if (got > 0) {
      c->last_byte = Clock::now();
      if (c->phase == Phase::kLinger) {
        c->lingered += static_cast<size_t>(got);
        if (c->lingered > kLingerBytes) return;
        continue;
      }
      c->buffer.append(buf, static_cast<size_t>(got));
      if (c->phase == Phase::kBody && c->head.framing == BodyFraming::kChunked) return;
      continue;
    }
    if (got == 0) c->peer_eof = true;
    if (got < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) c->peer_eof = true;
    return;
  }
}

void GuardedServer::Front::Advance(int fd) {
  using Phase = ConnectionState::Phase;
  ConnectionState* c = conns_.at(fd).get();
  while (true) {
    switch (c->phase) {
      case Phase::kLinger:
        if (c->peer_eof || c->lingered > kLingerBytes) return Drop(fd);
        return;
      case Phase::kIdle:
        if (c->buffer.empty()) {
          if (c->peer_eof) return Drop(fd);
          return;
        }
        c->phase = Phase::kHead;
        c->started = Clock::now();
        break;
      case Phase::kHead: {
        if (c->probe_only && !CouldBeProbe(c->buffer)) {
          return Refuse(c, 503, "too_many_connections", c->refuse_message);
        }
        HeadError error;
        const HeadParse r = ParseRequestHead(c->buffer, limits_.head, &c->head, &error);
        if (r == HeadParse::kIncomplete) {
          if (c->peer_eof) return Drop(fd);
          return;
        }
        if (r == HeadParse::kError) return Refuse(c, error.status, error.code, error.message);
        c->verdict = policy_(c->head);
        if (c->probe_only && !c->verdict.priority) {
          return Refuse(c, 503, "too_many_connections", c->refuse_message);
        }
        c->must_close |= c->probe_only;
        c->span = c->head.head_bytes;
        c->fed = c->head.head_bytes;
        if (c->verdict.refuse || c->head.framing == BodyFraming::kNone) {
          c->must_close |= c->verdict.refuse && c->head.framing != BodyFraming::kNone;
          return Dispatch(fd);
        }
        if (c->head.framing == BodyFraming::kLength) {
          if (c->head.content_length > limits_.max_body_bytes) {
            return Refuse(c, 413, "payload_too_large",
                          absl::StrCat("the request body is larger than ",
                                       limits_.max_body_bytes, " bytes"));
          }
          if (!Reserve(c, c->head.content_length)) return;
          c->span += c->head.content_length;
        } else {
          c->chunked.emplace(limits_.max_body_bytes);
        }
        if (c->head.expect_continue) {
          constexpr std::string_view k100 = "HTTP/1.1 100 Continue\r\n\r\n";
          [[maybe_unused]] ssize_t n =
              ::send(c->fd, k100.data(), k100.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
        }
        c->phase = Phase::kBody;
        c->started = Clock::now();
        Read(c);  // the body may be here already
        break;
      }
      case Phase::kBody: {
        if (c->head.framing == BodyFraming::kLength) {
          if (c->buffer.size() >= c->span) return Dispatch(fd);
          if (c->peer_eof) return Drop(fd);
          return;
        }
        size_t used = 0;
        const auto r = c->chunked->Feed(std::string_view(c->buffer).substr(c->fed), &used);
        c->fed += used;
        if (r == ChunkedBody::Result::kError) {
          const HeadError& e = c->chunked->error();
          return Refuse(c, e.status, e.code, e.message);
        }
        if (!Reserve(c, c->fed - c->head.head_bytes)) return;
        if (r == ChunkedBody::Result::kComplete) {
          c->span = c->fed;
          return Dispatch(fd);
        }
        if (c->peer_eof) return Drop(fd);
        return;
      }
    }
  }
}

bool GuardedServer::Front::Reserve(ConnectionState* c, uint64_t total) {
  if (total <= c->reserved) return true;
  const uint64_t more = total - c->reserved;
  if (inflight_.fetch_add(more) + more > limits_.max_inflight_bytes) {
    inflight_ -= more;
    Refuse(c, 503, "server_busy",
           absl::StrCat("the server holds ", limits_.max_inflight_bytes,
                        " bytes of request bodies (server.max_inflight_bytes); retry shortly"));
    return false;
  }
  c->reserved += more;
  return true;
}

void GuardedServer::Front::Dispatch(int fd) {
  auto it = conns_.find(fd);
  std::unique_ptr<ConnectionState> c = std::move(it->second);
  conns_.erase(it);
  ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd, nullptr);
  // cpp-httplib reads the rewritten head (server/http_head.h), then the body as it came.
  const std::string& head = c->head.normalized;
  c->buffer.replace(0, c->head.head_bytes, head);
  c->span = c->span - c->head.head_bytes + head.size();
  c->fed = c->fed - c->head.head_bytes + head.size();
  c->head.head_bytes = head.size();
  Pool* pool = c->verdict.priority ? &priority_ : &regular_;
  {
    std::lock_guard<std::mutex> lock(pool->mu);
    pool->queue.push_back(std::move(c));
  }
  pool->cv.notify_one();
}

void GuardedServer::Front::Refuse(ConnectionState* c, int status, const std::string& code,
                                  const std::string& message) {
  const std::string response = CannedResponse(status, code, message);
  [[maybe_unused]] ssize_t n =
      ::send(c->fd, response.data(), response.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  if (refused_) {
    Refusal r;
    r.remote_addr = c->remote_addr;
    if (c->phase == ConnectionState::Phase::kBody || !c->head.method.empty()) {
      r.method = c->head.method;
      r.path = c->head.path;
    }
    r.status = status;
    r.code = code;
    refused_(r);
  }
  StartLinger(c);
}

void GuardedServer::Front::StartLinger(ConnectionState* c) {
  inflight_ -= c->reserved;
  c->reserved = 0;
  c->buffer.clear();
  c->buffer.shrink_to_fit();
  c->chunked.reset();
  ::shutdown(c->fd, SHUT_WR);
  c->phase = ConnectionState::Phase::kLinger;
  c->deadline = Clock::now() + kLinger;
  Forget(c);
  if (c->peer_eof) Drop(c->fd);
}

void GuardedServer::Front::Drop(int fd) {
  auto it = conns_.find(fd);
  if (it == conns_.end()) return;
  inflight_ -= it->second->reserved;
  Forget(it->second.get());
  ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, fd, nullptr);
  ::close(fd);
  conns_.erase(it);
}

void GuardedServer::Front::Forget(ConnectionState* c) {
  if (c->probe_only) {
    c->probe_only = false;
    std::lock_guard<std::mutex> lock(mu_);
    --probe_only_;
    return;
  }
  if (!c->counted) return;
  c->counted = false;
  std::lock_guard<std::mutex> lock(mu_);
  --open_;
  auto it = per_client_.find(c->remote_addr);
  if (it != per_client_.end() && --it->second <= 0) per_client_.erase(it);
}

void GuardedServer::Front::Expire(Clock::time_point now) {
  using Phase = ConnectionState::Phase;
  std::vector<int> idle, slow, lingered;
  for (auto& [fd, c] : conns_) {
    switch (c->phase) {
      case Phase::kIdle:
        if (now >= c->deadline) idle.push_back(fd);
        break;
      case Phase::kHead:
        if (now >= c->started + (c->probe_only ? kProbeOnlyHeaderTimeout : limits_.header_timeout) ||
            now >= c->last_byte + limits_.read_timeout) {
          slow.push_back(fd);
        }
        break;
      case Phase::kBody:
        if (now >= c->started + limits_.body_timeout ||
            now >= c->last_byte + limits_.read_timeout) {
          slow.push_back(fd);
        }
        break;
      case Phase::kLinger:
        if (now >= c->deadline) lingered.push_back(fd);
        break;
    }
  }
  for (int fd : idle) Drop(fd);
  for (int fd : lingered) Drop(fd);
  for (int fd : slow) {
    ConnectionState* c = conns_.at(fd).get();
    const bool head = c->phase == Phase::kHead;
    Refuse(c, 408, "request_timeout",
           head ? absl::StrCat("the request head did not arrive within ",
                               limits_.header_timeout.count() / 1000.0, " s")
                : absl::StrCat("the request body did not arrive within ",
                               limits_.body_timeout.count() / 1000.0, " s"));
  }
}

void GuardedServer::Front::WorkerMain(Pool* pool) {
  while (true) {
    std::unique_ptr<ConnectionState> c;
    {
      std::unique_lock<std::mutex> lock(pool->mu);
      pool->cv.wait(lock, [&] { return pool->stop || !pool->queue.empty(); });
      if (pool->queue.empty()) return;  // stopping, and everything dispatched was served
      c = std::move(pool->queue.front());
      pool->queue.pop_front();
    }
    Serve(std::move(c));
  }
}

void GuardedServer::Front::Serve(std::unique_ptr<ConnectionState> c) {
  ++c->served;
  const bool close = c->must_close || c->peer_eof || c->head.close ||
                     c->served >= limits_.max_requests_per_connection;
  bool closed = false;
  bool ok = false;
  {
    ConnectionStream stream(c.get(), limits_.write_timeout,
                            [this](ConnectionState* s) { ReleaseBody(s); });
    ok = server_->process_request(stream, close, closed, nullptr);
    c->must_close |= !stream.BodyRead() || stream.write_failed();
  }
  ReleaseBody(c.get());
  const bool keep = ok && !close && !closed && !c->must_close;
  c->buffer.erase(0, c->span);
  c->head = RequestHead();
  c->chunked.reset();
  c->verdict = HeadVerdict();
  c->span = c->fed = 0;
  if (keep) {
    c->phase = ConnectionState::Phase::kIdle;
    c->deadline = Clock::now() + limits_.idle_timeout;
  } else {
    c->phase = ConnectionState::Phase::kLinger;
    c->buffer.clear();
    ::shutdown(c->fd, SHUT_WR);
    Forget(c.get());
  }
  HandBack(std::move(c));
}

void GuardedServer::Front::HandBack(std::unique_ptr<ConnectionState> c) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!stopping_) {
      incoming_.push_back(std::move(c));
    }
  }
  if (c != nullptr) {  // stopping: the loop is gone
    Forget(c.get());
    ::close(c->fd);
    return;
  }
  Wake();
}

namespace {

// cpp-httplib's listen loop hands every accepted socket to a task queue; this one passes it on
// at once to the event loop (through process_and_close_socket) and stops it with the server.
class AdoptingQueue final : public httplib::TaskQueue {
 public:
  explicit AdoptingQueue(std::function<void()> on_shutdown) : on_shutdown_(std::move(on_shutdown)) {}
  void enqueue(std::function<void()> fn) override { fn(); }
  void shutdown() override { on_shutdown_(); }

 private:
  std::function<void()> on_shutdown_;
};

}  // namespace

GuardedServer::GuardedServer(ConnectionLimits limits, HeadPolicy policy, RefusalListener refused)
    : limits_(limits) {
  front_ = std::make_unique<Front>(this, limits_, std::move(policy), std::move(refused));
  new_task_queue = [this] { return new AdoptingQueue([this] { front_->Shutdown(); }); };
  set_keep_alive_timeout(std::max<time_t>(1, limits_.idle_timeout.count() / 1000));
  set_keep_alive_max_count(static_cast<size_t>(limits_.max_requests_per_connection));
  set_payload_max_length(limits_.max_body_bytes);
}

GuardedServer::~GuardedServer() { front_->Shutdown(); }

bool GuardedServer::ApplyBacklog() {
  const socket_t sock = svr_sock_;
  return sock != INVALID_SOCKET && ::listen(sock, limits_.backlog) == 0;
}

bool GuardedServer::process_and_close_socket(socket_t sock) {
  front_->Adopt(sock);
  return true;
}

void GuardedServer::SetPostRoutingHandler(Handler handler) {
  set_post_routing_handler([this, handler](const httplib::Request& req, httplib::Response& res) {
    if (handler) handler(req, res);
    ServedConnection* c = ServedConnection::Current();
    if (c == nullptr) return;
    if (!c->BodyRead()) {
      res.headers.erase("Keep-Alive");
      res.set_header("Connection", "close");
    }
    static_cast<ConnectionStream*>(c)->ReleaseBody();
  });
}

int GuardedServer::open_connections() const { return front_->open(); }

}  // namespace thermocline::server
