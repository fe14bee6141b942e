#include "server/config.h"

#include <toml++/toml.h>

#include <cstdlib>
#include <filesystem>
#include <limits>
#include <set>

#include "absl/strings/str_cat.h"
#include "engine/gpu/gpu_layers.h"
#include "engine/model/session.h"
#include "engine/runtime/engine.h"
#include "engine/util/byte_size.h"
#include "engine/util/thread_pool.h"
#include "offline/sparse_source.h"

namespace thermocline::server {
namespace {

absl::Status KeyError(const std::string& key, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("config key '", key, "': ", what));
}

// Reads one table's keys into typed fields; remembers which keys it consumed so that the rest
// can be reported as unknown.
class TableReader {
 public:
  TableReader(const toml::table* table, std::string prefix)
      : table_(table), prefix_(std::move(prefix)) {}

  template <typename T, typename Dst>
  void Get(const char* key, Dst* dst) {
    seen_.insert(key);
    if (!status_.ok() || table_ == nullptr) return;
    const toml::node* node = table_->get(key);
    if (node == nullptr) return;
    std::optional<T> v = node->value_exact<T>();
    if constexpr (std::is_same_v<T, double>) {
      if (!v) {
        if (auto i = node->value_exact<int64_t>()) v = static_cast<double>(*i);
      }
    }
    if (!v) {
      status_ = KeyError(prefix_ + key, "has the wrong type");
      return;
    }
    if constexpr (std::is_integral_v<Dst> && !std::is_same_v<Dst, bool>) {
      if (*v < std::numeric_limits<Dst>::min() || *v > std::numeric_limits<Dst>::max()) {
        status_ = KeyError(prefix_ + key, "is out of range");
        return;
      }
    }
    *dst = static_cast<Dst>(*v);
  }

  void GetStringList(const char* key, std::vector<std::string>* dst) {
    seen_.insert(key);
    if (!status_.ok() || table_ == nullptr) return;
    const toml::node* node = table_->get(key);
    if (node == nullptr) return;
    if (auto s = node->value_exact<std::string>()) {
      if (!s->empty()) dst->push_back(*s);
      return;
    }
    const toml::array* arr = node->as_array();
    if (arr == nullptr) {
      status_ = KeyError(prefix_ + key, "must be a string or a list of strings");
      return;
    }
    for (const toml::node& item : *arr) {
      auto s = item.value_exact<std::string>();
      if (!s) {
        status_ = KeyError(prefix_ + key, "must be a list of strings");
        return;
      }
      dst->push_back(*s);
    }
  }

  absl::Status Finish() {
    if (!status_.ok() || table_ == nullptr) return status_;
    for (const auto& [k, v] : *table_) {
      if (!seen_.count(std::string(k.str()))) {
        return KeyError(prefix_ + std::string(k.str()), "unknown key");
      }
    }
    return absl::OkStatus();
  }

