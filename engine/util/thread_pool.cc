#include "engine/util/thread_pool.h"

#include <algorithm>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define THERMOCLINE_PAUSE() _mm_pause()
#else
#define THERMOCLINE_PAUSE() std::this_thread::yield()
#endif

namespace thermocline {
namespace {
// A worker spins (then yields) this many iterations, a few hundred microseconds, before it
// sleeps: long enough to stay awake between the parallel sections of one token.
constexpr int kSpinIterations = 1 << 14;
// The caller spins this long for the workers to finish before it starts yielding its core.
constexpr int kWaitSpinIterations = 1 << 12;
}  // namespace

ThreadPool::ThreadPool(int n_threads) : n_threads_(std::max(1, n_threads)) {
  workers_.reserve(n_threads_ - 1);
  for (int i = 1; i < n_threads_; ++i) workers_.emplace_back([this, i] { WorkerLoop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(sleep_mutex_);
    stop_.store(true, std::memory_order_release);
    generation_.fetch_add(1, std::memory_order_acq_rel);
  }
  wake_.notify_all();
  for (std::thread& t : workers_) t.join();
}

int ThreadPool::DefaultThreads() {
  const unsigned n = std::thread::hardware_concurrency();
  return n == 0 ? 1 : static_cast<int>(n);
}

void ThreadPool::RunImpl(Trampoline fn, void* ctx) {
  if (n_threads_ == 1) {
    fn(ctx, 0);
    return;
  }
  task_ = fn;
  task_ctx_ = ctx;
  pending_.store(n_threads_ - 1, std::memory_order_relaxed);
  {
    // The generation bump is what publishes task_; sleepers need the lock to not miss it.
    // generation_ and sleepers_ form a store-then-load handshake with WorkerLoop: both sides
    // need sequential consistency so that one of them sees the other's store.
    if (sleepers_.load(std::memory_order_seq_cst) > 0) {
      std::lock_guard<std::mutex> lock(sleep_mutex_);
      generation_.fetch_add(1, std::memory_order_seq_cst);
      wake_.notify_all();
    } else {
      generation_.fetch_add(1, std::memory_order_seq_cst);
      if (sleepers_.load(std::memory_order_seq_cst) > 0) {
        std::lock_guard<std::mutex> lock(sleep_mutex_);
        wake_.notify_all();
      }
    }
  }
  fn(ctx, 0);
  // Spin first (the workers usually finish within microseconds); then yield, so that on a
  // machine with more runnable threads than cores a descheduled worker gets the core back
  // instead of waiting out our time slice.
  for (int spin = 0; pending_.load(std::memory_order_acquire) != 0; ++spin) {
    if (spin < kWaitSpinIterations) {
      THERMOCLINE_PAUSE();
    } else {
      std::this_thread::yield();
    }
  }
}

void ThreadPool::WorkerLoop(int index) {
  uint64_t seen = 0;
  for (;;) {
    uint64_t gen = generation_.load(std::memory_order_acquire);
    for (int spin = 0; gen == seen && spin < kSpinIterations; ++spin) {
      if (spin < kWaitSpinIterations) {
        THERMOCLINE_PAUSE();
      } else {
        std::this_thread::yield();
      }
      gen = generation_.load(std::memory_order_acquire);
    }
    if (gen == seen) {
      std::unique_lock<std::mutex> lock(sleep_mutex_);
      sleepers_.fetch_add(1, std::memory_order_seq_cst);
      wake_.wait(lock, [&] { return generation_.load(std::memory_order_seq_cst) != seen; });
      sleepers_.fetch_sub(1, std::memory_order_acq_rel);
      gen = generation_.load(std::memory_order_acquire);
    }
    seen = gen;
    if (stop_.load(std::memory_order_acquire)) return;
    task_(task_ctx_, index);
    pending_.fetch_sub(1, std::memory_order_acq_rel);
  }
}

}  // namespace thermocline
