// One connection of the connection layer (server/http_connection.h) and the cpp-httplib Stream a
// worker serves a request through: reads come from the request's buffered bytes only (the event
// loop has read the whole request before a worker sees it, so a read never waits on the client),
// writes go to the socket with a deadline. It is also the ServedConnection that handlers see.
#pragma once

#include <httplib.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "server/http_connection.h"
#include "server/http_head.h"

namespace thermocline::server {

struct ConnectionState {
  enum class Phase {
    kIdle,   // waiting for the first byte of a request
    kHead,   // reading the request head
    kBody,   // reading the body the head announced
    kLinger  // the response is out and the write side shut: draining until the client closes
  };
  int fd = -1;
  std::string remote_addr, local_addr;
  int remote_port = 0, local_port = 0;
  bool counted = false;     // in the per-client and total counts
  bool probe_only = false;  // beyond the limits: served for /health and /metrics only
  int refuse_status = 0;    // refused on arrival (too many connections)
  std::string refuse_message;

  Phase phase = Phase::kIdle;
  std::chrono::steady_clock::time_point deadline;  // kIdle, kLinger
  std::chrono::steady_clock::time_point started;   // kHead, kBody
  std::chrono::steady_clock::time_point last_byte = std::chrono::steady_clock::now();
  std::string buffer;  // the request's bytes from its first, and any that follow
  RequestHead head;
  HeadVerdict verdict;
  std::optional<ChunkedBody> chunked;
  size_t span = 0;          // bytes of buffer that make the request (head + body)
  size_t fed = 0;           // bytes of buffer the chunked parser has seen
  uint64_t reserved = 0;    // bytes claimed of max_inflight_bytes
  size_t lingered = 0;      // bytes drained in kLinger
  bool peer_eof = false;    // the client has shut its write side (or is gone)
  bool must_close = false;  // the connection cannot carry another request
  int served = 0;           // requests answered on this connection
};

// The reason phrase of an HTTP status.
const char* HttpReason(int status);

class ConnectionStream final : public httplib::Stream, public ServedConnection {
 public:
  // `release_body` ends the request's claim on the in-flight byte budget (once).
  ConnectionStream(ConnectionState* c, std::chrono::milliseconds write_timeout,
                   std::function<void(ConnectionState*)> release_body);
  ~ConnectionStream() override;

  bool is_readable() const override { return pos_ < c_->span; }
  bool is_writable() const override;
  ssize_t read(char* ptr, size_t size) override;
  ssize_t write(const char* ptr, size_t size) override;
  void get_remote_ip_and_port(std::string& ip, int& port) const override;
  void get_local_ip_and_port(std::string& ip, int& port) const override;
  socket_t socket() const override { return c_->fd; }

  bool PeerGone() override;
  bool BodyRead() const override { return pos_ >= c_->span; }
  void ReleaseBody() { release_body_(c_); }
  bool write_failed() const { return write_failed_; }

 private:
  // Waits until the socket takes bytes; false on a deadline, an error or a hang-up.
  bool WaitWritable() const;

  ConnectionState* const c_;
  const std::chrono::milliseconds write_timeout_;
  std::function<void(ConnectionState*)> release_body_;
  size_t pos_ = 0;
  bool write_failed_ = false;
  bool gone_ = false;
  std::chrono::steady_clock::time_point last_probe_{};
};

}  // namespace thermocline::server
