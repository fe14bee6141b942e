// The schedule step: a bounded FIFO queue of jobs feeding N slots. Each slot is a thread with
// its own DecodeLoop (thread pool + one KV cache per model over the shared weights). The
// scheduler decides which job runs where and when; it never touches tensors. Jobs leave the
// queue oldest first (no job waits behind a later one); each goes to the idle slot whose KV
// cache holds the longest prefix of its prompt (the prefix cache, decode_loop.h), counting only
// slots where the shared prefix is at least half of what the slot holds or of the job's prompt
// (a chat template's opening alone does not make another conversation's slot a match, and
// taking it would evict that conversation), else to the idle slot used least recently, whose
// cache is the least likely to be wanted again.
#pragma once

#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "server/config.h"
#include "server/decode_loop.h"
#include "server/job.h"
#include "server/metrics.h"
#include "server/model_registry.h"

namespace thermocline::server {

class Scheduler {
 public:
  Scheduler(const ServerConfig& config, Metrics* metrics);
  ~Scheduler();  // Shutdown()

  // Creates the slots' sessions for the ready models and starts the slot threads. Models that
  // become ready later (registered ones) get a slot's session on their first job there.
  absl::Status Start(const ModelRegistry& registry);

  // Queues a job. Unavailable("queue_full") when the queue is full, ("shutting_down") after
  // Shutdown. Once accepted, the job's sink gets OnFinish exactly once, later. Thread-safe.
  absl::Status Submit(std::shared_ptr<Job> job);
  // A queued job is removed and finished (kCancelled) on the calling thread; a running one
  // stops after its current token. Thread-safe; a finished job is left alone.
  void Cancel(const std::shared_ptr<Job>& job, CancelReason reason);
  // Cancels everything queued and running (the end of a graceful shutdown's budget).
  void CancelAll(CancelReason reason);
  // The slots drop their sessions of the models the registry has unloaded, now; a busy slot
  // drops the one its job runs on when the job ends (ModelRegistry::set_unload_listener).
  // Thread-safe.
  void ReleaseUnloaded();
  // Refuses new jobs, lets the slots finish the queue, joins the slot threads.
  void Shutdown();

  int queued() const;
  int busy() const;

 private:
  void SlotMain(int slot);
  // Hands queued jobs to idle slots as above. Under mu_; the caller wakes the slots.
  void DispatchLocked();
  void FinishUnrun(const std::shared_ptr<Job>& job, CancelReason reason);

  const ServerConfig& config_;
  Metrics* metrics_;
  std::vector<std::thread> threads_;

  mutable std::mutex mu_;
  std::vector<std::unique_ptr<DecodeLoop>> loops_;  // a slot's loop: its thread's while it runs
  std::condition_variable wake_;
  std::deque<std::shared_ptr<Job>> queue_;
  std::vector<std::shared_ptr<Job>> running_;  // per slot: its job (given or running); null: idle
  std::vector<uint64_t> last_used_;            // per slot: when it last got a job (use_clock_)
  uint64_t use_clock_ = 0;
  bool stopping_ = false;
};

}  // namespace thermocline::server
