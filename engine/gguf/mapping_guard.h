// Survival of a model file that shrinks under its mapping. GgufFile maps model files read-only;
// when the file is truncated (or its disk fails) while mapped, the next read of a page past the
// new end raises SIGBUS, which by default kills the process and every model it serves.
//
// Why a handler and not the alternatives: mlock/MAP_POPULATE do not help (truncation unmaps the
// page-cache pages of a MAP_PRIVATE mapping, locked or not); reading the file into anonymous
// memory costs a private copy of every model and gives up sharing the page cache; sigsetjmp
// around a forward pass cannot catch a fault on a pool worker thread. So the handler repairs
// the mapping in place: it maps zero pages over the guarded region from the faulting page to its
// end, marks the mapping faulted and returns; the faulting read resumes on zeros. Whoever uses
// the mapping checks faulted() (an atomic load, once per token or request) and stops trusting
// it: the daemon fails the request and unloads the model. A SIGBUS outside every guarded
// region goes to the previous handler (or the default action, which ends the process).
#pragma once

#include <atomic>
#include <cstddef>

namespace thermocline {

// Installs the process-wide SIGBUS handler; idempotent, thread-safe. Without it a guarded
// mapping is still registered, but a fault ends the process as before.
void InstallMappingFaultHandler();

// A registered region: the handler may repair it. Move-only; unregisters on destruction, which
// must come before the region is unmapped.
class MappingGuard {
 public:
  MappingGuard() = default;
  // Registers [base, base + size). When every slot is taken the region stays unguarded
  // (guarded() is false); reads then work as before, only a fault is fatal.
  MappingGuard(const void* base, size_t size);
  ~MappingGuard();
  MappingGuard(MappingGuard&& other) noexcept;
  MappingGuard& operator=(MappingGuard&& other) noexcept;
  MappingGuard(const MappingGuard&) = delete;
  MappingGuard& operator=(const MappingGuard&) = delete;

  bool guarded() const { return slot_ >= 0; }
  // True once a read of the region faulted (its bytes are zeros from that page on). Lock-free.
  bool faulted() const;

 private:
  void Release();
  int slot_ = -1;
};

}  // namespace thermocline
