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

}  // namespace thermocline
