#include "server/scheduler.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "server/errors.h"
#include "spdlog/spdlog.h"

namespace thermocline::server {

Scheduler::Scheduler(const ServerConfig& config, Metrics* metrics)
    : config_(config), metrics_(metrics) {}

Scheduler::~Scheduler() { Shutdown(); }

absl::Status Scheduler::Start(const ModelRegistry& registry) {
  DecodeLoopOptions options;
  options.threads = config_.threads_per_slot;
  options.decode_delay_ms = config_.decode_delay_ms;
  options.prefill_delay_ms = config_.prefill_delay_ms;
  options.prompt_cache = config_.prompt_cache;
  std::vector<std::unique_ptr<DecodeLoop>> loops;
  for (int s = 0; s < config_.slots; ++s) {
    auto loop = std::make_unique<DecodeLoop>(options, metrics_);
    for (const ServedModel* m : registry.models()) {
      // A model not in memory gets its session on its first job.
      const std::shared_ptr<const LoadedModel> loaded = m->loaded();
      if (loaded == nullptr) continue;
      if (absl::Status st = loop->AddModel(loaded); !st.ok()) {
        return absl::Status(
            st.code(), absl::StrCat("slot ", s, ", model '", m->config.name, "': ", st.message()));
      }
    }
    loops.push_back(std::move(loop));
  }
  {
    std::lock_guard<std::mutex> lock(mu_);  // ReleaseUnloaded may run already
    loops_ = std::move(loops);
    running_.resize(config_.slots);
    last_used_.assign(config_.slots, 0);
    for (const auto& loop : loops_) loop->ReleaseUnloaded();  // unloaded while they were made
    DispatchLocked();  // jobs submitted before the slots existed
  }
  metrics_->SetSlots(config_.slots);
  for (int s = 0; s < config_.slots; ++s) threads_.emplace_back([this, s] { SlotMain(s); });
  return absl::OkStatus();
}

void Scheduler::ReleaseUnloaded() {
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& loop : loops_) loop->ReleaseUnloaded();
}

absl::Status Scheduler::Submit(std::shared_ptr<Job> job) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return Unavailable("shutting_down", "the server is shutting down");
    // Jobs that will still be waiting once every idle slot has taken one (the queue may hold
    // jobs an idle slot has not popped yet).
    int idle = 0;
    for (const auto& r : running_) idle += r == nullptr;
    const int waiting = static_cast<int>(queue_.size()) + 1 - idle;
    if (waiting > config_.queue) {
      metrics_->CountRejection();
      return Unavailable("queue_full",
                         absl::StrCat("all ", config_.slots, " slots are busy and ", config_.queue,
                                      " requests are already waiting; retry later"));
    }
    queue_.push_back(std::move(job));
    metrics_->SetQueueDepth(static_cast<int64_t>(queue_.size()));
    DispatchLocked();
  }
  wake_.notify_all();  // the slot that got it, which need not be the first waiting
  return absl::OkStatus();
}

void Scheduler::DispatchLocked() {
  const int n = static_cast<int>(running_.size());
  while (!queue_.empty()) {
    const Job& job = *queue_.front();
    int best = -1;
    int64_t best_shared = -1;  // 0 for slots the job does not continue
    for (int s = 0; s < n; ++s) {
      if (running_[s] != nullptr) continue;
      const DecodeLoop::PrefixMatch m = loops_[s]->CachedPrefix(*job.model, job.request.prompt);
      const int64_t n_prompt = static_cast<int64_t>(job.request.prompt.size());
      const bool continues = 2 * m.shared >= m.held || 2 * m.shared >= n_prompt;
      const int64_t shared = m.shared > 0 && continues ? m.shared : 0;
      if (shared > best_shared || (shared == best_shared && last_used_[s] < last_used_[best])) {
        best = s;
        best_shared = shared;
      }
    }
    if (best < 0) break;  // every slot is busy
    running_[best] = std::move(queue_.front());
    queue_.pop_front();
    last_used_[best] = ++use_clock_;
    metrics_->AddBusySlots(1);
  }
  metrics_->SetQueueDepth(static_cast<int64_t>(queue_.size()));
}

void Scheduler::FinishUnrun(const std::shared_ptr<Job>& job, CancelReason reason) {
  job->Cancel(reason);
  metrics_->CountCancellation(reason);
  GenerationStats stats;
  stats.prompt_tokens = static_cast<int64_t>(job->request.prompt.size());
  stats.total_seconds = std::chrono::duration<double>(Clock::now() - job->arrival).count();
  stats.queue_seconds = stats.total_seconds;
  job->sink->OnFinish(StopReason::kCancelled, reason, stats, absl::OkStatus());
}

void Scheduler::Cancel(const std::shared_ptr<Job>& job, CancelReason reason) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = std::find(queue_.begin(), queue_.end(), job);
    if (it == queue_.end()) {
      job->Cancel(reason);  // running (the loop stops after this token) or already finished
      return;
    }
    queue_.erase(it);
    metrics_->SetQueueDepth(static_cast<int64_t>(queue_.size()));
  }
  FinishUnrun(job, reason);
}

void Scheduler::CancelAll(CancelReason reason) {
  std::deque<std::shared_ptr<Job>> queued;
  {
    std::lock_guard<std::mutex> lock(mu_);
    queued.swap(queue_);
    metrics_->SetQueueDepth(0);
    for (const auto& r : running_) {
      if (r != nullptr) r->Cancel(reason);
    }
  }
  for (const auto& job : queued) FinishUnrun(job, reason);
}

void Scheduler::Shutdown() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_ && threads_.empty()) return;
    stopping_ = true;
  }
  wake_.notify_all();
  for (std::thread& t : threads_) t.join();
  threads_.clear();
}

int Scheduler::queued() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(queue_.size());
}

int Scheduler::busy() const {
  std::lock_guard<std::mutex> lock(mu_);
  int n = 0;
  for (const auto& r : running_) n += r != nullptr;
  return n;
}

void Scheduler::SlotMain(int slot) {
  DecodeLoop& loop = *loops_[slot];
  while (true) {
    std::shared_ptr<Job> job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      wake_.wait(lock, [&] { return running_[slot] != nullptr || (stopping_ && queue_.empty()); });
      if (running_[slot] == nullptr) return;  // stopping, and the queue is drained
      job = running_[slot];
    }
    const DecodeLoop::Outcome out = loop.Run(*job);
    job->model.EndUse();  // before the client can hear the end and ask for another model
    {
      std::lock_guard<std::mutex> lock(mu_);
      running_[slot] = nullptr;
      metrics_->AddBusySlots(-1);
      DispatchLocked();  // this slot's cache may suit a waiting job best, or another idle one's
    }
    wake_.notify_all();
    // The slot is free before the client hears the end, so its next request finds it free.
    job->sink->OnFinish(out.reason, job->cancel_reason(), out.stats, out.error);
    job.reset();
  }
}

}  // namespace thermocline::server
