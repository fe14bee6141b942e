// The test binary's operator new, counting its calls (allocation_count.h).
#include "allocation_count.h"

#include <algorithm>
#include <atomic>
#include <catch2/catch.hpp>
#include <cstdlib>
#include <new>

#include "engine/model/session.h"

namespace {
std::atomic<int64_t> g_allocations{0};
}  // namespace

#if THERMOCLINE_COUNT_ALLOCATIONS
// Same pairing as libstdc++'s defaults (malloc/free); the array and nothrow forms forward here.
// GCC flags free() of operator new's memory once these inline into callers; here it is the
// intended pairing.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
void* operator new(std::size_t size) {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(size == 0 ? 1 : size)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
#pragma GCC diagnostic pop
#endif

namespace thermocline::testing {

int64_t AllocationCount() { return g_allocations.load(std::memory_order_relaxed); }

int64_t AllocationsOfGreedySteps(Session& session, int n) {
  const int64_t n_vocab = session.model().hparams().n_vocab;
  const int64_t before = AllocationCount();
  for (int i = 0; i < n; ++i) {
    const float* l = session.logits();
    const int32_t next = static_cast<int32_t>(std::max_element(l, l + n_vocab) - l);
    REQUIRE(session.Eval({&next, 1}).ok());
  }
  return AllocationCount() - before;
}

}  // namespace thermocline::testing
