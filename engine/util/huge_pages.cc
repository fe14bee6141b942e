#include "engine/util/huge_pages.h"

#include <sys/mman.h>

#include <cstdlib>
#include <new>

namespace thermocline {

void* AllocateHugePageBacked(size_t bytes) {
  if (bytes < kHugePageBytes) {
    void* p = std::malloc(bytes == 0 ? 1 : bytes);
    if (p == nullptr) throw std::bad_alloc();
    return p;
  }
  const size_t rounded = (bytes + kHugePageBytes - 1) / kHugePageBytes * kHugePageBytes;
  void* p = std::aligned_alloc(kHugePageBytes, rounded);
  if (p == nullptr) throw std::bad_alloc();
  // Advice only: without THP (or with it off) the pages stay 4 KB and everything still works.
  // The huge pages the data fills; a partial last one stays 4 KB pages, so that the rounding
  // costs address space, not RAM.
  madvise(p, bytes / kHugePageBytes * kHugePageBytes, MADV_HUGEPAGE);
  return p;
}

void FreeHugePageBacked(void* p, size_t /*bytes*/) { std::free(p); }

}  // namespace thermocline
