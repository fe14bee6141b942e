// Pieces shared by the subcommands: error reporting and model loading from flags.
#include <cstdio>
#include <filesystem>
#include <optional>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "engine/gpu/gpu_layers.h"
#include "engine/util/thread_pool.h"
#include "offline/sparse_source.h"
#include "tools/commands.h"

namespace thermocline::cli {

int Fail(const std::string& command, const absl::Status& status, bool usage) {
  std::fprintf(stderr, "thermocline %s: %s\n", command.c_str(),
               std::string(status.message()).c_str());
  return usage ? 2 : 1;
}

absl::Status CheckModelArgs(const Args& args) {
  if (!args.Get("--model")) return absl::InvalidArgumentError("--model FILE is required");
  if (auto act = args.Get("--activation")) return ParseActivation(*act).status();
  return absl::OkStatus();
}

absl::Status CheckNotOverwriting(const Args& args, const std::string& out_flag,
                                 const std::string& in_flag) {
  const std::optional<std::string> out = args.Get(out_flag), in = args.Get(in_flag);
  if (!out || !in) return absl::OkStatus();
  // The same file, or (neither there yet) the same path.
  std::error_code ec, ec_in, ec_out;
  const std::filesystem::path in_path = std::filesystem::weakly_canonical(*in, ec_in);
  const std::filesystem::path out_path = std::filesystem::weakly_canonical(*out, ec_out);
  const bool same =
      std::filesystem::equivalent(*in, *out, ec) || (!ec_in && !ec_out && in_path == out_path);
  if (same) {
    return absl::InvalidArgumentError(absl::StrCat(out_flag, " ", *out, " is the file ", in_flag,
                                                   " names: writing it would replace it"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<LlamaModel>> LoadModelFromArgs(const Args& args) {
  auto path = args.Get("--model");
  if (!path) return absl::InvalidArgumentError("--model FILE is required");
  ModelOptions options;
  if (auto act = args.Get("--activation")) {
    auto parsed = ParseActivation(*act);
    if (!parsed.ok()) return parsed.status();
    options.activation = *parsed;
  }
  auto model = LlamaModel::Load(*path, options);
  if (model.ok()) {
    for (const std::string& w : (*model)->warnings()) {
      std::fprintf(stderr, "warning: %s\n", w.c_str());
    }
  }
  return model;
}

absl::StatusOr<int> ThreadsFromArgs(const Args& args) {
  auto n = args.GetInt("--threads", ThreadPool::DefaultThreads());
  if (!n.ok()) return n.status();
  if (*n < 1 || *n > 1024) {
    return absl::InvalidArgumentError(absl::StrCat("--threads ", *n, " must be in [1, 1024]"));
  }
  return static_cast<int>(*n);
}

absl::StatusOr<std::optional<SparsePlan>> SparsePlanFromArgs(const Args& args,
                                                             const LlamaModel& model,
                                                             bool check_speed) {
  absl::StatusOr<offline::SparseMode> mode =
      offline::ParseSparseMode(args.Get("--sparse").value_or("auto"), "--sparse");
  if (!mode.ok()) return mode.status();
  auto target = args.GetDouble("--target-sparsity", 0.0);
  if (!target.ok()) return target.status();
  if (!(*target >= 0 && *target < 1)) {
    return absl::InvalidArgumentError("--target-sparsity must be in [0, 1)");
  }
  offline::SparseRequest request;
  request.mode = *mode;
  request.sidecar = args.Get("--sidecar").value_or("");
  request.model_path = args.Get("--model").value_or("");
  request.oracle = args.Has("--oracle");
  request.target_sparsity = *target;
  request.check_speed = check_speed && !args.Has("--sidecar") && !args.Has("--gpu-layers") &&
                        !args.Has("--gpu-memory");
  absl::StatusOr<offline::MethodChoice> method = offline::ParseSparseMethod(
      args.Get("--sparse-method").value_or("predicted"), "--sparse-method");
  if (!method.ok()) return method.status();
  request.method = *method;
  absl::StatusOr<offline::ResolvedSparse> resolved = offline::ResolveSparsePlan(model, request);
  if (!resolved.ok()) return resolved.status();
  if (!resolved->warning.empty()) {
    std::fprintf(stderr, "thermocline: %s\n", resolved->warning.c_str());
  }
  return std::move(resolved->plan);
}

absl::Status GpuOptionsFromArgs(const Args& args, EngineOptions* options) {
  if (args.Get("--gpu-memory")) {
    auto bytes = args.GetBytes("--gpu-memory", 0);
    if (!bytes.ok()) return bytes.status();
    if (*bytes <= 0) return absl::InvalidArgumentError("--gpu-memory must be positive");
    options->gpu_memory = static_cast<uint64_t>(*bytes);
  }
  if (auto text = args.Get("--gpu-layers")) {
    absl::StatusOr<int64_t> n = gpu::ParseGpuLayers(*text);
    if (!n.ok()) return n.status();
    options->gpu_layers = *n;
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<const Engine>> EngineFromArgs(const Args& args,
                                                             const LlamaModel& model,
                                                             ThreadPool& pool,
                                                             EngineOptions options,
                                                             bool check_speed) {
  if (absl::Status s = GpuOptionsFromArgs(args, &options); !s.ok()) return s;
  if (auto text = args.Get("--kv-type"); text && !ParseKvType(*text, &options.kv_type)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--kv-type '", *text, "' is not one of f16, f32"));
  }
  absl::StatusOr<std::optional<SparsePlan>> plan = SparsePlanFromArgs(args, model, check_speed);
  if (!plan.ok()) return plan.status();
  return Engine::Create(model, *std::move(plan), options, pool);
}

absl::StatusOr<std::unique_ptr<EngineSession>> SessionFor(const Engine& engine, ThreadPool* pool) {
  absl::StatusOr<std::unique_ptr<EngineSession>> session = engine.NewSession(pool);
  if (session.ok() && engine.options().gpu_requested()) {
    const EnginePlacement& p = (*session)->placement();
    const char* flag =
        engine.options().gpu_layers != kNoGpuLayers ? "--gpu-layers" : "--gpu-memory";
    if (p.device.empty()) {  // no device: why, and that the run goes on on the CPU
      std::fprintf(stderr, "thermocline: %s: %s\n", flag, p.note.c_str());
    } else {
      std::fprintf(stderr, "thermocline: GPU: %s\n", DescribePlacement(p).c_str());
    }
  }
  return session;
}

}  // namespace thermocline::cli
