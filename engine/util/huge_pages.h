// Memory for large weight copies made at load (down_t, reordered FFN rows) on transparent huge
// pages where the kernel allows them (madvise mode). The sparse operators read a few scattered
// rows of each matrix per token: on 4 KB pages nearly every row is a TLB miss and a page walk
// (two-dimensional under a hypervisor); 2 MB pages cover a layer's FFN with a few entries.
#pragma once

#include <cstddef>
#include <cstdint>
#include <new>
#include <type_traits>
#include <utility>
#include <vector>

namespace thermocline {

// Allocations of at least kHugePageBytes are mappings of their own, 2 MB aligned and advised
// MADV_HUGEPAGE; smaller ones come from malloc. Stateless: any two instances are interchangeable.
template <class T>
struct HugePageAllocator {
  using value_type = T;
  HugePageAllocator() = default;
  template <class U>
  HugePageAllocator(const HugePageAllocator<U>&) {}  // NOLINT: rebinding is implicit
  T* allocate(size_t n);
  void deallocate(T* p, size_t n);
  // Elements are default-initialized: resize() leaves the bytes as the allocation gave them
  // (zero pages from the kernel for huge allocations) instead of zeroing them on one thread
  // first, so that the pages of a copy are faulted in by the threads that write it.
  template <class U>
  void construct(U* p) noexcept(std::is_nothrow_default_constructible_v<U>) {
    ::new (static_cast<void*>(p)) U;
  }
  template <class U, class... Args>
  void construct(U* p, Args&&... args) {
    ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
  }
  template <class U>
  bool operator==(const HugePageAllocator<U>&) const {
    return true;
  }
  template <class U>
  bool operator!=(const HugePageAllocator<U>&) const {
    return false;
  }
};

inline constexpr size_t kHugePageBytes = size_t{2} << 20;

// Whether a fresh allocation of `bytes` through HugePageAllocator comes zeroed: the mappings of
// huge allocations are new zero pages; smaller ones are malloc's, whatever they held.
inline constexpr bool FreshAllocationIsZero(size_t bytes) { return bytes >= kHugePageBytes; }

// Raw allocation behind HugePageAllocator; throws std::bad_alloc when out of memory. Free with
// the bytes it was allocated with.
void* AllocateHugePageBacked(size_t bytes);
void FreeHugePageBacked(void* p, size_t bytes);

template <class T>
T* HugePageAllocator<T>::allocate(size_t n) {
  return static_cast<T*>(AllocateHugePageBacked(n * sizeof(T)));
}
template <class T>
void HugePageAllocator<T>::deallocate(T* p, size_t n) {
  FreeHugePageBacked(p, n * sizeof(T));
}

using HugeBytes = std::vector<uint8_t, HugePageAllocator<uint8_t>>;

}  // namespace thermocline
