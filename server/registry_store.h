// The persistent model registry: one SQLite database (registry.db, WAL mode) in the daemon's
// state directory with a row per registered model — its file and identity, the registration
// options, lifecycle state and job stage, sidecar, summaries, timestamps and last error. Every
// write is committed before it returns, so a transition is durable before it is announced.
// Thread-safe (one connection behind a mutex).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "server/model_state.h"

struct sqlite3;

namespace thermocline::server {

// Who a model file is: size, modification time and a hash of its first MiB. A changed file
// (replaced, rewritten) no longer matches its registration.
struct FileIdentity {
  int64_t size = 0;
  int64_t mtime = 0;  // unix seconds
  std::string hash;   // FNV-1a 64 of the first MiB, hex
  bool operator==(const FileIdentity&) const = default;
};
// NotFound when the file is missing; FailedPrecondition when it is not a readable file.
absl::StatusOr<FileIdentity> IdentifyFile(const std::string& path);

struct ModelRecord {
  std::string name;  // primary key
  std::string path;
  FileIdentity identity;
  std::string activation;  // override; "" = from the file
  std::string corpus;      // "" = self-generated text
  int64_t profile_tokens = 0;
  // kRegistered, kProfiling, kReady, kFailed, kUnloading (a delete in progress)
  ModelState state = ModelState::kRegistered;
  std::string stage;  // last finished or current job stage
  std::string sidecar_path;
  std::string placement_json;  // "" = none
  std::string report_json;     // "" = none
  std::string last_error;
  int64_t created_at = 0;
  int64_t updated_at = 0;
  std::string gpu_memory;          // ModelConfig::gpu_memory of the registration; "" = the daemon's
  std::string gpu_layers;          // ModelConfig::gpu_layers of the registration; "" = the daemon's
  double target_ppl_increase = 0;  // SwiGLU calibration target; 0 = the daemon's
};

class RegistryStore {
 public:
  // Creates `dir` and registry.db in it when missing. The error names the path and the fix.
  static absl::StatusOr<std::unique_ptr<RegistryStore>> Open(const std::string& dir);
  ~RegistryStore();
  RegistryStore(const RegistryStore&) = delete;
  RegistryStore& operator=(const RegistryStore&) = delete;

  const std::string& dir() const { return dir_; }
  // Every row, oldest registration first.
  absl::StatusOr<std::vector<ModelRecord>> LoadAll();
  // AlreadyExists when the name is taken.
  absl::Status Insert(const ModelRecord& record);
  // Replaces the row of record.name (NotFound when there is none).
  absl::Status Update(const ModelRecord& record);
  absl::Status Delete(const std::string& name);  // NotFound

 private:
  RegistryStore(std::string dir, sqlite3* db) : dir_(std::move(dir)), db_(db) {}
  absl::Status Exec(const char* sql);
  absl::Status Write(const ModelRecord& record, bool insert);

  std::string dir_;
  std::mutex mu_;
  sqlite3* db_;
};

}  // namespace thermocline::server
