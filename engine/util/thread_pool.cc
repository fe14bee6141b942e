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
// Pure spinning before yielding the core, for workers and for the caller's final wait.
constexpr int kPauseIterations = 1 << 12;

inline void Backoff(int spin) {
  if (spin < kPauseIterations) {
    THERMOCLINE_PAUSE();
  } else {
    std::this_thread::yield();
  }
}
}  // namespace

ThreadPool::ThreadPool(int n_threads) : n_threads_(std::max(1, n_threads)) {
  workers_.reserve(n_threads_ - 1);
  for (int i = 1; i < n_threads_; ++i) workers_.emplace_back([this, i] { WorkerLoop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(sleep_mutex_);
    stop_.store(true, std::memory_order_seq_cst);
    generation_.fetch_add(1, std::memory_order_seq_cst);
  }
  wake_.notify_all();
  for (std::thread& t : workers_) t.join();
}

int ThreadPool::DefaultThreads() {
  const unsigned n = std::thread::hardware_concurrency();
  return n == 0 ? 1 : static_cast<int>(n);
}

int ThreadPool::ClaimAndRun() {
  int ran = 0;
  uint64_t state = claim_.load(std::memory_order_acquire);
  for (;;) {
    const uint32_t part = static_cast<uint32_t>(state);
    if (part >= static_cast<uint32_t>(n_threads_)) return ran;
    if (!claim_.compare_exchange_weak(state, state + 1, std::memory_order_acq_rel,
                                      std::memory_order_acquire)) {
      continue;
    }
    // A claimed part keeps its Run (and task_) alive until done_ counts it.
    task_(task_ctx_, static_cast<int>(part));
    done_.fetch_add(1, std::memory_order_acq_rel);
    ++ran;
    state = claim_.load(std::memory_order_acquire);
  }
}

void ThreadPool::RunImpl(Trampoline fn, void* ctx) {
  if (n_threads_ == 1) {
    fn(ctx, 0);
    return;
  }
  task_ = fn;
  task_ctx_ = ctx;
  done_.store(0, std::memory_order_relaxed);
  const uint64_t gen = generation_.load(std::memory_order_relaxed) + 1;
  claim_.store(gen << 32, std::memory_order_release);
  // generation_ and sleepers_ form a store-then-load handshake with WorkerLoop: both sides
  // need sequential consistency so that one of them sees the other's store.
  if (sleepers_.load(std::memory_order_seq_cst) > 0) {
    std::lock_guard<std::mutex> lock(sleep_mutex_);
    generation_.store(gen, std::memory_order_seq_cst);
    wake_.notify_all();
  } else {
    generation_.store(gen, std::memory_order_seq_cst);
    if (sleepers_.load(std::memory_order_seq_cst) > 0) {
      std::lock_guard<std::mutex> lock(sleep_mutex_);
      wake_.notify_all();
    }
  }
  ClaimAndRun();
  // Wait for parts claimed by workers; spin first, then yield so that a worker descheduled
  // mid-part gets a core back.
  for (int spin = 0; done_.load(std::memory_order_acquire) != n_threads_; ++spin) Backoff(spin);
}

void ThreadPool::WorkerLoop(int /*index*/) {
  uint64_t seen = 0;
  for (;;) {
    uint64_t gen = generation_.load(std::memory_order_seq_cst);
    for (int spin = 0; gen == seen && spin < kSpinIterations; ++spin) {
      Backoff(spin);
      gen = generation_.load(std::memory_order_seq_cst);
    }
    if (gen == seen) {
      std::unique_lock<std::mutex> lock(sleep_mutex_);
      sleepers_.fetch_add(1, std::memory_order_seq_cst);
      wake_.wait(lock, [&] { return generation_.load(std::memory_order_seq_cst) != seen; });
      sleepers_.fetch_sub(1, std::memory_order_seq_cst);
      gen = generation_.load(std::memory_order_seq_cst);
    }
    seen = gen;
    if (stop_.load(std::memory_order_acquire)) return;
    ClaimAndRun();
  }
}

}  // namespace thermocline