 private:
  const toml::table* table_;
  std::string prefix_;
  std::set<std::string> seen_;
  absl::Status status_;
};

absl::Status ReadModels(const toml::node* node, ServerConfig* c) {
  if (node == nullptr) return absl::OkStatus();
  const toml::array* arr = node->as_array();
  if (arr == nullptr) return KeyError("models", "must be an array of tables ([[models]])");
  for (const toml::node& item : *arr) {
    const toml::table* t = item.as_table();
    if (t == nullptr) return KeyError("models", "must be an array of tables ([[models]])");
    ModelConfig m;
    TableReader r(t, "models.");
    r.Get<std::string>("path", &m.path);
    r.Get<std::string>("name", &m.name);
    r.Get<int64_t>("n_ctx", &m.n_ctx);
    r.Get<std::string>("activation", &m.activation);
    r.Get<std::string>("chat_template", &m.chat_template);
    r.Get<std::string>("sparse", &m.sparse);
    r.Get<std::string>("sidecar", &m.sidecar);
    r.Get<bool>("oracle", &m.oracle);
    r.Get<std::string>("sparse_method", &m.sparse_method);
    r.Get<double>("target_sparsity", &m.target_sparsity);
    r.Get<std::string>("gpu_memory", &m.gpu_memory);
    r.Get<std::string>("gpu_layers", &m.gpu_layers);
    r.Get<std::string>("kv_type", &m.kv_type);
    r.Get<bool>("repack", &m.repack);
    if (absl::Status s = r.Finish(); !s.ok()) return s;
    if (m.path.empty()) return KeyError("models.path", "is required");
    c->models.push_back(std::move(m));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ApplyGpuConfig(const ModelConfig& m, uint64_t* gpu_memory, int64_t* gpu_layers) {
  *gpu_memory = 0;
  *gpu_layers = kNoGpuLayers;
  if (!m.gpu_memory.empty()) {
    absl::StatusOr<int64_t> bytes = ParseByteSize(m.gpu_memory);
    if (!bytes.ok() || *bytes <= 0) {
      return KeyError("models.gpu_memory",
                      absl::StrCat("'", m.gpu_memory, "' of model '", m.name,
                                   "': use a positive byte count (8G, 512M, 1000000)"));
    }
    *gpu_memory = static_cast<uint64_t>(*bytes);
  }
  if (!m.gpu_layers.empty()) {
    absl::StatusOr<int64_t> n = gpu::ParseGpuLayers(m.gpu_layers);
    if (!n.ok()) {
      return KeyError("models.gpu_layers", absl::StrCat("'", m.gpu_layers, "' of model '", m.name,
                                                        "': use a number of layers or auto"));
    }
    *gpu_layers = *n;
  }
  return absl::OkStatus();
}

absl::Status LoadConfigFile(const std::string& path, ServerConfig* c) {
  // The packaged toml++ is built with exceptions; they stay inside this function.
  toml::table root;
  try {
    root = toml::parse_file(path);
  } catch (const toml::parse_error& err) {
    return absl::InvalidArgumentError(absl::StrCat("config ", path, ":", err.source().begin.line,
                                                   ":", err.source().begin.column, ": ",
                                                   std::string(err.description())));
  }
  for (const auto& [k, v] : root) {
    static const std::set<std::string> kSections = {"server", "scheduler", "sampling", "log",
                                                    "debug",  "models",    "registry"};
    if (!kSections.count(std::string(k.str()))) {
      return KeyError(std::string(k.str()), "unknown section");
    }
  }
  TableReader server(root["server"].as_table(), "server.");
  server.Get<std::string>("host", &c->host);
  server.Get<int64_t>("port", &c->port);
  server.Get<int64_t>("grpc_port", &c->grpc_port);
  server.GetStringList("api_keys", &c->api_keys);
  server.GetStringList("api_key", &c->api_keys);
  server.Get<int64_t>("max_body_bytes", &c->max_body_bytes);
  server.Get<int64_t>("http_threads", &c->http_threads);
  server.Get<int64_t>("read_timeout_s", &c->read_timeout_s);
  server.Get<int64_t>("write_timeout_s", &c->write_timeout_s);
  server.Get<int64_t>("header_timeout_s", &c->header_timeout_s);
  server.Get<int64_t>("body_timeout_s", &c->body_timeout_s);
  server.Get<int64_t>("keep_alive_s", &c->keep_alive_s);
  server.Get<int64_t>("max_header_bytes", &c->max_header_bytes);
  server.Get<int64_t>("max_headers", &c->max_headers);
  server.Get<int64_t>("max_connections", &c->max_connections);
  server.Get<int64_t>("max_connections_per_client", &c->max_connections_per_client);
  server.Get<int64_t>("max_inflight_bytes", &c->max_inflight_bytes);
  server.Get<int64_t>("listen_backlog", &c->listen_backlog);
  server.Get<int64_t>("max_tokenize_bytes", &c->max_tokenize_bytes);
  server.GetStringList("allowed_hosts", &c->allowed_hosts);
  server.GetStringList("cors_allowed_origins", &c->cors_allowed_origins);
  server.Get<int64_t>("shutdown_timeout_s", &c->shutdown_timeout_s);
  server.Get<std::string>("admin_key", &c->admin_key);
  if (absl::Status s = server.Finish(); !s.ok()) return s;

  TableReader sched(root["scheduler"].as_table(), "scheduler.");
  sched.Get<int64_t>("slots", &c->slots);
  sched.Get<int64_t>("queue", &c->queue);
  sched.Get<int64_t>("threads_per_slot", &c->threads_per_slot);
  sched.Get<double>("request_timeout_s", &c->request_timeout_s);
  sched.Get<int64_t>("retry_after_s", &c->retry_after_s);
  sched.Get<int64_t>("max_batch", &c->max_batch);
  sched.Get<bool>("prompt_cache", &c->prompt_cache);
  sched.Get<int64_t>("max_context", &c->max_context);
  if (absl::Status s = sched.Finish(); !s.ok()) return s;

  SamplingParams& p = c->sampling;
  TableReader samp(root["sampling"].as_table(), "sampling.");
  samp.Get<double>("temperature", &p.temperature);
  samp.Get<int64_t>("top_k", &p.top_k);
  samp.Get<double>("top_p", &p.top_p);
  samp.Get<double>("min_p", &p.min_p);
  samp.Get<double>("repeat_penalty", &p.repeat_penalty);
  samp.Get<int64_t>("penalty_last_n", &p.penalty_last_n);
  samp.Get<int64_t>("max_tokens", &c->default_max_tokens);
  samp.Get<int64_t>("max_stop_strings", &c->max_stop_strings);
  samp.Get<int64_t>("max_stop_length", &c->max_stop_length);
  samp.Get<std::string>("context_overflow", &c->context_overflow);
  if (absl::Status s = samp.Finish(); !s.ok()) return s;

  TableReader log(root["log"].as_table(), "log.");
  log.Get<std::string>("level", &c->log_level);
  log.Get<bool>("access_log", &c->access_log);
  if (absl::Status s = log.Finish(); !s.ok()) return s;

  TableReader debug(root["debug"].as_table(), "debug.");
  debug.Get<int64_t>("decode_delay_ms", &c->decode_delay_ms);
  debug.Get<int64_t>("prefill_delay_ms", &c->prefill_delay_ms);
  debug.Get<int64_t>("job_stage_delay_ms", &c->job_stage_delay_ms);
  debug.Get<int64_t>("load_delay_ms", &c->load_delay_ms);
  debug.Get<std::string>("load_delay_model", &c->load_delay_model);
  if (absl::Status s = debug.Finish(); !s.ok()) return s;

  TableReader reg(root["registry"].as_table(), "registry.");
  reg.Get<std::string>("state_dir", &c->state_dir);
  reg.Get<int64_t>("jobs", &c->jobs);
  reg.Get<int64_t>("model_memory_budget", &c->model_memory_budget);
  reg.Get<std::string>("gpu_memory", &c->gpu_memory);
  reg.Get<std::string>("gpu_layers", &c->gpu_layers);
  reg.Get<int64_t>("profile_tokens", &c->profile_tokens);
  reg.Get<double>("target_ppl_increase", &c->target_ppl_increase);
  reg.Get<bool>("speed_check", &c->speed_check);
  reg.Get<double>("solve_time_limit_s", &c->solve_time_limit_s);
  reg.Get<std::string>("hardware", &c->hardware);
  reg.GetStringList("allowed_paths", &c->allowed_paths);
  if (absl::Status s = reg.Finish(); !s.ok()) return s;

  return ReadModels(root.get("models"), c);
}

ModelConfig ParseModelFlag(const std::string& value) {
  ModelConfig m;
  const size_t eq = value.rfind('=');
  // A file whose name holds '=' is still a path.
  if (eq != std::string::npos && eq > 0 && eq + 1 < value.size() &&
      !std::filesystem::exists(value)) {
    m.path = value.substr(0, eq);
    m.name = value.substr(eq + 1);
  } else {
    m.path = value;
  }
  return m;
}

absl::Status FinalizeConfig(ServerConfig* c) {
  auto range = [](const char* key, int64_t v, int64_t lo, int64_t hi) -> absl::Status {
    if (v < lo || v > hi) {
      return KeyError(key, absl::StrCat(v, " is out of range [", lo, ", ", hi, "]"));
    }
    return absl::OkStatus();
  };
  for (absl::Status s :
       {range("server.port", c->port, 0, 65535),
        range("server.grpc_port", c->grpc_port, -1, 65535),
        range("scheduler.slots", c->slots, 1, 256),
        range("scheduler.queue", c->queue, 0, 65536),
        range("scheduler.threads_per_slot", c->threads_per_slot, 0, 1024),
        range("scheduler.max_batch", c->max_batch, 1, 4096),
        range("scheduler.max_context", c->max_context, 16, int64_t{1} << 20),
        range("server.http_threads", c->http_threads, 0, 4096),
        range("server.max_body_bytes", c->max_body_bytes, 1024, int64_t{1} << 32),
        range("server.read_timeout_s", c->read_timeout_s, 1, 86400),
        range("server.write_timeout_s", c->write_timeout_s, 1, 86400),
        range("server.shutdown_timeout_s", c->shutdown_timeout_s, 0, 86400),
        range("server.header_timeout_s", c->header_timeout_s, 1, 3600),
        range("server.body_timeout_s", c->body_timeout_s, 1, 86400),
        range("server.keep_alive_s", c->keep_alive_s, 1, 3600),
        range("server.max_header_bytes", c->max_header_bytes, 1024, 1 << 20),
        range("server.max_headers", c->max_headers, 8, 10000),
        range("server.max_connections", c->max_connections, 8, 1 << 20),
        range("server.max_connections_per_client", c->max_connections_per_client, 0, 1 << 20),
        range("server.max_inflight_bytes", c->max_inflight_bytes, 0, int64_t{1} << 40),
        range("server.listen_backlog", c->listen_backlog, 1, 65535),
        range("server.max_tokenize_bytes", c->max_tokenize_bytes, 1, int64_t{1} << 32),
        range("scheduler.retry_after_s", c->retry_after_s, 0, 86400),
        range("sampling.max_tokens", c->default_max_tokens, 0, 1 << 24),
        range("sampling.max_stop_strings", c->max_stop_strings, 0, 1024),
        range("sampling.max_stop_length", c->max_stop_length, 1, 1 << 16),
        range("debug.decode_delay_ms", c->decode_delay_ms, 0, 60000),
        range("debug.prefill_delay_ms", c->prefill_delay_ms, 0, 60000),
        range("debug.job_stage_delay_ms", c->job_stage_delay_ms, 0, 600000),
        range("debug.load_delay_ms", c->load_delay_ms, 0, 600000),
        range("registry.jobs", c->jobs, 1, 64),
        range("registry.model_memory_budget", c->model_memory_budget, 0, int64_t{1} << 50),
        range("registry.profile_tokens", c->profile_tokens, 16, int64_t{1} << 30)}) {
    if (!s.ok()) return s;
  }
  // Bounded: a deadline is converted to the clock's integer nanoseconds (TOML also writes inf).
  if (!(c->request_timeout_s >= 0 && c->request_timeout_s <= 1e7)) {
    return KeyError("scheduler.request_timeout_s", "must be in [0, 1e7] seconds (0: none)");
  }
  if (c->context_overflow != "refuse" && c->context_overflow != "truncate") {
    return KeyError("sampling.context_overflow",
                    absl::StrCat("is '", c->context_overflow, "'; it must be refuse or truncate"));
  }
  if (absl::Status s = c->sampling.Validate(); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("[sampling]: ", s.message()));
  }
  static const std::set<std::string> kLevels = {"trace", "debug",    "info", "warn",
                                                "error", "critical", "off"};
  if (!kLevels.count(c->log_level)) {
    return KeyError("log.level", "must be one of trace, debug, info, warn, error, critical, off");
  }
  if (!(c->solve_time_limit_s > 0 && c->solve_time_limit_s <= 86400)) {
    return KeyError("registry.solve_time_limit_s", "must be in (0, 86400] seconds");
  }
  if (!(c->target_ppl_increase >= 0 && c->target_ppl_increase < 10)) {
    return KeyError("registry.target_ppl_increase", "must be in [0, 10) (0.02 = +2%; 0: off)");
  }
  std::set<std::string> names;
  for (ModelConfig& m : c->models) {
    if (m.name.empty()) m.name = std::filesystem::path(m.path).stem().string();
    if (!names.insert(m.name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("two models are named '", m.name, "': give one another name (PATH=NAME)"));
    }
    if (m.sparse != "off" && m.sparse != "on" && m.sparse != "auto") {
      return KeyError("models.sparse", absl::StrCat("'", m.sparse, "': use off, on or auto"));
    }
    // The names the registry parses at load (offline/sparse_source.h), checked here already.
    if (auto method = offline::ParseSparseMethod(m.sparse_method, "value"); !method.ok()) {
      return KeyError("models.sparse_method", std::string(method.status().message()));
    }
    if (!(m.target_sparsity >= 0 && m.target_sparsity < 1)) {
      return KeyError("models.target_sparsity", "must be in [0, 1)");
    }
    if (m.n_ctx < 0 || m.n_ctx > (int64_t{1} << 20)) {
      return KeyError("models.n_ctx", "must be in [0, 1048576]");
    }
    if (KvType kv; !ParseKvType(m.kv_type, &kv)) {
      return KeyError("models.kv_type",
                      absl::StrCat("'", m.kv_type, "' of model '", m.name, "': use f16 or f32"));
    }
    uint64_t gpu_memory = 0;
    int64_t gpu_layers = 0;
    if (absl::Status s = ApplyGpuConfig(m, &gpu_memory, &gpu_layers); !s.ok()) return s;
  }
  {
    ModelConfig defaults;
    defaults.name = "(registered models)";
    defaults.gpu_memory = c->gpu_memory;
    defaults.gpu_layers = c->gpu_layers;
    uint64_t gpu_memory = 0;
    int64_t gpu_layers = 0;
    if (absl::Status s = ApplyGpuConfig(defaults, &gpu_memory, &gpu_layers); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("[registry] ", s.message()));
    }
  }
  if (c->threads_per_slot == 0) {
    c->threads_per_slot = std::max(1, ThreadPool::DefaultThreads() / c->slots);
  }
  if (c->http_threads == 0) c->http_threads = c->slots + c->queue + 8;
  if (c->max_inflight_bytes == 0) c->max_inflight_bytes = 16 * c->max_body_bytes;
  if (c->max_inflight_bytes < c->max_body_bytes) {
    return KeyError("server.max_inflight_bytes",
                    "must be at least server.max_body_bytes (one whole request)");
  }
  for (const std::string& o : c->cors_allowed_origins) {
    if (o != "*" && o.find("://") == std::string::npos) {
      return KeyError("server.cors_allowed_origins",
                      absl::StrCat("'", o,
                                   "' is not an origin: write scheme://host[:port] "
                                   "(e.g. http://localhost:3000) or \"*\""));
    }
  }
  if (c->state_dir.empty()) {
    const char* xdg = std::getenv("XDG_STATE_HOME");
    const char* home = std::getenv("HOME");
    if (xdg != nullptr && *xdg != '\0') {
      c->state_dir = (std::filesystem::path(xdg) / "thermocline").string();
    } else if (home != nullptr && *home != '\0') {
      c->state_dir = (std::filesystem::path(home) / ".local/state/thermocline").string();
    }
  }
  if (c->allowed_paths.empty()) {
    if (!c->state_dir.empty()) c->allowed_paths.push_back(c->state_dir);
    for (const ModelConfig& m : c->models) {
      std::error_code ec;
      const std::filesystem::path dir =
          std::filesystem::absolute(m.path, ec).lexically_normal().parent_path();
      if (!ec && !dir.empty()) c->allowed_paths.push_back(dir.string());
    }
  }
  return absl::OkStatus();
}

}  // namespace thermocline::server
