#include "server/http_head.h"

#include <httplib.h>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "server/errors.h"

namespace thermocline::server {
namespace {

// RFC 9110 section 5.6.2.
bool IsTokenChar(char c) {
  return absl::ascii_isalnum(static_cast<unsigned char>(c)) ||
         std::string_view("!#$%&'*+-.^_`|~").find(c) != std::string_view::npos;
}

bool IsToken(absl::string_view s) {
  if (s.empty()) return false;
  for (char c : s) {
    if (!IsTokenChar(c)) return false;
  }
  return true;
}

// Field values: visible characters, spaces, tabs and obs-text; never NUL, CR or LF.
bool IsFieldValue(std::string_view s) {
  for (char c : s) {
    const unsigned char u = static_cast<unsigned char>(c);
    if ((u < 0x20 && c != '\t') || u == 0x7f) return false;
  }
  return true;
}

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

HeadParse Fail(HeadError* error, int status, std::string code, std::string message) {
  *error = HeadError{status, std::move(code), std::move(message)};
  return HeadParse::kError;
}

// Splits `text` into lines ending in LF (a CR before it is dropped). Returns false for a CR that
// is not followed by LF.
bool SplitLines(std::string_view text, std::vector<std::string_view>* lines) {
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t lf = text.find('\n', pos);
    std::string_view line = text.substr(pos, lf - pos);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.find('\r') != std::string_view::npos) return false;
    lines->push_back(line);
    pos = lf + 1;
  }
  return true;
}

bool ExpectsBody(std::string_view method) {
  return method == "POST" || method == "PUT" || method == "PATCH" || method == "DELETE" ||
         method == "PRI";
}

}  // namespace

std::string RequestHead::Field(std::string_view name) const {
  for (const auto& [k, v] : fields) {
    if (absl::EqualsIgnoreCase(k, ToAbsl(name))) return v;
  }
  return "";
}

bool RequestHead::HasField(std::string_view name) const {
  for (const auto& [k, v] : fields) {
    if (absl::EqualsIgnoreCase(k, ToAbsl(name))) return true;
  }
  return false;
}

std::string DecodePath(std::string_view path) {
  return httplib::detail::decode_url(std::string(path), /*convert_plus_to_space=*/false);
}

