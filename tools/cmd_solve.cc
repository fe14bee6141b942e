// thermocline solve: the neuron placement ILP (COIN-OR CBC) for a GPU memory budget, written
// into the sidecar as per-layer neuron tables.
#include <cstdio>
#include <fstream>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "offline/pipeline.h"
#include "tools/commands.h"

namespace thermocline::cli {
namespace {

constexpr char kUsage[] =
    R"(usage: thermocline solve -m MODEL --sidecar FILE --gpu-memory BYTES [options]
  -m, --model FILE          GGUF model the sidecar was profiled for
  --sidecar FILE            sidecar from `thermocline profile`; the placement is written into it
  --gpu-memory BYTES        GPU memory budget (512M, 8G, 8GiB, ...; default: the hardware's)
  --hardware FILE           hardware profile (configs/hardware/*.toml; default: RTX 3060 12GB
                            figures, CPU bandwidth measured here)
  --objective time|frequency  minimise modelled token time (default) or maximise firing mass
                            on the GPU (PowerInfer's objective)
  --bucket N                neurons per bucket, in frequency order (default 64)
  --min-neurons N           fewest GPU neurons of a layer that uses the GPU (default: enough
                            to pay for a sync)
  --context N               KV cache length budgeted (default: the model's context)
  --kv-type f16|f32         KV cache element type budgeted, as the model will run (default f16)
  --time-limit S            CBC time limit in seconds, best solution kept (default 30)
  --gap G                   stop within this relative gap of the proven bound (default 1e-4)
  --cpu-bandwidth GBPS      CPU read bandwidth instead of measuring it
  --save-hardware FILE      write the hardware profile used (with the measured CPU bandwidth)
  --plots DIR               placement.svg
  --dry-run                 do not write the sidecar
  --json                    print the result as JSON
  -t, --threads N           threads for the bandwidth measurement
)";

}  // namespace

int RunSolve(int argc, char** argv) {
  auto args =
      Args::Parse(argc, argv,
                  {"--model", "--sidecar", "--gpu-memory", "--hardware", "--objective", "--bucket",
                   "--min-neurons", "--context", "--time-limit", "--cpu-bandwidth", "--plots",
                   "--threads", "--activation", "--gap", "--save-hardware", "--kv-type"},
                  {"--json", "--dry-run", "--help"},
                  {{"-m", "--model"}, {"-t", "--threads"}, {"-h", "--help"}});
  if (!args.ok()) return Fail("solve", args.status(), true);
  if (args->Has("--help")) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  for (const char* in : {"--model", "--sidecar"}) {
    if (absl::Status s = CheckNotOverwriting(*args, "--save-hardware", in); !s.ok()) {
      return Fail("solve", s, true);
    }
  }
  auto sidecar_path = args->Get("--sidecar");
  if (!sidecar_path) {
    return Fail("solve", absl::InvalidArgumentError("--sidecar FILE is required"), true);
  }
  auto objective = offline::ParseObjective(args->GetOr("--objective", "time"));
  if (!objective.ok()) return Fail("solve", objective.status(), true);
  offline::HardwareProfile hw;
  if (auto path = args->Get("--hardware")) {
    auto read = offline::ReadHardwareProfile(*path);
    if (!read.ok()) return Fail("solve", read.status(), true);
    hw = *read;
  }
  auto budget = args->GetBytes("--gpu-memory", static_cast<int64_t>(hw.gpu_memory_bytes));
  auto bucket = args->GetInt("--bucket", 64);
  auto min_neurons = args->GetInt("--min-neurons", -1);
  auto context = args->GetInt("--context", 0);
  auto limit = args->GetDouble("--time-limit", 30);
  auto cpu_bw = args->GetDouble("--cpu-bandwidth", hw.cpu_bandwidth_gbps);
  auto gap = args->GetDouble("--gap", 1e-4);
  for (auto* v : {&budget, &bucket, &min_neurons, &context}) {
    if (!v->ok()) return Fail("solve", v->status(), true);
  }
  for (auto* v : {&limit, &cpu_bw, &gap}) {
    if (!v->ok()) return Fail("solve", v->status(), true);
  }
  if (*budget < 0 || *bucket < 1 || *context < 0 || *limit <= 0 || *cpu_bw < 0 || *gap < 0) {
    return Fail("solve", absl::InvalidArgumentError("negative or zero option value"), true);
  }
  hw.cpu_bandwidth_gbps = *cpu_bw;
  auto threads = ThreadsFromArgs(*args);
  if (!threads.ok()) return Fail("solve", threads.status(), true);
  auto model = LoadModelFromArgs(*args);
  if (!model.ok()) return Fail("solve", model.status());
  auto sidecar = offline::LoadSidecarFor(*sidecar_path, **model);
  if (!sidecar.ok()) return Fail("solve", sidecar.status());
  ThreadPool pool(*threads);
  offline::MeasureCpuIfMissing(hw, pool);
  if (auto path = args->Get("--save-hardware")) {
    std::ofstream f(*path);
    f << offline::FormatHardwareProfile(hw);
    if (!f) return Fail("solve", absl::InternalError(absl::StrCat("cannot write ", *path)));
  }

  offline::ProblemOptions po;
  po.bucket_size = *bucket;
  po.min_neurons = *min_neurons;
  po.context = *context;
  po.budget_bytes = static_cast<double>(*budget);
  if (auto text = args->Get("--kv-type"); text && !ParseKvType(*text, &po.kv_type)) {
    return Fail(
        "solve",
        absl::InvalidArgumentError(absl::StrCat("--kv-type '", *text, "' is not one of f16, f32")),
        true);
  }
  offline::SolveOptions so;
  so.objective = *objective;
  so.time_limit_s = *limit;
  so.relative_gap = *gap;
  auto run = offline::SolvePlacementFor(**model, *sidecar, hw, po, so);
  if (!run.ok()) return Fail("solve", run.status());
  offline::ApplyPlacement(*run, *sidecar);
  if (!args->Has("--dry-run")) {
    if (absl::Status s = offline::WriteSidecar(*sidecar, *sidecar_path); !s.ok()) {
      return Fail("solve", s);
    }
  }
  if (auto dir = args->Get("--plots")) {
    if (absl::Status s = offline::WritePlacementPlot(*run, *dir); !s.ok()) return Fail("solve", s);
  }
  const nlohmann::json j = offline::PlacementJson(*run);
  if (args->Has("--json")) {
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  const auto& c = j["chosen"];
  const auto& o = j["other"];
  std::printf(
      "hardware %s: GPU %.0f GB/s, CPU %.1f GB/s measured/configured; budget %.1f MiB, "
      "min %lld neurons per GPU layer\n",
      hw.name.c_str(), hw.gpu_bandwidth_gbps, hw.cpu_bandwidth_gbps, *budget / 1048576.0,
      static_cast<long long>(run->problem.min_neurons));
  for (const auto& l : j["layers"]) {
    if (l.contains("gpu_experts")) {  // a mixture of experts: whole experts, attention on the CPU
      std::string experts;
      for (const auto& e : l["gpu_experts"]) absl::StrAppend(&experts, " ", e.get<int>());
      std::printf("  layer %3d: experts on GPU:%s\n", l["layer"].get<int>(),
                  experts.empty() ? " none" : experts.c_str());
      continue;
    }
    std::printf("  layer %3d: %5lld / %lld neurons on GPU, attention %s\n", l["layer"].get<int>(),
                l["gpu_neurons"].get<long long>(), l["n_ff"].get<long long>(),
                l["attention_gpu"].get<bool>() ? "GPU" : "CPU");
  }
  const std::string quality = c["optimal"].get<bool>()
                                  ? absl::StrCat("optimal within ", 100 * so.relative_gap, "%")
                                  : absl::StrCat("time limit, best found, gap ",
                                                 100 * c["relative_gap"].get<double>(), "%");
  std::printf(
      "objective %s (%s, %.2f s): %.1f%% of neurons and %.1f%% of firing mass on the "
      "GPU, %.1f MiB used; modelled %.1f tokens/s\n",
      c["objective"].get<std::string>().c_str(), quality.c_str(), c["solver_seconds"].get<double>(),
      100 * c["gpu_neuron_fraction"].get<double>(), 100 * c["gpu_mass_fraction"].get<double>(),
      c["gpu_bytes"].get<double>() / 1048576, c["modelled_tokens_per_s"].get<double>());
  std::printf(
      "objective %s for comparison: %.1f%% of firing mass on the GPU, modelled %.1f "
      "tokens/s; all on CPU: %.1f tokens/s\n",
      o["objective"].get<std::string>().c_str(), 100 * o["gpu_mass_fraction"].get<double>(),
      o["modelled_tokens_per_s"].get<double>(), j["all_cpu_tokens_per_s"].get<double>());
  if (!args->Has("--dry-run")) std::printf("placement written to %s\n", sidecar_path->c_str());
  return 0;
}

}  // namespace thermocline::cli
