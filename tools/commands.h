// The subcommands of the `thermocline` binary. Each takes the arguments after its name and
// returns the process exit code (0 ok, 1 failure, 2 usage error).
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/model/llama_model.h"
#include "engine/model/session.h"
#include "engine/runtime/engine.h"
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
// InvalidArgument when the file `out_flag` names is the one `in_flag` names (the same path, or
// a link to it): writing it would replace the input. OK when either flag is absent.
absl::Status CheckNotOverwriting(const Args& args, const std::string& out_flag,
                                 const std::string& in_flag);
// Loads --model with --activation.
absl::StatusOr<std::unique_ptr<LlamaModel>> LoadModelFromArgs(const Args& args);
// --threads, default: all hardware threads.
absl::StatusOr<int> ThreadsFromArgs(const Args& args);

// The sparse FFN flags generate, perplexity and bench accept: value flags --sparse, --sidecar,
// --target-sparsity, --sparse-method; switch --oracle.
constexpr char kSparseUsage[] =
    "  --sparse off|on|auto     sparse FFN (auto: on when a sidecar is given or found as\n"
    "                           MODEL.thermo.gguf, unless a found one's speed check measured\n"
    "                           sparse slower on this machine; default auto)\n"
    "  --sidecar FILE           the model's sidecar (predictors, thresholds, placement)\n"
    "  --oracle                 exact active sets (dense gate/up) instead of the predictors\n"
    "  --target-sparsity F      SwiGLU: drop this fraction of activations (predicted: by\n"
    "                           |act|; gate-first: by |silu(gate)|; input-sparse: of each\n"
    "                           projection's input by |x|; default: the sparsity the sidecar\n"
    "                           calibrated for its perplexity target, if any)\n"
    "  --sparse-method M        SwiGLU: predicted (default: the predictors pick), gate-first\n"
    "                           (every gate row; up and down only where the gate passes),\n"
    "                           input-sparse (q/k/v, gate/up and down read only the columns\n"
    "                           of their inputs' larger entries), or auto (the fastest by the\n"
    "                           sidecar's speed check on this machine, else per layer the\n"
    "                           fewest bytes by the profile)\n"
    "  --gpu-memory BYTES       the placement's GPU neurons on the GPU under this cap (512M,\n"
    "                           8G; CUDA builds; without a device they stay on the CPU)\n";
// --gpu-layers N|auto (generate, bench): the -ngl-style dense offload.
constexpr char kGpuLayersUsage[] =
    "  --gpu-layers N|auto      whole layers on the GPU: the first N (auto: as many as fit\n"
    "                           under --gpu-memory, all without it), the rest on the CPU; all\n"
    "                           of them also puts the output head there (CUDA builds; without a\n"
    "                           device everything stays on the CPU). Dense, or input-sparse\n"
    "                           or gate-first where the sparse plan's layers are\n";
// The sparse plan of --sparse/--sidecar/--oracle/--target-sparsity (offline/sparse_source.h, the
// same resolution the daemon uses); a sidecar beside the model that cannot be used, or that its
// speed check measured slower than dense here (unless !check_speed: bench, which measures it),
// is said on stderr and the run goes on dense.
absl::StatusOr<std::optional<SparsePlan>> SparsePlanFromArgs(const Args& args,
                                                             const LlamaModel& model,
                                                             bool check_speed = true);
// --gpu-memory and --gpu-layers into `options`.
absl::Status GpuOptionsFromArgs(const Args& args, EngineOptions* options);
// The engine of the model with the sparse and GPU flags over `options` (n_ctx, max_batch,
// dense_prefill set by the caller).
absl::StatusOr<std::shared_ptr<const Engine>> EngineFromArgs(const Args& args,
                                                             const LlamaModel& model,
                                                             ThreadPool& pool,
                                                             EngineOptions options,
                                                             bool check_speed = true);
// engine.NewSession(pool); when a GPU was asked for, where its parts run (or why they do not)
// is said on stderr.
absl::StatusOr<std::unique_ptr<EngineSession>> SessionFor(const Engine& engine, ThreadPool* pool);
// bench --gpu-compare (tools/cmd_bench_gpu.cc): hybrid sparse vs -ngl dense vs CPU decode.
int RunBenchGpuCompare(const Args& args);
// bench on a mixture of experts (tools/cmd_bench_moe.cc): decode tokens/s of every expert
// computed densely, of the routed experts on the CPU, and of the sidecar's expert placement
// (--gpu-memory; --stand-in: on the CPU stand-in device).
int RunBenchMoe(const Args& args, const LlamaModel& model, int64_t prompt_tokens,
                int64_t gen_tokens, int repetitions);
// bench --json-schema FILE (tools/cmd_bench_grammar.cc): greedy decode tokens/s with and
// without the schema's grammar constraint, interleaved, on one session of `engine`.
int RunBenchGrammar(const Args& args, const Engine& engine, ThreadPool& pool, int64_t gen_tokens,
                    int repetitions);

}  // namespace thermocline::cli
