// FNV-1a 64-bit hashing for identities (model tensor layout, profiling corpus). Not
// cryptographic: it detects a mismatched file, it does not defend against a forged one.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>

namespace thermocline::offline {

class Fnv1a64 {
 public:
  void Update(const void* data, size_t n) {
    const auto* p = static_cast<const uint8_t*>(data);
    for (size_t i = 0; i < n; ++i) {
      state_ ^= p[i];
      state_ *= 0x100000001b3ull;
    }
  }
  void Update(std::string_view s) { Update(s.data(), s.size()); }
  void UpdateU64(uint64_t v) { Update(&v, sizeof(v)); }
  uint64_t digest() const { return state_; }
  std::string Hex() const {
    char buf[17];
    std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(state_));
    return buf;
  }

 private:
  uint64_t state_ = 0xcbf29ce484222325ull;
};

}  // namespace thermocline::offline
