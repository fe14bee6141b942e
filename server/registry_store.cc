#include "server/registry_store.h"

#include <fcntl.h>
#include <sqlite3.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "nlohmann/json.hpp"
#include "server/errors.h"
#include "spdlog/spdlog.h"

namespace thermocline::server {
namespace {

// 2: gpu_memory and gpu_layers (the registration's GPU options).
// 3: target_ppl_increase (the registration's perplexity target).
constexpr int kSchemaVersion = 3;
constexpr char kSchema[] = R"sql(
CREATE TABLE IF NOT EXISTS models (
  name TEXT PRIMARY KEY NOT NULL,
  path TEXT NOT NULL,
  file_size INTEGER NOT NULL,
  file_mtime INTEGER NOT NULL,
  file_hash TEXT NOT NULL,
  activation TEXT NOT NULL,
  corpus TEXT NOT NULL,
  profile_tokens INTEGER NOT NULL,
  state TEXT NOT NULL,
  stage TEXT NOT NULL,
  sidecar_path TEXT NOT NULL,
  placement_json TEXT NOT NULL,
  report_json TEXT NOT NULL,
  last_error TEXT NOT NULL,
  created_at INTEGER NOT NULL,
  updated_at INTEGER NOT NULL,
  gpu_memory TEXT NOT NULL DEFAULT '',
  gpu_layers TEXT NOT NULL DEFAULT '',
  target_ppl_increase REAL NOT NULL DEFAULT 0
);
)sql";
constexpr char kAddGpuColumns[] =
    "ALTER TABLE models ADD COLUMN gpu_memory TEXT NOT NULL DEFAULT '';"
    "ALTER TABLE models ADD COLUMN gpu_layers TEXT NOT NULL DEFAULT '';";
constexpr char kAddPplColumn[] =
    "ALTER TABLE models ADD COLUMN target_ppl_increase REAL NOT NULL DEFAULT 0;";
constexpr char kColumns[] =
    "name, path, file_size, file_mtime, file_hash, activation, corpus, profile_tokens, state, "
    "stage, sidecar_path, placement_json, report_json, last_error, created_at, updated_at, "
    "gpu_memory, gpu_layers, target_ppl_increase";

// Storage failures (a full disk, a read-only or vanished state directory, a lock held too long)
// are the machine's state, not a bug: 503 registry_unavailable with what to fix. Others are
// internal errors.
absl::Status SqlError(sqlite3* db, const std::string& what) {
  const int rc = sqlite3_errcode(db) & 0xff;
  const std::string detail = sqlite3_errmsg(db);
  const char* hint = nullptr;
  switch (rc) {
    case SQLITE_FULL:
      hint = "the disk of the state directory is full: free space";
      break;
    case SQLITE_READONLY:
    case SQLITE_PERM:
    case SQLITE_CANTOPEN:
      hint = "the state directory is not writable: check its permissions and mount";
      break;
    case SQLITE_IOERR:
      hint = "the state directory cannot be written (disk full, file size limit or I/O error)";
      break;
    case SQLITE_BUSY:
    case SQLITE_LOCKED:
      hint = "another process holds the registry database; retry";
      break;
    default:
      break;
  }
  if (hint == nullptr) {
    return absl::InternalError(absl::StrCat("registry database: ", what, ": ", detail));
  }
  return Unavailable("registry_unavailable",
                     absl::StrCat("the model registry cannot be written (", what, ": ", detail,
                                  "): ", hint, "; nothing was changed"));
}

// Names become directory names under the state directory: a row that is not a valid name (a
// hand-edited or corrupt database) must never reach a path.
bool PlainName(const std::string& name) {
  if (name.empty() || name.size() > 64 || name.front() == '.') return false;
  for (char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '_' || c == '-' || c == ':';
    if (!ok) return false;
  }
  return true;
}

bool ValidJsonOrEmpty(const std::string& text) {
  return text.empty() || nlohmann::json::accept(text);
}

// A registry.db of zero bytes opens as an empty database, and every registration would be
// forgotten without a word: it is kept aside (with its WAL, which may hold the rows) and the
// daemon says so loudly.
void SetAsideEmptyDatabase(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode) || st.st_size != 0) return;
  const std::string backup = absl::StrCat(path, ".empty-", static_cast<int64_t>(::time(nullptr)));
  std::error_code ec;
  std::filesystem::rename(path, backup, ec);
  for (const char* suffix : {"-wal", "-shm"}) {
    if (std::filesystem::exists(path + suffix, ec)) {
      std::filesystem::rename(path + suffix, backup + suffix, ec);
    }
  }
  spdlog::error(
      "{} was empty (0 bytes): the registered models it held are lost or in its WAL; it is kept "
      "as {} (with any -wal file) and the registry starts empty. Restore a backup of the state "
      "directory to get them back.",
      path, backup);
}

