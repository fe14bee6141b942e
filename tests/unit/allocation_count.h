// Counts every (non-aligned) operator new of the test binary (allocation_count.cc replaces it), so
// a test can assert that a hot path (sampling, a decode step) does not allocate. Sanitizers
// interpose on new/delete themselves, so there the replacement is left out, counting is off
// (THERMOCLINE_COUNT_ALLOCATIONS 0) and such tests skip.
#pragma once

#include <cstdint>

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define THERMOCLINE_COUNT_ALLOCATIONS 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer) || \
    __has_feature(memory_sanitizer)
#define THERMOCLINE_COUNT_ALLOCATIONS 0
#endif
#endif
#ifndef THERMOCLINE_COUNT_ALLOCATIONS
#define THERMOCLINE_COUNT_ALLOCATIONS 1
#endif

namespace thermocline {
class Session;
}

namespace thermocline::testing {

// operator new calls since the process started, on every thread; 0 when counting is off.
int64_t AllocationCount();

// The allocations n greedy decode steps of `session` make (each evaluates the argmax of the
// logits it holds); the steps REQUIRE success.
int64_t AllocationsOfGreedySteps(Session& session, int n);

}  // namespace thermocline::testing
