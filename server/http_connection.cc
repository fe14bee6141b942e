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
#include "server/http_front.h"
#include "server/http_stream.h"
#include "spdlog/spdlog.h"

namespace thermocline::server {

using connection_internal::Clock;
using connection_internal::kProbeOnlyConnections;
using connection_internal::kProbeOnlyHeaderTimeout;

namespace {

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
}  // namespace

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
  explicit AdoptingQueue(std::function<void()> on_shutdown)
      : on_shutdown_(std::move(on_shutdown)) {}
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