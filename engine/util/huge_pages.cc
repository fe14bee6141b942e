#include "engine/util/huge_pages.h"

#include <sys/mman.h>

#include <cstdint>
#include <cstdlib>
#include <new>

namespace thermocline {

namespace {
size_t RoundedToHugePages(size_t bytes) {
  return (bytes + kHugePageBytes - 1) / kHugePageBytes * kHugePageBytes;
}
}  // namespace

void* AllocateHugePageBacked(size_t bytes) {
  if (bytes < kHugePageBytes) {
    void* p = std::malloc(bytes == 0 ? 1 : bytes);
    if (p == nullptr) throw std::bad_alloc();
    return p;
  }
  // A mapping of its own, 2 MB aligned (a huge page's more, the slack unmapped): fresh zero
  // pages the kernel can back with huge pages, returned to the system when freed. malloc's
  // aligned_alloc hands a long-running process heap memory it freed before, whose pages are
  // already 4 KB ones (a KV cache there faulted a 4 KB page every few positions).
  const size_t rounded = RoundedToHugePages(bytes);
  void* raw = mmap(nullptr, rounded + kHugePageBytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) throw std::bad_alloc();
  const uintptr_t start = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t aligned = (start + kHugePageBytes - 1) / kHugePageBytes * kHugePageBytes;
  if (aligned > start) munmap(raw, aligned - start);
  if (const size_t tail = kHugePageBytes - (aligned - start); tail > 0) {
    munmap(reinterpret_cast<void*>(aligned + rounded), tail);
  }
  void* p = reinterpret_cast<void*>(aligned);
  // Advice only: without THP (or with it off) the pages stay 4 KB and everything still works.
  // The huge pages the data fills; a partial last one stays 4 KB pages, so that the rounding
  // costs address space, not RAM.
  madvise(p, bytes / kHugePageBytes * kHugePageBytes, MADV_HUGEPAGE);
  return p;
}

void FreeHugePageBacked(void* p, size_t bytes) {
  if (bytes < kHugePageBytes) {
    std::free(p);
    return;
  }
  munmap(p, RoundedToHugePages(bytes));
}

}  // namespace thermocline
