// Tests for engine/util/thread_pool: every index runs exactly once, ParallelFor and
// ParallelShares cover [0, n) exactly once (ParallelShares running each share in order before
// taking others' blocks), back-to-back runs (with and without idle gaps) never lose a wake-up,
// and the destructor joins. A lost wake-up would hang, so the long tests run under a watchdog that
// aborts with a message instead.
#include "engine/util/thread_pool.h"

#include <atomic>
#include <catch2/catch.hpp>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace thermocline {
namespace {

using std::chrono::milliseconds;

// Aborts the process if not destroyed within `limit`: a hung Run() cannot be recovered from.
class Watchdog {
 public:
  Watchdog(std::string what, std::chrono::seconds limit)
      : what_(std::move(what)), thread_([this, limit] {
          std::unique_lock<std::mutex> lock(mutex_);
          if (!done_cv_.wait_for(lock, limit, [this] { return done_; })) {
            std::fprintf(stderr, "thread_pool_test: '%s' hung for %llds (a lost wake-up?)\n",
                         what_.c_str(), static_cast<long long>(limit.count()));
            std::abort();
          }
        }) {}
  ~Watchdog() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      done_ = true;
    }
    done_cv_.notify_one();
    thread_.join();
  }

 private:
  std::string what_;
  std::mutex mutex_;
  std::condition_variable done_cv_;
  bool done_ = false;
  std::thread thread_;  // last: starts after the members it uses
};

// Runs fn over the pool's parts; checks each part in [0, size) ran exactly once. Which thread
// runs a part is the pool's choice (the caller claims parts first, and takes over the parts of
// workers the OS has not scheduled), so only once-ness is asserted.
void CheckOneRun(ThreadPool& pool) {
  const int n = pool.size();
  std::vector<int> calls(n, 0);  // plain ints: Run's return must publish the workers' writes
  std::atomic<int> out_of_range{0};
  pool.Run([&](int part) {
    if (part < 0 || part >= n) {
      out_of_range.fetch_add(1);
      return;
    }
    ++calls[part];
  });
  CHECK(out_of_range.load() == 0);
  for (int t = 0; t < n; ++t) {
    INFO("pool of " << n << ", part " << t);
    CHECK(calls[t] == 1);
  }
}

TEST_CASE("ThreadPool::Run calls every part exactly once", "[thread_pool]") {
  for (int n : {1, 2, 3, 4, 8}) {
    ThreadPool pool(n);
    CHECK(pool.size() == n);
    for (int run = 0; run < 20; ++run) CheckOneRun(pool);
  }
  CHECK(ThreadPool(0).size() == 1);  // clamped: the caller always takes part
  CHECK(ThreadPool(-3).size() == 1);
  CHECK(ThreadPool::DefaultThreads() >= 1);
}

TEST_CASE("ThreadPool::Run sees the caller's writes and publishes the workers'", "[thread_pool]") {
  ThreadPool pool(4);
  std::vector<int64_t> input(4), output(4);
  for (int run = 0; run < 1000; ++run) {
    for (int t = 0; t < 4; ++t) input[t] = run * 10 + t;
    pool.Run([&](int thread) { output[thread] = input[thread] * 2; });
    for (int t = 0; t < 4; ++t) REQUIRE(output[t] == (run * 10 + t) * 2);
  }
}

TEST_CASE("ThreadPool::ParallelFor covers [0, n) exactly once", "[thread_pool]") {
  for (int threads : {1, 2, 3, 4, 7}) {
    ThreadPool pool(threads);
    for (int64_t n : {0, 1, 2, 3, 5, 63, 64, 65, 100, 1000, 4097}) {
      for (int64_t grain : {1, 2, 3, 16, 64, 1000, 5000}) {
        INFO(threads << " threads, n " << n << ", grain " << grain);
        std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
        std::vector<std::atomic<int>> chunks_per_thread(threads);
        std::atomic<int> bad_calls{0};
        pool.ParallelFor(n, grain, [&](int thread, int64_t begin, int64_t end) {
          // A chunk is non-empty, inside [0, n) and starts on a multiple of grain.
          if (thread < 0 || thread >= threads || begin < 0 || begin >= end || end > n ||
              begin % grain != 0) {
            bad_calls.fetch_add(1);
            return;
          }
          chunks_per_thread[thread].fetch_add(1);
          for (int64_t i = begin; i < end; ++i) hits[i].fetch_add(1);
        });
        CHECK(bad_calls.load() == 0);
        int64_t not_once = 0;
        for (const auto& h : hits) not_once += h.load() != 1;
        CHECK(not_once == 0);
        for (const auto& c : chunks_per_thread) CHECK(c.load() <= 1);  // one contiguous chunk
      }
    }
  }
}

TEST_CASE("ThreadPool::ParallelShares runs every block of [0, n) exactly once", "[thread_pool]") {
  // 70 threads: more than the 64 shares, so six parts only take blocks from others' shares.
  for (int threads : {1, 2, 3, 4, 7, 70}) {
    ThreadPool pool(threads);
    for (int64_t n : {0, 1, 2, 3, 5, 63, 64, 65, 100, 1000, 4097}) {
      for (int64_t block : {1, 2, 3, 16, 64, 1000, 5000}) {
        INFO(threads << " threads, n " << n << ", block " << block);
        std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
        std::atomic<int> bad_calls{0};
        pool.ParallelShares(n, block, [&](int64_t begin, int64_t end) {
          // One block: starts on a multiple of `block`, `block` long or up to n.
          if (begin < 0 || begin >= n || begin % block != 0 || end != std::min(n, begin + block)) {
            bad_calls.fetch_add(1);
            return;
          }
          for (int64_t i = begin; i < end; ++i) hits[i].fetch_add(1);
        });
        CHECK(bad_calls.load() == 0);
        int64_t not_once = 0;
        for (const auto& h : hits) not_once += h.load() != 1;
        CHECK(not_once == 0);
      }
    }
  }
}

