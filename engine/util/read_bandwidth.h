// The machine's sustained memory read bandwidth (what the placement solver's hardware profile
// and `bench` report next to decode's weight-read rate).
#pragma once

#include <cstddef>

#include "engine/util/thread_pool.h"

namespace thermocline {

// Sustained read bandwidth in GB/s (1e9 bytes/s): best of a few passes of all threads summing
// a buffer of `bytes` (far larger than the caches).
double MeasureReadBandwidth(ThreadPool& pool, size_t bytes = size_t{1} << 30);

}  // namespace thermocline
