#include "server/http_stream.h"

#include <poll.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>

namespace thermocline::server {
namespace {

thread_local ServedConnection* current_connection = nullptr;

// How often a half-closed client is probed while a handler asks whether it is gone.
constexpr auto kProbeInterval = std::chrono::milliseconds(200);

}  // namespace

ServedConnection* ServedConnection::Current() { return current_connection; }

const char* HttpReason(int status) {
  switch (status) {
    case 100:
      return "Continue";
    case 102:
      return "Processing";
    case 200:
      return "OK";
    case 201:
      return "Created";
    case 204:
      return "No Content";
    case 400:
      return "Bad Request";
    case 401:
      return "Unauthorized";
    case 403:
      return "Forbidden";
    case 404:
      return "Not Found";
    case 408:
      return "Request Timeout";
    case 409:
      return "Conflict";
    case 411:
      return "Length Required";
    case 413:
      return "Payload Too Large";
    case 414:
      return "URI Too Long";
    case 415:
      return "Unsupported Media Type";
    case 417:
      return "Expectation Failed";
    case 429:
      return "Too Many Requests";
    case 431:
      return "Request Header Fields Too Large";
    case 500:
      return "Internal Server Error";
    case 501:
      return "Not Implemented";
    case 503:
      return "Service Unavailable";
    case 505:
      return "HTTP Version Not Supported";
    default:
      return status < 400 ? "OK" : status < 500 ? "Bad Request" : "Internal Server Error";
  }
}

ConnectionStream::ConnectionStream(ConnectionState* c, std::chrono::milliseconds write_timeout,
                                   std::function<void(ConnectionState*)> release_body)
    : c_(c), write_timeout_(write_timeout), release_body_(std::move(release_body)) {
  current_connection = this;
}

ConnectionStream::~ConnectionStream() { current_connection = nullptr; }

ssize_t ConnectionStream::read(char* ptr, size_t size) {
  const size_t n = std::min(size, c_->span - pos_);
  std::memcpy(ptr, c_->buffer.data() + pos_, n);
  pos_ += n;
  return static_cast<ssize_t>(n);
}

bool ConnectionStream::WaitWritable() const {
  pollfd p{c_->fd, POLLOUT, 0};
  const int n = ::poll(&p, 1, static_cast<int>(write_timeout_.count()));
  return n > 0 && (p.revents & POLLOUT) != 0 && (p.revents & (POLLERR | POLLHUP | POLLNVAL)) == 0;
}

bool ConnectionStream::is_writable() const { return !write_failed_ && WaitWritable(); }

ssize_t ConnectionStream::write(const char* ptr, size_t size) {
  while (!write_failed_) {
    const ssize_t n = ::send(c_->fd, ptr, size, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n >= 0) return n;
    if (errno == EINTR) continue;
    if ((errno == EAGAIN || errno == EWOULDBLOCK) && WaitWritable()) continue;
    write_failed_ = true;
  }
  return -1;
}

void ConnectionStream::get_remote_ip_and_port(std::string& ip, int& port) const {
  ip = c_->remote_addr;
  port = c_->remote_port;
}

void ConnectionStream::get_local_ip_and_port(std::string& ip, int& port) const {
  ip = c_->local_addr;
  port = c_->local_port;
}

bool ConnectionStream::PeerGone() {
  if (gone_ || write_failed_) return true;
  pollfd p{c_->fd, POLLIN | POLLRDHUP, 0};
  if (::poll(&p, 1, 0) <= 0) return false;
  if ((p.revents & (POLLERR | POLLHUP | POLLNVAL)) != 0) return gone_ = true;
  if ((p.revents & POLLRDHUP) == 0) return false;  // bytes of a pipelined request
  // The client has sent its FIN: gone, or only done sending. A 1xx interim response is legal
  // before the final one (RFC 9110 section 15.2); to a client that has closed, the first probe
  // draws a reset and the next one fails. HTTP/1.0 knows no 1xx.
  if (c_->head.version == "HTTP/1.0") return gone_ = true;
  const auto now = std::chrono::steady_clock::now();
  if (now - last_probe_ < kProbeInterval) return false;
  last_probe_ = now;
  constexpr std::string_view k102 = "HTTP/1.1 102 Processing\r\n\r\n";
  const ssize_t n = ::send(c_->fd, k102.data(), k102.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) gone_ = true;
  return gone_;
}

}  // namespace thermocline::server
