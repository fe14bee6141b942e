// The machine's sustained memory read bandwidth, measured as the decode loop reads weights: all
// threads of a pool streaming a buffer far larger than the caches.
#include "engine/util/read_bandwidth.h"

#include <algorithm>
#include <chrono>
#include <vector>

namespace thermocline {
namespace {

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

double MeasureReadBandwidth(ThreadPool& pool, size_t bytes) {
  const size_t n = bytes / sizeof(uint64_t);
  std::vector<uint64_t> buffer(n);
  pool.ParallelFor(static_cast<int64_t>(n), 4096, [&](int, int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) buffer[i] = static_cast<uint64_t>(i) * 0x9e3779b97f4a7c15ull;
  });
  std::vector<uint64_t> sinks(pool.size() * 8);
  double best = 0;
  for (int pass = 0; pass < 4; ++pass) {
    const double t0 = Now();
    pool.ParallelFor(static_cast<int64_t>(n), 4096, [&](int thread, int64_t b, int64_t e) {
      uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0;
      int64_t i = b;
      for (; i + 4 <= e; i += 4) {
        a0 += buffer[i];
        a1 += buffer[i + 1];
        a2 += buffer[i + 2];
        a3 += buffer[i + 3];
      }
      for (; i < e; ++i) a0 += buffer[i];
      sinks[thread * 8] += a0 ^ a1 ^ a2 ^ a3;
    });
    const double seconds = Now() - t0;
    best = std::max(best, static_cast<double>(n * sizeof(uint64_t)) / seconds / 1e9);
  }
  volatile uint64_t keep = 0;
  for (uint64_t v : sinks) keep = keep + v;
  (void)keep;
  return best;
}

}  // namespace thermocline
