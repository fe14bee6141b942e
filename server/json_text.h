// Appending JSON text by hand for the per-token hot path (SSE chunks), where building an
// nlohmann::json per token would allocate a tree per token.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>

namespace thermocline::server {

// Appends `s` as a quoted JSON string. `s` must be valid UTF-8 (the detokenizer guarantees it);
// control characters are escaped, everything else is copied.
inline void AppendJsonString(std::string* out, std::string_view s) {
  static constexpr char kHex[] = "0123456789abcdef";
  out->push_back('"');
  size_t run = 0;  // start of the current run of bytes that need no escaping
  for (size_t i = 0; i < s.size(); ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c != '"' && c != '\\') continue;
    out->append(s.data() + run, i - run);
    run = i + 1;
    switch (c) {
      case '"':
        out->append("\\\"");
        break;
      case '\\':
        out->append("\\\\");
        break;
      case '\n':
        out->append("\\n");
        break;
      case '\r':
        out->append("\\r");
        break;
      case '\t':
        out->append("\\t");
        break;
      default: {
        const char esc[6] = {'\\', 'u', '0', '0', kHex[c >> 4], kHex[c & 15]};
        out->append(esc, 6);
      }
    }
  }
  out->append(s.data() + run, s.size() - run);
  out->push_back('"');
}

inline void AppendInt(std::string* out, int64_t v) {
  char buf[24];
  const int n = std::snprintf(buf, sizeof(buf), "%lld", static_cast<long long>(v));
  out->append(buf, n);
}

// Shortest text that reads back as the same float (what nlohmann writes for a float).
inline void AppendFloat(std::string* out, float v) {
  char buf[32];
  if (!(v == v) || v > 3.4e38f || v < -3.4e38f) {  // NaN / inf are not JSON
    out->append(v < 0 ? "-9999.0" : "0.0");
    return;
  }
  const int n = std::snprintf(buf, sizeof(buf), "%.9g", static_cast<double>(v));
  out->append(buf, n);
}

}  // namespace thermocline::server
