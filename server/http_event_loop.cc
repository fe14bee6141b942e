// The connection layer's event loop (server/http_front.h): one thread, epoll, every connection
// that is idle, reading its request or lingering after its last response; deadlines, bounds,
// refusals; complete requests are dispatched to the worker pools.
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "server/errors.h"
#include "server/http_front.h"

namespace thermocline::server {

namespace connection_internal {

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

}  // namespace connection_internal

using connection_internal::CannedResponse;
using connection_internal::Clock;
using connection_internal::CouldBeProbe;
using connection_internal::kLinger;
using connection_internal::kLingerBytes;
using connection_internal::kProbeOnlyHeaderTimeout;
using connection_internal::kReadChunk;

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
            return Refuse(
                c, 413, "payload_too_large",
                absl::StrCat("the request body is larger than ", limits_.max_body_bytes, " bytes"));
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
        if (now >=
                c->started + (c->probe_only ? kProbeOnlyHeaderTimeout : limits_.header_timeout) ||
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

}  // namespace thermocline::server