TEST_CASE("ThreadPool::ParallelShares: each thread streams its share, then takes the others' ends",
          "[thread_pool]") {
  // 2 threads, 64 blocks: shares [0, 32) and [32, 64). Each thread runs a share front to back
  // (consecutive ascending blocks from the share's start), then only blocks taken from the back
  // of the other share (descending). The worker thread is slowed down (1 ms a block), so the
  // caller, done with its share in microseconds, must take some of the worker's.
  ThreadPool pool(2);
  constexpr int64_t kBlocks = 64;
  const std::thread::id caller = std::this_thread::get_id();
  std::mutex mutex;
  std::vector<int64_t> by_caller, by_worker;
  Watchdog watchdog("ParallelShares with a slow worker", std::chrono::seconds(60));
  pool.ParallelShares(kBlocks, 1, [&](int64_t begin, int64_t) {
    const bool on_caller = std::this_thread::get_id() == caller;
    if (!on_caller) std::this_thread::sleep_for(milliseconds(1));
    std::lock_guard<std::mutex> lock(mutex);
    (on_caller ? by_caller : by_worker).push_back(begin);
  });
  CHECK(by_caller.size() + by_worker.size() == kBlocks);
  CHECK(by_caller.size() > static_cast<size_t>(kBlocks / 2));  // it took from the worker's share
  for (const std::vector<int64_t>* seq : {&by_caller, &by_worker}) {
    if (seq->empty()) continue;
    INFO("blocks run by the " << (seq == &by_caller ? "caller" : "worker"));
    const int64_t start = (*seq)[0];
    CHECK((start == 0 || start == kBlocks / 2));  // its own share's front
    size_t i = 1;
    while (i < seq->size() && (*seq)[i] == (*seq)[i - 1] + 1) ++i;  // its share, in order
    CHECK((*seq)[i - 1] < start + kBlocks / 2);
    for (size_t j = i; j < seq->size(); ++j) {  // then the other share's back, descending
      CHECK(((*seq)[j] < start || (*seq)[j] >= start + kBlocks / 2));
      if (j > i) CHECK((*seq)[j] < (*seq)[j - 1]);
    }
  }
}

TEST_CASE("ThreadPool survives 10000 back-to-back runs", "[thread_pool]") {
  Watchdog watchdog("10000 back-to-back runs", std::chrono::seconds(120));
  for (int threads : {2, 4}) {
    ThreadPool pool(threads);
    std::atomic<int64_t> calls{0};
    for (int run = 0; run < 10000; ++run) {
      pool.Run([&](int) { calls.fetch_add(1, std::memory_order_relaxed); });
    }
    CHECK(calls.load() == int64_t{10000} * threads);

    // Through ParallelFor, checking a sum each time.
    int64_t wrong = 0;
    for (int run = 0; run < 1000; ++run) {
      std::atomic<int64_t> sum{0};
      pool.ParallelFor(100, 8, [&](int, int64_t begin, int64_t end) {
        int64_t s = 0;
        for (int64_t i = begin; i < end; ++i) s += i;
        sum.fetch_add(s);
      });
      wrong += sum.load() != 4950;
    }
    CHECK(wrong == 0);
  }
}

TEST_CASE("ThreadPool wakes workers that went to sleep between runs", "[thread_pool]") {
  // Workers spin for a while after a run, then sleep on a condition variable. Idle gaps of
  // 0-6 ms land on both sides of that switch and around it, where a wake-up could be lost.
  Watchdog watchdog("runs with idle gaps", std::chrono::seconds(180));
  std::mt19937 rng(12345);
  std::uniform_int_distribution<int> gap_us(0, 6000);
  for (int threads : {2, 4}) {
    ThreadPool pool(threads);
    std::atomic<int64_t> calls{0};
    int64_t runs = 0;
    for (int run = 0; run < 10000; ++run) {
      if (run % 50 == 0) {
        std::this_thread::sleep_for(milliseconds(5));
      } else if (run % 50 < 5) {
        std::this_thread::sleep_for(std::chrono::microseconds(gap_us(rng)));
      }
      pool.Run([&](int) { calls.fetch_add(1, std::memory_order_relaxed); });
      ++runs;
    }
    CHECK(calls.load() == runs * threads);
  }
}

TEST_CASE("ThreadPool's destructor joins, whatever the workers are doing", "[thread_pool]") {
  Watchdog watchdog("pool construction and destruction", std::chrono::seconds(120));
  for (int i = 0; i < 200; ++i) {
    ThreadPool never_ran(1 + i % 8);  // workers may not even have started
  }
  for (int i = 0; i < 200; ++i) {
    ThreadPool just_ran(1 + i % 8);  // workers still spinning
    CheckOneRun(just_ran);
  }
  for (int i = 0; i < 10; ++i) {
    ThreadPool sleeping(4);
    CheckOneRun(sleeping);
    std::this_thread::sleep_for(milliseconds(20));  // workers asleep on the condition variable
  }
  SUCCEED("every pool joined");
}

}  // namespace
}  // namespace thermocline
