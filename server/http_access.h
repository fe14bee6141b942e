// Per-request bookkeeping shared by the HTTP handlers and the access logger. cpp-httplib runs
// a request's routing, handler, streaming content provider and logger on one thread, one after
// another, so the record is thread-local and needs no lock.
#pragma once

#include <chrono>
#include <cstdint>

namespace thermocline::server {

struct AccessRecord {
  std::chrono::steady_clock::time_point start{};
  int64_t prompt_tokens = -1;  // -1: not a generation request
  int64_t completion_tokens = -1;
  double ttft_seconds = -1;
  const char* outcome = "";  // e.g. "client_disconnected"
};

inline AccessRecord& CurrentAccess() {
  thread_local AccessRecord record;
  return record;
}

}  // namespace thermocline::server
