// A small blocking HTTP/1.1 client over a raw loopback socket, for driving the daemon exactly as
// a client would: it sees the bytes on the wire (status line, headers, chunked framing), can
// read a streamed body chunk by chunk, and can vanish mid-stream by closing its socket.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cctype>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

namespace thermocline::testing {

struct HttpResponse {
  int status = 0;
  std::map<std::string, std::string> headers;  // names lower-cased
  std::string body;                            // de-chunked
  std::vector<std::string> chunks;             // the chunks as sent, when chunked
  std::string header(const std::string& name) const {
    auto it = headers.find(name);
    return it == headers.end() ? "" : it->second;
  }
};

class HttpConnection {
 public:
  explicit HttpConnection(int port, int timeout_ms = 30000) : timeout_ms_(timeout_ms) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd_ < 0 || ::connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
      throw std::runtime_error("cannot connect to 127.0.0.1:" + std::to_string(port));
    }
  }
  ~HttpConnection() { Close(); }
  HttpConnection(const HttpConnection&) = delete;
  HttpConnection& operator=(const HttpConnection&) = delete;

  void Close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  // Half-closes: the server sees the end of the request stream, the answer can still come.
  void ShutdownWrite() { ::shutdown(fd_, SHUT_WR); }
  // True when the server has closed the connection (EOF) within `timeout_ms`.
  bool ClosedByServer(int timeout_ms) {
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, timeout_ms) <= 0) return false;
    char c;
    return ::recv(fd_, &c, 1, MSG_PEEK) == 0;
  }

  void Send(const std::string& method, const std::string& path, const std::string& body = "",
            const std::map<std::string, std::string>& headers = {}) {
    std::string req = method + " " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\n";
    for (const auto& [k, v] : headers) req += k + ": " + v + "\r\n";
    if (!body.empty() || method == "POST") {
      if (!headers.count("Content-Type")) req += "Content-Type: application/json\r\n";
      req += "Content-Length: " + std::to_string(body.size()) + "\r\n";
    }
    req += "\r\n" + body;
    SendRaw(req);
  }

  void SendRaw(const std::string& bytes) {
    size_t off = 0;
    while (off < bytes.size()) {
      const ssize_t n = ::send(fd_, bytes.data() + off, bytes.size() - off, MSG_NOSIGNAL);
      if (n <= 0) throw std::runtime_error("send failed");
      off += static_cast<size_t>(n);
    }
  }

  // Status line and headers.
  HttpResponse ReadHead() {
    HttpResponse r;
    std::string line = ReadLine();
    if (line.rfind("HTTP/1.1 ", 0) != 0) throw std::runtime_error("bad status line: " + line);
    r.status = std::stoi(line.substr(9, 3));
    while (!(line = ReadLine()).empty()) {
      const size_t colon = line.find(':');
      if (colon == std::string::npos) throw std::runtime_error("bad header: " + line);
      std::string name = line.substr(0, colon);
      for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      size_t v = colon + 1;
      while (v < line.size() && line[v] == ' ') ++v;
      r.headers[name] = line.substr(v);
    }
    return r;
  }

  // The next chunk of a chunked body; false at the final zero-size chunk. Strict framing.
  bool ReadChunk(std::string* data) {
    const std::string size_line = ReadLine();
    size_t pos = 0;
    const unsigned long size = std::stoul(size_line, &pos, 16);
    if (pos != size_line.size()) throw std::runtime_error("bad chunk size line: " + size_line);
    *data = ReadExactly(size);
    if (ReadLine() != "") throw std::runtime_error("chunk not followed by CRLF");
    return size > 0;
  }

  // A whole response: head, then the body by Content-Length or chunks; interim 1xx responses
  // before it are skipped.
  HttpResponse ReadResponse() {
    HttpResponse r = ReadHead();
    while (r.status >= 100 && r.status < 200) r = ReadHead();
    if (r.header("transfer-encoding") == "chunked") {
      std::string chunk;
      while (ReadChunk(&chunk)) {
        r.body += chunk;
        r.chunks.push_back(chunk);
      }
    } else if (!r.header("content-length").empty()) {
      r.body = ReadExactly(std::stoul(r.header("content-length")));
    }
    return r;
  }

 private:
  void Fill() {
    pollfd p{fd_, POLLIN, 0};
    if (::poll(&p, 1, timeout_ms_) <= 0) throw std::runtime_error("timed out reading");
    char buf[16384];
    const ssize_t n = ::recv(fd_, buf, sizeof(buf), 0);
    if (n <= 0) throw std::runtime_error("connection closed by the server");
    in_.append(buf, static_cast<size_t>(n));
  }
  std::string ReadLine() {
    size_t eol;
    while ((eol = in_.find("\r\n")) == std::string::npos) Fill();
    std::string line = in_.substr(0, eol);
    in_.erase(0, eol + 2);
    return line;
  }
  std::string ReadExactly(size_t n) {
    while (in_.size() < n) Fill();
    std::string out = in_.substr(0, n);
    in_.erase(0, n);
    return out;
  }

  int fd_ = -1;
  int timeout_ms_;
  std::string in_;
};

// One request on a fresh connection.
inline HttpResponse Http(int port, const std::string& method, const std::string& path,
                         const std::string& body = "",
                         const std::map<std::string, std::string>& headers = {}) {
  HttpConnection c(port);
  auto h = headers;
  h["Connection"] = "close";
  c.Send(method, path, body, h);
  return c.ReadResponse();
}

}  // namespace thermocline::testing
