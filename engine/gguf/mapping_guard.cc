// The SIGBUS handler and its table of guarded regions (see mapping_guard.h for why).
#include "engine/gguf/mapping_guard.h"

#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <mutex>

namespace thermocline {
namespace {

// A fixed table: the handler reads it without locks or allocation. Models, their sidecars and
// the files a job has open at once stay far below this.
constexpr int kSlots = 256;

struct Slot {
  std::atomic<bool> used{false};
  std::atomic<uintptr_t> base{0};  // 0: free (or being filled in)
  std::atomic<size_t> size{0};
  std::atomic<bool> faulted{false};
};
Slot slots[kSlots];

struct sigaction previous_action;
uintptr_t page_size = 4096;

void OnSigbus(int sig, siginfo_t* info, void* context) {
  const auto addr = reinterpret_cast<uintptr_t>(info->si_addr);
  for (Slot& s : slots) {
    const uintptr_t base = s.base.load(std::memory_order_acquire);
    if (base == 0 || addr < base || addr >= base + s.size.load(std::memory_order_relaxed)) {
      continue;
    }
    const uintptr_t page = addr & ~(page_size - 1);
    const size_t length = base + s.size.load(std::memory_order_relaxed) - page;
    // mmap is a plain system call here (no lock, no allocation in glibc): safe in a handler.
    void* zeros = ::mmap(reinterpret_cast<void*>(page), length, PROT_READ,
                         MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
    if (zeros != MAP_FAILED) {
      s.faulted.store(true, std::memory_order_release);
      return;  // the faulting read resumes on zero pages
    }
    break;
  }
  // Not a guarded region (or it could not be repaired): what would have happened without us.
  if (previous_action.sa_flags & SA_SIGINFO) {
    previous_action.sa_sigaction(sig, info, context);
    return;
  }
  if (previous_action.sa_handler != SIG_DFL && previous_action.sa_handler != SIG_IGN) {
    previous_action.sa_handler(sig);
    return;
  }
  ::signal(SIGBUS, SIG_DFL);  // the faulting instruction runs again and ends the process
}

}  // namespace

void InstallMappingFaultHandler() {
  static std::once_flag once;
  std::call_once(once, [] {
    page_size = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
    struct sigaction action {};
    action.sa_sigaction = OnSigbus;
    action.sa_flags = SA_SIGINFO | SA_RESTART;
    sigemptyset(&action.sa_mask);
    ::sigaction(SIGBUS, &action, &previous_action);
  });
}

MappingGuard::MappingGuard(const void* base, size_t size) {
  if (base == nullptr || size == 0) return;
  for (int i = 0; i < kSlots; ++i) {
    bool expected = false;
    if (!slots[i].used.compare_exchange_strong(expected, true)) continue;
    slots[i].size.store(size, std::memory_order_relaxed);
    slots[i].faulted.store(false, std::memory_order_relaxed);
    slots[i].base.store(reinterpret_cast<uintptr_t>(base), std::memory_order_release);
    slot_ = i;
    return;
  }
}

MappingGuard::~MappingGuard() { Release(); }

MappingGuard::MappingGuard(MappingGuard&& other) noexcept : slot_(other.slot_) { other.slot_ = -1; }

MappingGuard& MappingGuard::operator=(MappingGuard&& other) noexcept {
  if (this != &other) {
    Release();
    slot_ = other.slot_;
    other.slot_ = -1;
  }
  return *this;
}

bool MappingGuard::faulted() const {
  return slot_ >= 0 && slots[slot_].faulted.load(std::memory_order_acquire);
}

void MappingGuard::Release() {
  if (slot_ < 0) return;
  slots[slot_].base.store(0, std::memory_order_release);
  slots[slot_].used.store(false, std::memory_order_release);
  slot_ = -1;
}

}  // namespace thermocline
