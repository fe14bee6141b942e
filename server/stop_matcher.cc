#include "server/stop_matcher.h"

#include <algorithm>

namespace thermocline::server {

void StopMatcher::Reset(const std::vector<std::string>* stops) {
  stops_ = stops;
  active_ = false;
  if (stops != nullptr) {
    for (const std::string& s : *stops) active_ |= !s.empty();
  }
  held_.clear();
  emitted_ = 0;
}

std::string_view StopMatcher::Push(std::string_view text, bool* stopped) {
  *stopped = false;
  if (!active_) {
    emitted_ += text.size();
    return text;
  }
  held_.append(text);
  // The earliest complete stop string wins.
  size_t cut = std::string::npos;
  for (const std::string& s : *stops_) {
    if (s.empty()) continue;
    const size_t pos = held_.find(s);
    if (pos < cut) cut = pos;
  }
  size_t keep = 0;  // bytes at the end that may still become a stop string
  if (cut != std::string::npos) {
    *stopped = true;
    keep = held_.size() - cut;
  } else {
    for (const std::string& s : *stops_) {
      const size_t max_len = std::min(s.size() - (s.empty() ? 0 : 1), held_.size());
      for (size_t len = max_len; len > keep; --len) {
        if (std::string_view(held_).substr(held_.size() - len) ==
            std::string_view(s).substr(0, len)) {
          keep = len;
          break;
        }
      }
    }
  }
  const size_t n = held_.size() - keep;
  out_.assign(held_, 0, n);
  held_.erase(0, n);
  if (*stopped) held_.clear();
  emitted_ += n;
  return out_;
}

std::string_view StopMatcher::Flush() {
  out_.swap(held_);
  held_.clear();
  emitted_ += out_.size();
  return out_;
}

}  // namespace thermocline::server
