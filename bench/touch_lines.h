// Reading memory and nothing else, for the benchmarks' read floors.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace thermocline {

// One 8-byte word per 64-byte line of [p, p + bytes) and the last word: every line read once
// and nothing computed, what merely reading the bytes costs on this machine. bytes >= 8.
inline uint64_t TouchLines(const uint8_t* p, size_t bytes) {
  uint64_t sum = 0, v;
  for (size_t o = 0; o + 8 <= bytes; o += 64) {
    std::memcpy(&v, p + o, 8);
    sum += v;
  }
  std::memcpy(&v, p + bytes - 8, 8);
  return sum + v;
}

}  // namespace thermocline