// Finalizes on scope exit.
struct Statement {
  sqlite3_stmt* stmt = nullptr;
  ~Statement() { sqlite3_finalize(stmt); }
};

std::string ColumnText(sqlite3_stmt* s, int i) {
  const unsigned char* t = sqlite3_column_text(s, i);
  return t == nullptr ? "" : reinterpret_cast<const char*>(t);
}

}  // namespace

absl::StatusOr<FileIdentity> IdentifyFile(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    return absl::NotFoundError(absl::StrCat(
        "model file ", path, " does not exist (or is not accessible); check the path"));
  }
  if (!S_ISREG(st.st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat(path, " is not a regular file"));
  }
  // Non-blocking, and the type checked again on what was opened: a FIFO put in the file's place
  // meanwhile would block open() and read() for ever.
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
  if (fd < 0) return absl::FailedPreconditionError(absl::StrCat("cannot read ", path));
  struct FdCloser {
    int fd;
    ~FdCloser() { ::close(fd); }
  } closer{fd};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat(path, " is not a regular file"));
  }
  std::vector<char> buf(1 << 20);
  size_t n = 0;
  while (n < buf.size()) {
    const ssize_t got = ::read(fd, buf.data() + n, buf.size() - n);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) return absl::FailedPreconditionError(absl::StrCat("cannot read ", path));
    if (got == 0) break;
    n += static_cast<size_t>(got);
  }
  uint64_t h = 14695981039346656037ull;
  for (size_t i = 0; i < n; ++i) {
    h ^= static_cast<unsigned char>(buf[i]);
    h *= 1099511628211ull;
  }
  FileIdentity id;
  id.size = static_cast<int64_t>(st.st_size);
  id.mtime = static_cast<int64_t>(st.st_mtime);
  id.hash = absl::StrFormat("%016x", h);
  return id;
}

absl::StatusOr<std::unique_ptr<RegistryStore>> RegistryStore::Open(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot create the state directory ", dir, ": ", ec.message(),
                     "; set another with --state-dir or [registry] state_dir"));
  }
  const std::string path = (std::filesystem::path(dir) / "registry.db").string();
  SetAsideEmptyDatabase(path);
  sqlite3* db = nullptr;
  if (sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, nullptr) !=
      SQLITE_OK) {
    absl::Status s = absl::FailedPreconditionError(
        absl::StrCat("cannot open ", path, ": ", db ? sqlite3_errmsg(db) : "out of memory",
                     "; check the permissions or set another --state-dir"));
    sqlite3_close(db);
    return s;
  }
  auto store = std::unique_ptr<RegistryStore>(new RegistryStore(dir, db));
  sqlite3_busy_timeout(db, 5000);  // another daemon on the same state dir
  for (const char* sql : {"PRAGMA journal_mode=WAL;", "PRAGMA synchronous=FULL;", kSchema}) {
    if (absl::Status s = store->Exec(sql); !s.ok()) return s;
  }
  Statement v;
  sqlite3_prepare_v2(db, "PRAGMA user_version;", -1, &v.stmt, nullptr);
  const int version = sqlite3_step(v.stmt) == SQLITE_ROW ? sqlite3_column_int(v.stmt, 0) : 0;
  if (version > kSchemaVersion) {
    return absl::FailedPreconditionError(absl::StrCat(
        path, " was written by a newer thermocline (schema ", version, "); upgrade thermocline"));
  }
  if (version == 1) {
    if (absl::Status s = store->Exec(kAddGpuColumns); !s.ok()) return s;
  }
  if (version == 1 || version == 2) {
    if (absl::Status s = store->Exec(kAddPplColumn); !s.ok()) return s;
  }
  if (version < kSchemaVersion) {
    if (absl::Status s =
            store->Exec(absl::StrCat("PRAGMA user_version=", kSchemaVersion, ";").c_str());
        !s.ok()) {
      return s;
    }
  }
  return store;
}

