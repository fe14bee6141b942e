// Pieces shared by the subcommands: error reporting and model loading from flags.
#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "engine/gpu/gpu_backend.h"
#include "engine/util/thread_pool.h"
#include "offline/sparse_loader.h"
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

namespace {

// --gpu-memory BYTES: the device part of the placement on the GPU under that cap.
absl::Status GpuOptionsFromArgs(const Args& args, SparseFfnOptions* options) {
  if (!args.Get("--gpu-memory")) return absl::OkStatus();
  auto bytes = args.GetBytes("--gpu-memory", 0);
  if (!bytes.ok()) return bytes.status();
  if (*bytes <= 0) return absl::InvalidArgumentError("--gpu-memory must be positive");
  options->gpu = true;
  options->gpu_memory = static_cast<uint64_t>(*bytes);
  return absl::OkStatus();
}

// --gpu-memory without a usable device: say so on stderr (the run goes on, all on the CPU).
absl::StatusOr<std::unique_ptr<SparseFfn>> SaidWhereGpuRuns(
    absl::StatusOr<std::unique_ptr<SparseFfn>> ffn) {
  if (ffn.ok() && *ffn != nullptr && (*ffn)->options().gpu && !(*ffn)->gpu_status().ok()) {
    std::fprintf(stderr, "thermocline: --gpu-memory: %s\n",
                 std::string((*ffn)->gpu_status().message()).c_str());
  }
  return ffn;
}

}  // namespace

absl::StatusOr<std::unique_ptr<SparseFfn>> SparseFfnFromArgs(const Args& args,
                                                             const LlamaModel& model,
                                                             ThreadPool* pool, bool dense_prefill) {
  const std::string mode = args.Get("--sparse").value_or("auto");
  if (mode != "off" && mode != "on" && mode != "auto") {
    return absl::InvalidArgumentError(absl::StrCat("--sparse ", mode, ": use off, on or auto"));
  }
  auto target = args.GetDouble("--target-sparsity", 0.0);
  if (!target.ok()) return target.status();
  if (*target < 0 || *target >= 1) {
    return absl::InvalidArgumentError("--target-sparsity must be in [0, 1)");
  }
  if (mode == "off") return std::unique_ptr<SparseFfn>();
  std::string sidecar = args.Get("--sidecar").value_or("");
  if (sidecar.empty()) {
    const std::string beside = args.Get("--model").value_or("") + ".thermo.gguf";
    if (std::filesystem::exists(beside)) sidecar = beside;
  }
  if (sidecar.empty() && args.Has("--oracle") && mode == "on") {
    // The exact active set needs no predictor: every layer's plan is the default one.
    SparseFfnOptions options;
    options.oracle = true;
    options.dense_prefill = dense_prefill;
    if (absl::Status st = GpuOptionsFromArgs(args, &options); !st.ok()) return st;
    return SaidWhereGpuRuns(SparseFfn::Create(
        model, std::vector<SparseLayerPlan>(model.hparams().n_layer), pool, options));
  }
  if (sidecar.empty() && model.carries_predictors()) {
    // A PowerInfer file runs sparse as it is, on its own predictors.
    absl::StatusOr<std::vector<SparseLayerPlan>> plan = SparsePlanFromModel(model);
    if (!plan.ok()) return plan.status();
    SparseFfnOptions options;
    options.oracle = args.Has("--oracle");
    options.dense_prefill = dense_prefill;
    if (absl::Status st = GpuOptionsFromArgs(args, &options); !st.ok()) return st;
    return SaidWhereGpuRuns(SparseFfn::Create(model, *std::move(plan), pool, options));
  }
  if (sidecar.empty()) {
    if (mode == "auto") return std::unique_ptr<SparseFfn>();
    return absl::InvalidArgumentError(
        "--sparse on needs a sidecar: --sidecar FILE, or MODEL.thermo.gguf beside the model "
        "(thermocline profile makes one)");
  }
  SparseFfnOptions options;
  options.oracle = args.Has("--oracle");
  options.dense_prefill = dense_prefill;
  if (absl::Status st = GpuOptionsFromArgs(args, &options); !st.ok()) return st;
  offline::SparseLoadOptions load;
  load.target_sparsity = *target;
  return SaidWhereGpuRuns(offline::LoadSparseFfn(sidecar, model, pool, options, load));
}

absl::StatusOr<std::unique_ptr<gpu::GpuLayers>> GpuLayersFromArgs(const Args& args,
                                                                  const Session& session,
                                                                  const SparseFfn* sparse) {
  auto text = args.Get("--gpu-layers");
  if (!text) return std::unique_ptr<gpu::GpuLayers>();
  absl::StatusOr<int64_t> requested = gpu::ParseGpuLayers(*text);
  if (!requested.ok()) return requested.status();
  auto cap = args.GetBytes("--gpu-memory", -1);
  if (!cap.ok()) return cap.status();
  if (sparse != nullptr && sparse->options().gpu && sparse->gpu_status().ok()) {
    return absl::InvalidArgumentError(
        "--gpu-layers puts dense whole layers on the GPU and the sparse FFN's GPU part would "
        "need the same --gpu-memory: use --sparse off with --gpu-layers, or drop --gpu-layers "
        "for the hybrid placement");
  }
  if (absl::StatusOr<gpu::DeviceInfo> device = gpu::Probe(); !device.ok()) {
    std::fprintf(stderr, "thermocline: --gpu-layers: %s\n",
                 std::string(device.status().message()).c_str());
    return std::unique_ptr<gpu::GpuLayers>();
  }
  const uint64_t memory_cap =
      *cap > 0 ? static_cast<uint64_t>(*cap) : gpu::MemoryBudget::kUnlimited;
  absl::StatusOr<gpu::GpuLayersSpec> spec = gpu::PlanWholeLayers(
      session.model(), *requested, session.n_ctx(), session.max_batch(), memory_cap);
  if (!spec.ok()) return spec.status();
  if (std::count(spec->layers.begin(), spec->layers.end(), 1) == 0) {
    std::fprintf(stderr,
                 "thermocline: --gpu-layers: no layer fits under --gpu-memory; all on the CPU\n");
    return std::unique_ptr<gpu::GpuLayers>();
  }
  return gpu::CreateGpuLayers(*spec);
}

}  // namespace thermocline::cli
