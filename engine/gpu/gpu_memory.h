// GPU memory accounting: a hard cap on what Thermocline allocates on the device
// (`--gpu-memory BYTES`). Every device allocation reserves its (rounded) size here first; a
// reservation past the cap fails with a ResourceExhaustedError and nothing is allocated. Plain
// bookkeeping without CUDA, so it is unit-tested on any machine; engine/cuda/device_arena.h
// puts cudaMalloc behind it.
#pragma once

#include <cstdint>
#include <mutex>
#include <string_view>

#include "absl/status/status.h"

namespace thermocline::gpu {

class MemoryBudget {
 public:
  static constexpr uint64_t kUnlimited = ~uint64_t{0};
  // Device allocations are accounted in multiples of this (cudaMalloc's alignment).
  static constexpr uint64_t kGranularity = 256;

  explicit MemoryBudget(uint64_t cap_bytes = kUnlimited) : cap_(cap_bytes) {}
  MemoryBudget(const MemoryBudget&) = delete;
  MemoryBudget& operator=(const MemoryBudget&) = delete;

  // bytes rounded up to kGranularity (0 stays 0).
  static uint64_t Rounded(uint64_t bytes);

  // Accounts Rounded(bytes) for `what` (named in the error), or fails without accounting
  // anything when that would pass the cap. Thread-safe.
  absl::Status Reserve(uint64_t bytes, std::string_view what);
  // Returns a reservation of `bytes` (the same number given to Reserve). Thread-safe.
  void Release(uint64_t bytes);

  uint64_t cap() const { return cap_; }
  uint64_t used() const;
  uint64_t peak() const;
  uint64_t available() const;

 private:
  const uint64_t cap_;
  mutable std::mutex mu_;
  uint64_t used_ = 0;
  uint64_t peak_ = 0;
};

}  // namespace thermocline::gpu