HeadParse ParseRequestHead(std::string_view input, const HeadLimits& limits, RequestHead* head,
                           HeadError* error) {
  // A server should ignore empty lines before the request line (RFC 9112 section 2.2).
  size_t start = 0;
  while (start < input.size() && start < 8 && (input[start] == '\r' || input[start] == '\n')) {
    ++start;
  }
  size_t end = std::string_view::npos;  // one past the blank line
  for (size_t pos = input.find('\n', start); pos != std::string_view::npos;
       pos = input.find('\n', pos + 1)) {
    if (pos + 1 < input.size() && input[pos + 1] == '\n') {
      end = pos + 2;
      break;
    }
    if (pos + 2 < input.size() && input[pos + 1] == '\r' && input[pos + 2] == '\n') {
      end = pos + 3;
      break;
    }
    if (pos + 1 - start > limits.max_bytes) break;
  }
  if (end == std::string_view::npos || end - start > limits.max_bytes) {
    if (input.size() - start <= limits.max_bytes) return HeadParse::kIncomplete;
    return Fail(error, 431, "request_header_fields_too_large",
                absl::StrCat("the request head is larger than ", limits.max_bytes, " bytes"));
  }
  std::vector<std::string_view> lines;
  if (!SplitLines(input.substr(start, end - start), &lines)) {
    return Fail(error, 400, "bad_request", "a bare CR in the request head");
  }
  while (!lines.empty() && lines.back().empty()) lines.pop_back();
  if (lines.empty()) return Fail(error, 400, "bad_request", "no request line");
  if (lines.size() - 1 > limits.max_fields) {
    return Fail(error, 431, "request_header_fields_too_large",
                absl::StrCat("the request has more than ", limits.max_fields, " header fields"));
  }

  *head = RequestHead();
  head->head_bytes = end;
  const std::vector<absl::string_view> parts = absl::StrSplit(ToAbsl(lines[0]), ' ');
  if (parts.size() != 3 || !IsToken(parts[0]) || parts[1].empty()) {
    return Fail(error, 400, "bad_request", "the request line is not 'METHOD TARGET HTTP/1.1'");
  }
  head->method = std::string(parts[0]);
  head->target = std::string(parts[1]);
  head->version = std::string(parts[2]);
  if (head->version != "HTTP/1.1" && head->version != "HTTP/1.0") {
    if (!absl::StartsWith(head->version, "HTTP/")) {
      return Fail(error, 400, "bad_request", "the request line is not 'METHOD TARGET HTTP/1.1'");
    }
    return Fail(error, 505, "http_version_not_supported", "only HTTP/1.1 and HTTP/1.0 are served");
  }
  if (head->target.size() > limits.max_target) {
    return Fail(error, 414, "uri_too_long",
                absl::StrCat("the request target is longer than ", limits.max_target, " bytes"));
  }
  for (char c : head->target) {
    const unsigned char u = static_cast<unsigned char>(c);
    if (u <= 0x20 || u >= 0x7f) {
      return Fail(error, 400, "bad_request", "the request target holds a control character");
    }
  }
  if (head->target != "*" && head->target.front() != '/') {
    return Fail(error, 400, "bad_request", "the request target must be a path starting with '/'");
  }
  if (DecodePath(head->target).find('\0') != std::string::npos) {
    return Fail(error, 400, "bad_request", "the request target holds a NUL byte (%00)");
  }
  head->path = DecodePath(std::string_view(head->target).substr(0, head->target.find('?')));

  // Copies: the field values move when `fields` grows.
  std::vector<std::string> lengths, codings;
  int hosts = 0;
  bool keep_alive_token = false;
  std::string kept;
  for (size_t i = 1; i < lines.size(); ++i) {
    const absl::string_view line = ToAbsl(lines[i]);
    if (line.front() == ' ' || line.front() == '\t') {
      return Fail(error, 400, "bad_request", "folded header lines are not accepted");
    }
    const size_t colon = line.find(':');
    if (colon == absl::string_view::npos || !IsToken(line.substr(0, colon))) {
      return Fail(error, 400, "bad_request",
                  absl::StrCat("malformed header field in line ", i + 1, " of the head"));
    }
    const std::string name(line.substr(0, colon));
    const std::string value(absl::StripAsciiWhitespace(line.substr(colon + 1)));
    if (!IsFieldValue(value)) {
      return Fail(error, 400, "bad_request",
                  absl::StrCat("the header field '", name, "' holds a control character"));
    }
    head->fields.emplace_back(name, value);
    auto is = [&](const char* n) { return absl::EqualsIgnoreCase(name, n); };
    if (is("Content-Length")) {
      for (absl::string_view v : absl::StrSplit(head->fields.back().second, ',')) {
        lengths.emplace_back(absl::StripAsciiWhitespace(v));
      }
      continue;
    }
    if (is("Transfer-Encoding")) {
      for (absl::string_view v : absl::StrSplit(head->fields.back().second, ',')) {
        codings.emplace_back(absl::StripAsciiWhitespace(v));
      }
      continue;  // re-emitted once below
    }
    if (is("Host")) {
      ++hosts;
    } else if (is("Expect")) {
      if (!absl::EqualsIgnoreCase(value, "100-continue")) {
        return Fail(error, 417, "expectation_failed",
                    absl::StrCat("unsupported Expect '", value, "'"));
      }
      head->expect_continue = true;
      continue;
    } else if (is("Range") || is("If-Range")) {
      continue;  // byte ranges of API responses make no sense
    } else if (is("Connection")) {
      for (absl::string_view t : absl::StrSplit(value, ',')) {
        t = absl::StripAsciiWhitespace(t);
        if (absl::EqualsIgnoreCase(t, "close")) head->close = true;
        if (absl::EqualsIgnoreCase(t, "keep-alive")) keep_alive_token = true;
      }
    }
    absl::StrAppend(&kept, name, ": ", value, "\r\n");
  }
  if (head->version == "HTTP/1.0" && !keep_alive_token) head->close = true;
  if (hosts > 1) return Fail(error, 400, "bad_request", "more than one Host header field");
  if (!codings.empty()) {
    if (!lengths.empty()) {
      return Fail(error, 400, "bad_request",
                  "both Transfer-Encoding and Content-Length: send only one");
    }
    if (head->version == "HTTP/1.0") {
      return Fail(error, 400, "bad_request", "Transfer-Encoding in an HTTP/1.0 request");
    }
    if (codings.size() != 1 || !absl::EqualsIgnoreCase(codings[0], "chunked")) {
      return Fail(error, 501, "not_implemented",
                  "the only transfer coding served is 'chunked' (compress with Content-Encoding)");
    }
    head->framing = BodyFraming::kChunked;
    absl::StrAppend(&kept, "Transfer-Encoding: chunked\r\n");
  }
  if (!lengths.empty()) {
    uint64_t n = 0;
    for (size_t k = 0; k < lengths.size(); ++k) {
      uint64_t v = 0;
      const bool digits = !lengths[k].empty() && lengths[k].size() <= 18 &&
                          lengths[k].find_first_not_of("0123456789") == std::string::npos;
      if (!digits || !absl::SimpleAtoi(lengths[k], &v)) {
        return Fail(error, 400, "bad_request", "Content-Length is not a number");
      }
      if (k > 0 && v != n) {
        return Fail(error, 400, "bad_request", "conflicting Content-Length header fields");
      }
      n = v;
    }
    head->framing = BodyFraming::kLength;
    head->content_length = n;
    absl::StrAppend(&kept, "Content-Length: ", n, "\r\n");
  } else if (head->framing == BodyFraming::kNone && ExpectsBody(head->method)) {
    // A request without Content-Length or chunked coding has no body (RFC 9112 section 6.3).
    absl::StrAppend(&kept, "Content-Length: 0\r\n");
  }
  head->normalized = absl::StrCat(ToAbsl(lines[0]), "\r\n", kept, "\r\n");
  return HeadParse::kComplete;
}

