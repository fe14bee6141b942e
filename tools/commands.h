// The subcommands of the `thermocline` binary. Each takes the arguments after its name and
// returns the process exit code (0 ok, 1 failure, 2 usage error).
#pragma once

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/gpu/gpu_layers.h"
#include "engine/model/llama_model.h"
#include "engine/model/session.h"
#include "engine/sparse/sparse_ffn.h"
#include "engine/util/thread_pool.h"
#include "tools/args.h"

namespace thermocline::cli {

int RunGenerate(int argc, char** argv);
int RunInspect(int argc, char** argv);
int RunPerplexity(int argc, char** argv);
int RunBench(int argc, char** argv);
int RunBenchOps(int argc, char** argv);  // tools/cmd_bench_ops.cc: `bench --ops`
int RunQuantize(int argc, char** argv);
int RunSynth(int argc, char** argv);
int RunProfile(int argc, char** argv);  // tools/cmd_profile.cc
int RunSolve(int argc, char** argv);    // tools/cmd_solve.cc
int RunServe(int argc, char** argv);    // tools/cmd_serve.cc
int RunModels(int argc, char** argv);   // tools/cmd_models.cc: `models register|list|show|rm`
int RunChat(int argc, char** argv);     // tools/cmd_run.cc: `run MODEL [PROMPT]`

// Prints "thermocline <command>: <message>" to stderr; returns 2 for usage errors, else 1.
int Fail(const std::string& command, const absl::Status& status, bool usage = false);

// Usage errors in --model (required) and --activation, before anything is loaded.
absl::Status CheckModelArgs(const Args& args);
// Loads --model with --activation.
absl::StatusOr<std::unique_ptr<LlamaModel>> LoadModelFromArgs(const Args& args);
// --threads, default: all hardware threads.
absl::StatusOr<int> ThreadsFromArgs(const Args& args);

// The sparse FFN flags generate, perplexity and bench accept: value flags --sparse, --sidecar,
// --target-sparsity; switch --oracle.
constexpr char kSparseUsage[] =
    "  --sparse off|on|auto     sparse FFN (auto: on when a sidecar is given or found as\n"
    "                           MODEL.thermo.gguf; default auto)\n"
    "  --sidecar FILE           the model's sidecar (predictors, thresholds, placement)\n"
    "  --oracle                 exact active sets (dense gate/up) instead of the predictors\n"
    "  --target-sparsity F      SwiGLU: drop this fraction of activations by magnitude\n"
    "  --gpu-memory BYTES       the placement's GPU neurons on the GPU under this cap (512M,\n"
    "                           8G; CUDA builds; without a device they stay on the CPU)\n";
// The sparse FFN backend of --sparse/--sidecar/--oracle/--target-sparsity on `pool`, or nullptr
// when sparse is off. dense_prefill: prompts of more than one token use the dense FFN.
absl::StatusOr<std::unique_ptr<SparseFfn>> SparseFfnFromArgs(const Args& args,
                                                             const LlamaModel& model,
                                                             ThreadPool* pool, bool dense_prefill);

// --gpu-layers N|auto (generate, bench): the -ngl-style dense offload.
constexpr char kGpuLayersUsage[] =
    "  --gpu-layers N|auto      dense whole layers on the GPU: the first N (auto: as many as fit\n"
    "                           under --gpu-memory, all without it), the rest on the CPU; all\n"
    "                           of them also puts the output head there (CUDA builds; without a\n"
    "                           device everything stays on the CPU)\n";
// The layer backend of --gpu-layers for `session`, or nullptr when the flag is absent, asks for
// 0 layers, or there is no usable device (said on stderr; the run goes on on the CPU).
// sparse: the session's sparse FFN, if any (its own GPU part cannot share --gpu-memory with
// --gpu-layers: an InvalidArgumentError then).
absl::StatusOr<std::unique_ptr<gpu::GpuLayers>> GpuLayersFromArgs(const Args& args,
                                                                  const Session& session,
                                                                  const SparseFfn* sparse);
// bench --gpu-compare (tools/cmd_bench_gpu.cc): hybrid sparse vs -ngl dense vs CPU decode.
int RunBenchGpuCompare(const Args& args);

}  // namespace thermocline::cli
