// A request head as the connection layer reads it, before cpp-httplib does: one bounded parse of
// the request line and the header fields (total size, field count, target length), the body's
// framing (RFC 9112 section 6: Content-Length, chunked, none) with the ambiguous cases refused,
// and the head rewritten for cpp-httplib: duplicate Content-Length collapsed, `Content-Length: 0`
// added to a bodyless POST (which cpp-httplib would otherwise read until the client closes),
// Range and Expect removed (the daemon serves no byte ranges; the connection layer answers
// 100-continue itself). ChunkedBody follows a chunked body's framing as its bytes arrive, so the
// connection layer knows where the body ends and how much data it carries. Pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace thermocline::server {

struct HeadLimits {
  size_t max_bytes = 32 << 10;  // request line + fields + the blank line
  size_t max_fields = 100;
  size_t max_target = 8192;  // cpp-httplib's own limit on the request URI
};

enum class BodyFraming { kNone, kLength, kChunked };

struct RequestHead {
  std::string method;
  std::string target;   // as sent
  std::string path;     // the target's path, percent-decoded (as cpp-httplib routes it)
  std::string version;  // "HTTP/1.1" or "HTTP/1.0"
  std::vector<std::pair<std::string, std::string>> fields;  // names as sent, values trimmed
  size_t head_bytes = 0;  // bytes of the head in the input, through the blank line
  BodyFraming framing = BodyFraming::kNone;
  uint64_t content_length = 0;  // with kLength
  bool expect_continue = false;
  bool close = false;      // Connection: close, or HTTP/1.0 without keep-alive
  std::string normalized;  // the head handed to cpp-httplib (CRLF line ends)

  // The first field named `name` (case-insensitive), or "".
  std::string Field(std::string_view name) const;
  bool HasField(std::string_view name) const;
};

// Why a head is refused: an HTTP status, a machine code and a message for the client.
struct HeadError {
  int status = 400;
  std::string code;
  std::string message;
};

enum class HeadParse { kIncomplete, kComplete, kError };

// Parses the head at the start of `input`. kIncomplete: no blank line yet and still within the
// limits (read more). kComplete fills *head; kError fills *error (431 too large or too many
// fields, 414 target too long, 400 malformed or ambiguous framing, 501 an unknown
// transfer coding, 505 another HTTP version, 417 an Expect other than 100-continue).
HeadParse ParseRequestHead(std::string_view input, const HeadLimits& limits, RequestHead* head,
                           HeadError* error);

// Percent-decodes a URL path as cpp-httplib does before routing ('+' stays '+').
std::string DecodePath(std::string_view path);

// Follows a chunked body (RFC 9112 section 7.1) without changing it. cpp-httplib reads no
// trailer fields, so a body with trailers is an error here too.
class ChunkedBody {
 public:
  enum class Result { kIncomplete, kComplete, kError };
  explicit ChunkedBody(uint64_t max_data) : max_data_(max_data) {}

  // Consumes bytes after those already fed. kComplete: the body ended after *used bytes of
  // `bytes`; kIncomplete: all were used; kError: error() says why (413 when the data exceeds
  // max_data).
  Result Feed(std::string_view bytes, size_t* used);
  uint64_t data_bytes() const { return data_bytes_; }
  const HeadError& error() const { return error_; }

 private:
  enum class State { kSize, kData, kDataCr, kDataLf, kLastCr, kLastLf, kDone };
  Result Fail(int status, std::string code, std::string message);

  uint64_t max_data_;
  State state_ = State::kSize;
  std::string line_;  // the chunk-size line so far
  uint64_t remaining_ = 0;
  uint64_t data_bytes_ = 0;
  HeadError error_;
};

}  // namespace thermocline::server