ChunkedBody::Result ChunkedBody::Fail(int status, std::string code, std::string message) {
  error_ = HeadError{status, std::move(code), std::move(message)};
  return Result::kError;
}

ChunkedBody::Result ChunkedBody::Feed(std::string_view bytes, size_t* used) {
  constexpr size_t kMaxSizeLine = 1024;  // chunk size plus extensions
  size_t i = 0;
  while (i < bytes.size()) {
    const char c = bytes[i];
    switch (state_) {
      case State::kSize: {
        ++i;
        if (c != '\n') {
          line_.push_back(c);
          if (line_.size() > kMaxSizeLine) {
            return Fail(400, "bad_request", "a chunk-size line is too long");
          }
          break;
        }
        if (line_.empty() || line_.back() != '\r') {
          return Fail(400, "bad_request", "a chunk-size line does not end in CRLF");
        }
        line_.pop_back();
        size_t digits = 0;
        uint64_t size = 0;
        while (digits < line_.size() && HexValue(line_[digits]) >= 0) {
          size = size * 16 + static_cast<uint64_t>(HexValue(line_[digits]));
          ++digits;
        }
        std::string_view rest = std::string_view(line_).substr(digits);
        while (!rest.empty() && (rest.front() == ' ' || rest.front() == '\t')) {
          rest.remove_prefix(1);
        }
        if (digits == 0 || digits > 15 || (!rest.empty() && rest.front() != ';')) {
          return Fail(400, "bad_request", "a malformed chunk-size line");
        }
        line_.clear();
        if (size == 0) {
          state_ = State::kLastCr;
        } else if (data_bytes_ + size > max_data_) {
          return Fail(413, "payload_too_large",
                      absl::StrCat("the request body is larger than ", max_data_, " bytes"));
        } else {
          remaining_ = size;
          state_ = State::kData;
        }
        break;
      }
      case State::kData: {
        const size_t n = static_cast<size_t>(std::min<uint64_t>(remaining_, bytes.size() - i));
        i += n;
        remaining_ -= n;
        data_bytes_ += n;
        if (remaining_ == 0) state_ = State::kDataCr;
        break;
      }
      case State::kDataCr:
      case State::kLastCr:
        if (c != '\r') {
          return Fail(400, "bad_request",
                      state_ == State::kLastCr ? "chunked trailer fields are not supported"
                                               : "a chunk is not followed by CRLF");
        }
        ++i;
        state_ = state_ == State::kDataCr ? State::kDataLf : State::kLastLf;
        break;
      case State::kDataLf:
      case State::kLastLf:
        if (c != '\n') return Fail(400, "bad_request", "a chunk is not followed by CRLF");
        ++i;
        if (state_ == State::kLastLf) {
          state_ = State::kDone;
          *used = i;
          return Result::kComplete;
        }
        state_ = State::kSize;
        break;
      case State::kDone:
        *used = i;
        return Result::kComplete;
    }
  }
  *used = i;
  return state_ == State::kDone ? Result::kComplete : Result::kIncomplete;
}

}  // namespace thermocline::server
