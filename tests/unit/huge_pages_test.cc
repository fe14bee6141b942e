// HugePageAllocator: large allocations are 2 MB aligned mappings of their own, so that memory a
// long-running process freed (a finished session's KV cache) is not handed out again with its
// 4 KB pages already in place.
#include "engine/util/huge_pages.h"

#include <malloc.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdint>
#include <cstring>
#include <vector>

namespace thermocline {
namespace {

// Pages of [p, p + bytes) that are resident (mincore).
int64_t ResidentPages(const void* p, size_t bytes) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  std::vector<unsigned char> resident((bytes + page - 1) / page);
  if (mincore(const_cast<void*>(p), bytes, resident.data()) != 0) return -1;
  int64_t n = 0;
  for (unsigned char r : resident) n += r & 1;
  return n;
}

// Allocates, writes and frees a large block three times; 0 when each time its pages were new
// zero pages (2 MB aligned, none resident before written), else the round that failed (1-based)
// plus 10 times what failed.
int FreshRounds(size_t bytes) {
  HugePageAllocator<uint8_t> alloc;
  for (int round = 0; round < 3; ++round) {
    uint8_t* p = alloc.allocate(bytes);
    if (reinterpret_cast<uintptr_t>(p) % kHugePageBytes != 0) return round + 1 + 10;
    if (ResidentPages(p, bytes) != 0) return round + 1 + 20;
    if (p[0] != 0 || p[bytes - 1] != 0) return round + 1 + 30;
    std::memset(p, 0x5A, bytes);
    if (ResidentPages(p, bytes) == 0) return round + 1 + 40;
    alloc.deallocate(p, bytes);
  }
  return 0;
}

TEST_CASE("large huge-page allocations are fresh aligned mappings, returned when freed",
          "[support]") {
  constexpr size_t kBytes = 3 * kHugePageBytes + 12345;  // a partial last huge page too
  CHECK(FreshRounds(kBytes) == 0);
  // A long-running process whose malloc serves such sizes from its heap (as it does once it has
  // freed one: its mmap threshold rises), in a child so that the setting stays there: the
  // allocator still hands out new pages, not the freed block's 4 KB ones holding 0x5A.
  const pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    mallopt(M_MMAP_THRESHOLD, 256 << 20);
    mallopt(M_TRIM_THRESHOLD, 512 << 20);
    _exit(FreshRounds(kBytes));
  }
  int status = 0;
  REQUIRE(waitpid(child, &status, 0) == child);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);

  // Small allocations come from malloc and work as any other.
  HugePageAllocator<uint8_t> alloc;
  uint8_t* small = alloc.allocate(100);
  REQUIRE(small != nullptr);
  std::memset(small, 1, 100);
  alloc.deallocate(small, 100);
}

}  // namespace
}  // namespace thermocline
