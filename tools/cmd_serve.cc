// thermocline serve: the daemon with the OpenAI-compatible HTTP API (server/daemon.h).
#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "server/config.h"
#include "server/daemon.h"
#include "spdlog/sinks/stdout_color_sinks.h"
#include "spdlog/spdlog.h"
#include "tools/commands.h"

namespace thermocline::cli {
namespace {

constexpr char kUsage[] = R"(usage: thermocline serve [options]
  --config FILE            TOML configuration (configs/thermocline.toml documents every key)
  --host HOST              address to bind (default 127.0.0.1)
  --port N                 port (default 8080; 0 = any free port, printed on stdout)
  --grpc-port N|off        gRPC port on the same host (default 50051; 0 = any free port,
                           printed on stdout; off or -1 = no gRPC front end)
  -m, --model PATH[=NAME]  a GGUF model to serve as NAME (default: the file name); repeatable
  --api-key KEY            require this key (Authorization: Bearer KEY or X-Api-Key: KEY)
  --slots N                concurrent generations (default 1)
  --queue N                requests that may wait for a slot (default 16); more get 503
  -t, --threads N          CPU threads per slot (default: hardware threads / slots)
  -c, --ctx N              context length of every model (default: the model's)
  --log-level LEVEL        trace | debug | info | warn | error | off (default info)
  --sparse off|on|auto     sparse FFN serving of every model (default auto: when a sidecar is
                           given or MODEL.thermo.gguf lies beside the model, unless that one's
                           speed check measured sparse slower on this machine)
  --sidecar FILE           the sidecar of the (single) --model (thermocline profile makes one)
  --oracle                 sparse with exact active sets (dense gate/up) instead of predictors
  --sparse-method M        SwiGLU layers: predicted (default) | gate-first | input-sparse | auto
                           ([[models]] sparse_method)
  --target-sparsity F      SwiGLU: the share of activations dropped (default: the sidecar's,
                           calibrated for its perplexity target if it has one;
                           [[models]] target_sparsity)
  --gpu-memory BYTES       device memory each model may use (8G, 512M): with a sidecar, its
                           solved hybrid placement (attention, head and hot neurons on the GPU);
                           without one, as many whole layers as fit (CUDA builds; without a
                           device every model is served from the CPU, said once in the log)
  --gpu-layers N|auto      the first N whole layers of every model on the GPU (-ngl style; auto:
                           as many as fit under --gpu-memory or the device's free memory)
  --kv-type f16|f32        every model's KV cache element type (default f16, as llama.cpp's;
                           [[models]] kv_type)
  --no-repack              every model's weights as the file stores them ([[models]] repack:
                           default true, Q4_0 and the K-quants re-laid at load, faster)
  --state-dir DIR          registry, job artefacts and sidecars of registered models (default
                           $XDG_STATE_HOME/thermocline or ~/.local/state/thermocline)
  --admin-key KEY          require this key for /admin/* (default: the API key, if any)
  --no-prompt-cache        prefill every prompt in full (default: a request reuses the KV
                           cache of the prefix it shares with a slot's last request)
Flags override the config file. SIGINT / SIGTERM stop the daemon gracefully.
)";

// --model may repeat, which Args does not keep: take every occurrence out first.
std::vector<std::string> ExtractModels(int* argc, char** argv) {
  std::vector<std::string> models;
  int out = 0;
  for (int i = 0; i < *argc; ++i) {
    const char* a = argv[i];
    if ((!std::strcmp(a, "--model") || !std::strcmp(a, "-m")) && i + 1 < *argc) {
      models.emplace_back(argv[++i]);
    } else if (!std::strncmp(a, "--model=", 8)) {
      models.emplace_back(a + 8);
    } else {
      argv[out++] = argv[i];
    }
  }
  *argc = out;
  return models;
}

absl::Status ApplyFlags(const Args& args, server::ServerConfig* c) {
  if (auto host = args.Get("--host")) c->host = *host;
  if (auto key = args.Get("--api-key")) c->api_keys = {*key};
  if (auto level = args.Get("--log-level")) c->log_level = *level;
  if (auto grpc = args.Get("--grpc-port")) {
    if (*grpc == "off") {
      c->grpc_port = -1;
    } else {
      auto v = args.GetInt("--grpc-port", 0);
      if (!v.ok()) return v.status();
      if (*v < -1 || *v > 65535) {
        return absl::InvalidArgumentError(
            absl::StrCat("--grpc-port ", *v, " is out of range: use 0-65535, or off"));
      }
      c->grpc_port = static_cast<int>(*v);
    }
  }
  if (auto dir = args.Get("--state-dir")) c->state_dir = *dir;
  if (auto key = args.Get("--admin-key")) c->admin_key = *key;
  if (auto mode = args.Get("--sparse")) {
    for (server::ModelConfig& m : c->models) m.sparse = *mode;
  }
  if (args.Has("--no-prompt-cache")) c->prompt_cache = false;
  if (args.Has("--oracle")) {
    for (server::ModelConfig& m : c->models) m.oracle = true;
  }
  if (auto bytes = args.Get("--gpu-memory")) {
    for (server::ModelConfig& m : c->models) m.gpu_memory = *bytes;
    c->gpu_memory = *bytes;
  }
  if (auto layers = args.Get("--gpu-layers")) {
    for (server::ModelConfig& m : c->models) m.gpu_layers = *layers;
    c->gpu_layers = *layers;
  }
  if (auto sidecar = args.Get("--sidecar")) {
    if (c->models.size() != 1) {
      return absl::InvalidArgumentError(
          "--sidecar needs exactly one model; set `sidecar` per [[models]] table instead");
    }
    c->models[0].sidecar = *sidecar;
  }
  struct IntFlag {
    const char* flag;
    int* dst;
  };
  for (IntFlag f : {IntFlag{"--port", &c->port},
                    {"--slots", &c->slots},
                    {"--queue", &c->queue},
                    {"--threads", &c->threads_per_slot}}) {
    if (!args.Has(f.flag)) continue;
    auto v = args.GetInt(f.flag, 0);
    if (!v.ok()) return v.status();
    if (*v < 0 || *v > 1000000) {
      return absl::InvalidArgumentError(absl::StrCat(f.flag, " ", *v, " is out of range"));
    }
    *f.dst = static_cast<int>(*v);
  }
  if (auto kv = args.Get("--kv-type")) {
    for (server::ModelConfig& m : c->models) m.kv_type = *kv;
  }
  if (args.Has("--no-repack")) {
    for (server::ModelConfig& m : c->models) m.repack = false;
  }
  if (auto method = args.Get("--sparse-method")) {
    for (server::ModelConfig& m : c->models) m.sparse_method = *method;
  }
  if (args.Has("--target-sparsity")) {
    auto target = args.GetDouble("--target-sparsity", 0.0);
    if (!target.ok()) return target.status();
    for (server::ModelConfig& m : c->models) m.target_sparsity = *target;
  }
  if (args.Has("--ctx")) {
    auto ctx = args.GetInt("--ctx", 0);
    if (!ctx.ok()) return ctx.status();
    for (server::ModelConfig& m : c->models) m.n_ctx = *ctx;
  }
  return absl::OkStatus();
}

}  // namespace

int RunServe(int argc, char** argv) {
  const std::vector<std::string> model_flags = ExtractModels(&argc, argv);
  auto args = Args::Parse(
      argc, argv,
      {"--config", "--host", "--port", "--api-key", "--slots", "--queue", "--threads", "--ctx",
       "--log-level", "--sparse", "--sidecar", "--state-dir", "--admin-key", "--grpc-port",
       "--gpu-memory", "--gpu-layers", "--kv-type", "--sparse-method", "--target-sparsity"},
      {"--help", "--oracle", "--no-prompt-cache", "--no-repack"},
      {{"-t", "--threads"}, {"-c", "--ctx"}, {"-h", "--help"}});
  if (!args.ok()) return Fail("serve", args.status(), true);
  if (args->Has("--help")) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  server::ServerConfig config;
  if (auto path = args->Get("--config")) {
    if (absl::Status s = server::LoadConfigFile(*path, &config); !s.ok()) {
      return Fail("serve", s, true);
    }
  }
  // Models named on the command line replace those of the config file.
  if (!model_flags.empty()) {
    config.models.clear();
    for (const std::string& m : model_flags) config.models.push_back(server::ParseModelFlag(m));
  }
  if (absl::Status s = ApplyFlags(*args, &config); !s.ok()) return Fail("serve", s, true);
  if (absl::Status s = server::FinalizeConfig(&config); !s.ok()) return Fail("serve", s, true);
  // Logs go to stderr; stdout carries only the "listening on" line.
  spdlog::set_default_logger(spdlog::stderr_color_mt("thermocline"));
  spdlog::set_level(spdlog::level::from_str(config.log_level));
  spdlog::set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%l%$ %v");
  if (absl::Status s = server::RunDaemon(config); !s.ok()) return Fail("serve", s);
  return 0;
}

}  // namespace thermocline::cli
