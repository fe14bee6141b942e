// The model admin (server/model_admin.h) over the persistent registry (registry_store.h), the
// served models (model_registry.h) and the background jobs (model_job.h). Registering writes
// the row, adds the model to the registry (served dense, loaded on its first request) and
// queues its job; a finished job switches the model to sparse. At start-up the rows come back:
// ready models with their sidecar, interrupted jobs queued again (they resume after their last
// finished stage), models half-deleted finished off. `jobs` worker threads run the queue.
// An entry's record is what the database holds: a job's transition whose write fails is not
// taken in memory either; the job stops, and the model is reported failed with why (see
// Entry::store_error) until the next start runs the job again.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "offline/solver/hardware.h"
#include "server/config.h"
#include "server/model_admin.h"
#include "server/model_registry.h"
#include "server/registry_store.h"

namespace thermocline::server {

class ModelManager : public ModelAdmin {
 public:
  // `registry` outlives the manager.
  ModelManager(const ServerConfig& config, ModelRegistry* registry,
               std::unique_ptr<RegistryStore> store);
  ~ModelManager() override;  // Stop()

  // Restores the registered models into the registry and starts the job workers.
  absl::Status Start();
  // Cancels the running jobs (they stay resumable) and joins the workers.
  void Stop();

  absl::StatusOr<ModelInfo> Register(const RegisterSpec& spec) override;
  absl::StatusOr<ModelInfo> Get(std::string_view name) override;
  std::vector<ModelInfo> List() override;
  absl::Status Delete(std::string_view name) override;
  absl::Status Cancel(std::string_view name) override;
  absl::StatusOr<ModelInfo> WaitForChange(std::string_view name, int64_t after_version,
                                          std::chrono::milliseconds timeout) override;

 private:
  struct Entry {
    uint64_t id = 0;  // distinguishes a re-registered name from the old one
    ModelRecord record;
    double percent = 0;
    double eta_s = -1;
    int64_t version = 0;
    bool queued = false, running = false;
    std::shared_ptr<std::atomic<bool>> cancel;
    std::chrono::steady_clock::time_point job_start;
    // What of the job's last transition is not in the database, and why (a full disk): the
    // admin API reports the model failed with it, over the record (which keeps what is stored).
    // "" when none.
    std::string store_error;
  };
  class Observer;

  ModelInfo InfoLocked(const Entry& e) const;
  void BumpLocked(Entry& e);             // new version, wake watchers
  absl::Status PersistLocked(Entry& e);  // updated_at, store write
  // A job's transition: `next` becomes e's record once it is stored; when the write fails the
  // record stays as stored and e.store_error says what could not be stored (`what`). True when
  // stored.
  bool CommitJobLocked(Entry& e, ModelRecord next, std::string_view what);
  void QueueLocked(Entry& e);
  Entry* FindLocked(std::string_view name);
  void WorkerMain();
  void RunJob(const std::string& name, uint64_t id);
  void RemoveArtefacts(const std::string& name);
  std::string JobDir(const std::string& name) const;

  const ServerConfig& config_;
  ModelRegistry* registry_;
  std::unique_ptr<RegistryStore> store_;
  std::mutex hardware_mu_;  // measured once, by the first job
  offline::HardwareProfile hardware_;
  bool have_hardware_ = false;

  std::mutex mu_;
  std::condition_variable changed_;  // any entry's version, or the queue
  std::map<std::string, Entry, std::less<>> entries_;
  std::deque<std::pair<std::string, uint64_t>> queue_;
  // Names deleted whose row could not be removed (a full disk): it says unloading, so start-up
  // removes it; a registration of the name removes it first.
  std::set<std::string, std::less<>> undeleted_rows_;
  uint64_t next_id_ = 1;
  int64_t version_ = 0;
  bool stopping_ = false;
  std::vector<std::thread> workers_;
};

}  // namespace thermocline::server
