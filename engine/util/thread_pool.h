// A persistent pool of worker threads for the per-token parallel loops of the kernels.
// Threads are created once; each Run() wakes them (spinning briefly before sleeping, so the
// hundreds of parallel sections per token cost microseconds, not a futex round trip each).
// Each Run has size() parts; whichever threads are running claim them, the caller first, so a
// worker that the OS has descheduled (a busy machine) delays nothing: the others do its part.
#pragma once

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <type_traits>
#include <vector>

namespace thermocline {

class ThreadPool {
 public:
  // n_threads counts the calling thread, which always takes part.
  explicit ThreadPool(int n_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_threads_; }

  // Calls fn(part) once for every part in [0, size()), on any of the pool's threads, and
  // returns when all calls have returned. Parts never run concurrently with themselves, so
  // per-part scratch indexed by `part` is safe. Not reentrant: one Run at a time per pool
  // (the caller owns the pool). fn must not throw.
  template <typename F>
  void Run(F&& fn) {
    using Fn = std::remove_reference_t<F>;
    auto trampoline = [](void* ctx, int thread) { (*static_cast<Fn*>(ctx))(thread); };
    RunImpl(trampoline, const_cast<void*>(static_cast<const void*>(std::addressof(fn))));
  }

  // Splits [0, n) into size() contiguous chunks (multiples of grain) and calls
  // fn(part, begin, end) for each non-empty chunk (part < size(), as in Run).
  template <typename F>
  void ParallelFor(int64_t n, int64_t grain, F&& fn) {
    if (n <= 0) return;
    grain = std::max<int64_t>(grain, 1);
    const int64_t blocks = (n + grain - 1) / grain;
    if (n_threads_ == 1 || blocks == 1) {
      fn(0, int64_t{0}, n);
      return;
    }
    Run([&](int thread) {
      const int64_t per = (blocks + n_threads_ - 1) / n_threads_;
      const int64_t begin = thread * per * grain;
      const int64_t end = std::min(n, (thread + 1) * per * grain);
      if (begin < end) fn(thread, begin, end);
    });
  }

  // Calls fn(begin, end) on the blocks of [0, n) (`block` items each, the last one shorter), each
  // exactly once. Every thread owns one contiguous share of the blocks (1 / size() of them) and
  // runs it front to back, so that what it reads is one stream for the hardware prefetchers; a
  // thread done with its share takes blocks from the back of the others' until none is left, so
  // a slower or descheduled thread holds up nobody. For streaming loops (decode mat-vecs):
  // ranges claimed in turn from one shared counter interleave the threads' streams, and each
  // new range is a stream the prefetchers must pick up again.
  template <typename F>
  void ParallelShares(int64_t n, int64_t block, F&& fn);

  // Number of threads worth using on this machine (hardware threads, at least 1).
  static int DefaultThreads();

 private:
  using Trampoline = void (*)(void* ctx, int thread);
  void RunImpl(Trampoline fn, void* ctx);
  void WorkerLoop(int index);

  const int n_threads_;
  std::vector<std::thread> workers_;

  // Runs the parts of the current Run this thread can claim; returns how many it ran.
  int ClaimAndRun();

  Trampoline task_ = nullptr;
  void* task_ctx_ = nullptr;
  std::atomic<uint64_t> generation_{0};
  // (generation << 32) | next part to claim: claims of a finished Run fail on the generation.
  std::atomic<uint64_t> claim_{0};
  std::atomic<int> done_{0};
  std::atomic<bool> stop_{false};

  std::mutex sleep_mutex_;
  std::condition_variable wake_;
  std::atomic<int> sleepers_{0};
};

template <typename F>
void ThreadPool::ParallelShares(int64_t n, int64_t block, F&& fn) {
  if (n <= 0) return;
  block = std::max({block, int64_t{1}, (n >> 32) + 1});  // block numbers fit in 32 bits
  const int64_t n_blocks = (n + block - 1) / block;
  if (n_threads_ == 1 || n_blocks == 1) {
    for (int64_t b = 0; b < n_blocks; ++b) fn(b * block, std::min(n, (b + 1) * block));
    return;
  }
  // Share p: blocks [front, back) not yet taken, packed as (front << 32) | back. Its owner takes
  // the front block, the others the back one; the compare-and-swap settles who gets the last.
  struct alignas(64) Share {
    std::atomic<uint64_t> range;
  };
  constexpr int kMaxShares = 64;  // parts beyond the 64th only take from the others' backs
  Share shares[kMaxShares];
  const int n_shares = std::min(n_threads_, kMaxShares);
  for (int p = 0; p < n_shares; ++p) {
    const auto front = static_cast<uint64_t>(n_blocks * p / n_shares);
    const auto back = static_cast<uint64_t>(n_blocks * (p + 1) / n_shares);
    shares[p].range.store(front << 32 | back, std::memory_order_relaxed);
  }
  // Takes one block of share p from its front (owner) or its back; false when it is empty.
  const auto take = [&](int p, bool owner) {
    uint64_t range = shares[p].range.load(std::memory_order_relaxed);
    for (;;) {
      const uint64_t front = range >> 32, back = range & 0xFFFFFFFFu;
      if (front >= back) return false;
      const uint64_t next = owner ? (front + 1) << 32 | back : front << 32 | (back - 1);
      if (shares[p].range.compare_exchange_weak(range, next, std::memory_order_relaxed)) {
        const int64_t b = static_cast<int64_t>(owner ? front : back - 1);
        fn(b * block, std::min(n, (b + 1) * block));
        return true;
      }
    }
  };
  Run([&](int part) {
    if (part < n_shares) {
      while (take(part, true)) {
      }
    }
    for (int i = 1; i <= n_shares; ++i) {
      const int p = (part + i) % n_shares;
      while (p != part && take(p, false)) {
      }
    }
  });
}

}  // namespace thermocline