RegistryStore::~RegistryStore() { sqlite3_close(db_); }

absl::Status RegistryStore::Exec(const char* sql) {
  char* err = nullptr;
  if (sqlite3_exec(db_, sql, nullptr, nullptr, &err) != SQLITE_OK) {
    sqlite3_free(err);
    return SqlError(db_, "setting it up");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<ModelRecord>> RegistryStore::LoadAll() {
  std::lock_guard<std::mutex> lock(mu_);
  Statement s;
  const std::string sql =
      absl::StrCat("SELECT ", kColumns, " FROM models ORDER BY created_at, rowid;");
  if (sqlite3_prepare_v2(db_, sql.c_str(), -1, &s.stmt, nullptr) != SQLITE_OK) {
    return SqlError(db_, "reading the models");
  }
  std::vector<ModelRecord> out;
  int rc;
  while ((rc = sqlite3_step(s.stmt)) == SQLITE_ROW) {
    ModelRecord r;
    int i = 0;
    r.name = ColumnText(s.stmt, i++);
    r.path = ColumnText(s.stmt, i++);
    r.identity.size = sqlite3_column_int64(s.stmt, i++);
    r.identity.mtime = sqlite3_column_int64(s.stmt, i++);
    r.identity.hash = ColumnText(s.stmt, i++);
    r.activation = ColumnText(s.stmt, i++);
    r.corpus = ColumnText(s.stmt, i++);
    r.profile_tokens = sqlite3_column_int64(s.stmt, i++);
    const std::string state = ColumnText(s.stmt, i++);
    // A state this build does not know (a hand-edited row) is shown as failed, with why.
    r.state = ParseModelState(state).value_or(ModelState::kFailed);
    r.stage = ColumnText(s.stmt, i++);
    r.sidecar_path = ColumnText(s.stmt, i++);
    r.placement_json = ColumnText(s.stmt, i++);
    r.report_json = ColumnText(s.stmt, i++);
    r.last_error = ColumnText(s.stmt, i++);
    r.created_at = sqlite3_column_int64(s.stmt, i++);
    r.updated_at = sqlite3_column_int64(s.stmt, i++);
    r.gpu_memory = ColumnText(s.stmt, i++);
    r.gpu_layers = ColumnText(s.stmt, i++);
    r.target_ppl_increase = sqlite3_column_double(s.stmt, i++);
    if (!ParseModelState(state)) {
      r.last_error = absl::StrCat("registry.db holds an unknown state '", state, "'");
    }
    if (!PlainName(r.name)) {
      spdlog::error("registry: ignoring a row whose name is not a plain model name: '{}'",
                    r.name.substr(0, 80));
      continue;
    }
    for (auto [field, text] :
         {std::pair{"placement_json", &r.placement_json}, {"report_json", &r.report_json}}) {
      if (!ValidJsonOrEmpty(*text)) {
        spdlog::warn("registry: model '{}': its {} is not JSON; dropped", r.name, field);
        text->clear();
      }
    }
    out.push_back(std::move(r));
  }
  if (rc != SQLITE_DONE) return SqlError(db_, "reading the models");
  return out;
}

absl::Status RegistryStore::Write(const ModelRecord& r, bool insert) {
  std::lock_guard<std::mutex> lock(mu_);
  Statement s;
  const std::string sql =
      insert ? absl::StrCat("INSERT INTO models (", kColumns,
                            ") VALUES (?1,?2,?3,?4,?5,?6,?7,?8,?9,?10,?11,?12,?13,?14,?15,?16,?17,"
                            "?18,?19);")
             : std::string(
                   "UPDATE models SET path=?2, file_size=?3, file_mtime=?4, file_hash=?5, "
                   "activation=?6, corpus=?7, profile_tokens=?8, state=?9, stage=?10, "
                   "sidecar_path=?11, placement_json=?12, report_json=?13, last_error=?14, "
                   "created_at=?15, updated_at=?16, gpu_memory=?17, gpu_layers=?18, "
                   "target_ppl_increase=?19 WHERE name=?1;");
  if (sqlite3_prepare_v2(db_, sql.c_str(), -1, &s.stmt, nullptr) != SQLITE_OK) {
    return SqlError(db_, "preparing a write");
  }
  int i = 1;
  auto text = [&](const std::string& v) {
    sqlite3_bind_text(s.stmt, i++, v.data(), static_cast<int>(v.size()), SQLITE_TRANSIENT);
  };
  auto integer = [&](int64_t v) { sqlite3_bind_int64(s.stmt, i++, v); };
  text(r.name);
  text(r.path);
  integer(r.identity.size);
  integer(r.identity.mtime);
  text(r.identity.hash);
  text(r.activation);
  text(r.corpus);
  integer(r.profile_tokens);
  text(ModelStateName(r.state));
  text(r.stage);
  text(r.sidecar_path);
  text(r.placement_json);
  text(r.report_json);
  text(r.last_error);
  integer(r.created_at);
  integer(r.updated_at);
  text(r.gpu_memory);
  text(r.gpu_layers);
  sqlite3_bind_double(s.stmt, i++, r.target_ppl_increase);
  const int rc = sqlite3_step(s.stmt);
  if (insert && rc == SQLITE_CONSTRAINT) {
    return absl::AlreadyExistsError(absl::StrCat("a model named '", r.name, "' already exists"));
  }
  if (rc != SQLITE_DONE) return SqlError(db_, absl::StrCat("writing model '", r.name, "'"));
  if (!insert && sqlite3_changes(db_) == 0) {
    return absl::NotFoundError(absl::StrCat("model '", r.name, "' is not in the registry"));
  }
  return absl::OkStatus();
}

absl::Status RegistryStore::Insert(const ModelRecord& record) { return Write(record, true); }
absl::Status RegistryStore::Update(const ModelRecord& record) { return Write(record, false); }

absl::Status RegistryStore::Delete(const std::string& name) {
  std::lock_guard<std::mutex> lock(mu_);
  Statement s;
  if (sqlite3_prepare_v2(db_, "DELETE FROM models WHERE name=?1;", -1, &s.stmt, nullptr) !=
      SQLITE_OK) {
    return SqlError(db_, "preparing a delete");
  }
  sqlite3_bind_text(s.stmt, 1, name.data(), static_cast<int>(name.size()), SQLITE_TRANSIENT);
  if (sqlite3_step(s.stmt) != SQLITE_DONE) {
    return SqlError(db_, absl::StrCat("deleting model '", name, "'"));
  }
  if (sqlite3_changes(db_) == 0) {
    return absl::NotFoundError(absl::StrCat("model '", name, "' is not in the registry"));
  }
  return absl::OkStatus();
}

}  // namespace thermocline::server
