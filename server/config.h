// The daemon's configuration: defaults, the TOML file (configs/thermocline.toml documents every
// key) and the checks that make a bad value an error naming the key, before anything starts.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/sampling/sampler.h"

namespace thermocline::server {

struct ModelConfig {
  std::string path;           // GGUF file
  std::string name;           // id in the API; default: the file name without .gguf
  int64_t n_ctx = 0;          // context per slot; 0: the model's training context
  std::string activation;     // override llama.feed_forward_activation ("" = from the file)
  std::string chat_template;  // "" = from tokenizer.chat_template; or a family name (see docs)
  // Sparse serving: "off" (dense), "on" (a sidecar is required), "auto" (sparse when a sidecar
  // is given or lies beside the model as <path>.thermo.gguf).
  std::string sparse = "auto";
  std::string sidecar;  // offline sidecar (thermocline profile); "" = look beside the model
  // Sparse with the exact active sets (dense gate/up) instead of the predictors: the quality
  // check of a placement, not for speed.
  bool oracle = false;
  // How SwiGLU layers skip work: "predicted", "gate-first", "input-sparse" or "auto" (the
  // fastest by the sidecar's speed check on this CPU, else per layer the fewest bytes by the
  // profile; docs/sparse.md); and the share of activations they drop (0: the sidecar's
  // calibration).
  std::string sparse_method = "predicted";
  double target_sparsity = 0;
  // The GPU (engine/runtime/engine.h): device memory the model may use ("8G", bytes; "" = no
  // cap asked for) and whole layers on it ("auto", a count; "" = none asked for). With a sidecar
  // and gpu_memory the solved hybrid placement runs; with gpu_layers, -ngl-style whole layers.
  std::string gpu_memory;
  std::string gpu_layers;
  std::string kv_type = "f16";  // the KV cache's element type: "f16" (as llama.cpp's) or "f32"
  // The dense CPU path's weights re-laid at load (Q4_0 and the K-quants in row groups; faster).
  // false: the file's rows, with which a K-quant file gives llama.cpp's numbers bit for bit.
  bool repack = true;
};

// The engine options of `gpu_memory` / `gpu_layers` (validated by FinalizeConfig).
absl::Status ApplyGpuConfig(const ModelConfig& m, uint64_t* gpu_memory, int64_t* gpu_layers);

struct ServerConfig {
  // [server]
  std::string host = "127.0.0.1";
  int port = 8080;                    // 0: any free port (printed on stdout)
  int grpc_port = 50051;              // gRPC front end on host; 0: any free port; -1: off
  std::vector<std::string> api_keys;  // empty: no authentication
  int64_t max_body_bytes = 4 << 20;   // decoded (after gzip/br), also for chunked bodies
  int http_threads = 0;               // workers serving requests; 0: slots + queue + 8
  int read_timeout_s = 30;            // longest pause between the bytes of a request
  int write_timeout_s = 30;
  int header_timeout_s = 10;            // a request head must arrive within this of its first byte
  int body_timeout_s = 60;              // and its body within this of the head's end
  int keep_alive_s = 5;                 // an idle connection is closed after this
  int64_t max_header_bytes = 32 << 10;  // request line + header fields
  int max_headers = 100;                // header fields per request
  int max_connections = 1024;           // open at once (idle ones too); beyond: 503 at once
  int max_connections_per_client = 64;  // per remote address; 0: no limit
  int64_t max_inflight_bytes = 0;       // request bodies held at once; 0: 16 x max_body_bytes
  int listen_backlog = 1024;
  int64_t max_tokenize_bytes = 1 << 20;           // text per /tokenize call (HTTP and gRPC)
  std::vector<std::string> allowed_hosts;         // Host header names; empty: see FinalizeConfig
  std::vector<std::string> cors_allowed_origins;  // empty: CORS off; "*": any origin
  int shutdown_timeout_s = 10;  // graceful-stop budget before in-flight requests are cancelled
  std::string admin_key;        // /admin/*: this key; "" = the API keys (if any)

  // [scheduler]
  int slots = 1;
  int queue = 16;                  // requests waiting for a slot beyond this are refused with 503
  int threads_per_slot = 0;        // 0: hardware threads / slots (at least 1)
  double request_timeout_s = 600;  // deadline from arrival; 0: none
  int retry_after_s = 1;
  int64_t max_batch = 64;  // prefill chunk
  // Each slot keeps the tokens of its KV cache; a request reuses the prefix it shares with them
  // and a request goes to the free slot that holds most of its prompt. false: every request
  // prefills its whole prompt.
  bool prompt_cache = true;
  // Context of a model that sets no n_ctx: its training context, at most this.
  int64_t max_context = 32768;

  // [sampling]: what a request that omits a field gets.
  SamplingParams sampling;
  int32_t default_max_tokens = 0;  // 0: until the context is full
  // A chat request whose prompt and max_tokens do not fit the context: "refuse" (400) or
  // "truncate" (drop the oldest non-system messages until it fits). Requests may override it.
  std::string context_overflow = "refuse";
  int max_stop_strings = 16;
  int max_stop_length = 256;

  // [log]
  std::string log_level = "info";
  bool access_log = true;

  // [registry]: registered models, background profiling jobs.
  std::string state_dir;  // "" = $XDG_STATE_HOME/thermocline or ~/.local/state/thermocline
  int jobs = 1;           // profiling jobs that run at once
  int64_t model_memory_budget = 0;  // bytes of weights loaded at once (LRU unload); 0 = unlimited
  int64_t profile_tokens = 4096;    // default tokens a job profiles
  // SwiGLU models: each job also calibrates the sparsity for this perplexity increase over
  // dense (offline/sparsity_calibration.h; 0.02 = +2%). 0: off.
  double target_ppl_increase = 0;
  // Each job also measures decode speed of dense and of each sparse method here
  // (offline/speed_check.h); a registered model is then served sparse only where that pays.
  // false: no check, served sparse.
  bool speed_check = true;
  double solve_time_limit_s = 10;  // placement ILP budget per job
  std::string hardware;            // hardware profile file the placement is solved for; "" =
                                   // the defaults (RTX 3060 12 GB) with the CPU measured here
  // GPU options of registered models that do not set their own (ModelConfig's; `serve
  // --gpu-memory/--gpu-layers` set them too).
  std::string gpu_memory;
  std::string gpu_layers;
  // Folders whose files may be registered as models or corpora; empty: the state directory and
  // the folders of the configured [[models]] (FinalizeConfig fills it in).
  std::vector<std::string> allowed_paths;

  // [debug]
  int decode_delay_ms = 0;       // sleep after each token: makes the tiny test models slow
  int prefill_delay_ms = 0;      // sleep between prefill chunks: makes prefill slow to cancel
  int job_stage_delay_ms = 0;    // sleep after each job stage: makes jobs slow enough to interrupt
  int load_delay_ms = 0;         // sleep before a model load opens its file: a slow disk
  std::string load_delay_model;  // the model whose loads sleep so; "": every model

  std::vector<ModelConfig> models;  // [[models]]
};

// Reads a TOML file over the defaults. Unknown keys are errors (a typo should not pass silently).
absl::Status LoadConfigFile(const std::string& path, ServerConfig* config);
// Range checks and derived defaults (model names, thread counts).
absl::Status FinalizeConfig(ServerConfig* config);
// "path" or "path=name".
ModelConfig ParseModelFlag(const std::string& value);

}  // namespace thermocline::server
