// solve's step: both objectives on one problem, the chosen placement into the sidecar.
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "offline/pipeline.h"

namespace thermocline::offline {

absl::StatusOr<PlacementRun> SolvePlacementFor(const LlamaModel& model, const Sidecar& sidecar,
                                               const HardwareProfile& hw,
                                               const ProblemOptions& problem_options,
                                               const SolveOptions& solve_options) {
  if (absl::Status st = CheckSidecarMatches(sidecar, model); !st.ok()) return st;
  auto problem = BuildPlacementProblem(model, sidecar, hw, problem_options);
  if (!problem.ok()) return problem.status();
  PlacementRun run;
  run.problem = std::move(*problem);
  run.hardware = hw;
  run.objective = solve_options.objective;
  auto chosen = SolvePlacement(run.problem, solve_options);
  if (!chosen.ok()) return chosen.status();
  run.chosen = std::move(*chosen);
  SolveOptions other = solve_options;
  other.objective =
      solve_options.objective == Objective::kTime ? Objective::kFrequency : Objective::kTime;
  other.time_limit_s = std::max(1.0, solve_options.time_limit_s / 3);
  auto second = SolvePlacement(run.problem, other);
  if (!second.ok()) return second.status();
  run.other = std::move(*second);
  return run;
}

void ApplyPlacement(const PlacementRun& run, Sidecar& s) {
  const PlacementProblem& p = run.problem;
  const Placement& x = run.chosen.placement;
  SidecarPlacement& sp = s.placement;
  sp.present = true;
  sp.objective = ObjectiveName(run.objective);
  sp.hardware = run.hardware.name;
  sp.gpu_budget_bytes = static_cast<uint64_t>(p.budget_bytes + p.scratch_bytes);  // the cap
  sp.gpu_bytes = static_cast<uint64_t>(PlacementGpuBytes(p, x) + p.scratch_bytes);
  sp.bucket_size = p.layers.empty() ? 0 : p.layers[0].bucket_neurons(0);
  sp.min_neurons = p.min_neurons;
  sp.context = p.context;
  sp.output_gpu = x.output_gpu;
  int64_t gpu_neurons = 0, neurons = 0;
  for (size_t l = 0; l < p.layers.size(); ++l) {
    SidecarLayer& y = s.layers[l];
    if (p.experts) {  // whole experts: the layer's expert flags, no neuron tables
      y.expert_gpu.assign(s.n_expert, 0);
      for (int32_t e : GpuExperts(p, x, l)) y.expert_gpu[e] = 1;
      y.n_gpu = 0;
      y.neuron_order.clear();
      y.attention_gpu = false;
      gpu_neurons += x.GpuNeurons(p, l);
      neurons += p.layers[l].n_ff;
      continue;
    }
    std::vector<int32_t> gpu, cpu;
    for (size_t b = 0; b < p.layers[l].buckets.size(); ++b) {
      auto& dst = x.gpu_bucket[l][b] ? gpu : cpu;
      dst.insert(dst.end(), p.layers[l].buckets[b].begin(), p.layers[l].buckets[b].end());
    }
    std::sort(gpu.begin(), gpu.end());
    std::sort(cpu.begin(), cpu.end());
    y.n_gpu = static_cast<int64_t>(gpu.size());
    y.neuron_order = gpu;
    y.neuron_order.insert(y.neuron_order.end(), cpu.begin(), cpu.end());
    y.attention_gpu = x.attention_gpu[l] != 0;
    gpu_neurons += y.n_gpu;
    neurons += p.layers[l].n_ff;
  }
  sp.gpu_neuron_fraction = static_cast<double>(gpu_neurons) / std::max<int64_t>(1, neurons);
  const double total = TotalFiringMass(p);
  sp.gpu_mass_fraction = total > 0 ? PlacementFiringMass(p, x) / total : 0;
  sp.tokens_per_s = 1.0 / PlacementSeconds(p, x);
  const SolveResult& t = run.objective == Objective::kTime ? run.chosen : run.other;
  const SolveResult& f = run.objective == Objective::kTime ? run.other : run.chosen;
  sp.tokens_per_s_time = 1.0 / PlacementSeconds(p, t.placement);
  sp.tokens_per_s_frequency = 1.0 / PlacementSeconds(p, f.placement);
}

nlohmann::json PlacementJson(const PlacementRun& run) {
  const PlacementProblem& p = run.problem;
  auto summary = [&](const SolveResult& r, Objective o) {
    const double total = TotalFiringMass(p);
    int64_t gpu = 0, all = 0;
    for (size_t l = 0; l < p.layers.size(); ++l) {
      gpu += r.placement.GpuNeurons(p, l);
      all += p.layers[l].n_ff;
    }
    return nlohmann::json{
        {"objective", ObjectiveName(o)},
        {"optimal", r.optimal},
        {"relative_gap", r.gap},
        {"solver_seconds", r.seconds},
        {"variables", r.variables},
        {"constraints", r.constraints},
        {"gpu_bytes", PlacementGpuBytes(p, r.placement)},
        {"gpu_neuron_fraction", static_cast<double>(gpu) / std::max<int64_t>(1, all)},
        {"gpu_mass_fraction", total > 0 ? PlacementFiringMass(p, r.placement) / total : 0},
        {"modelled_tokens_per_s", 1.0 / PlacementSeconds(p, r.placement)}};
  };
  const Objective other =
      run.objective == Objective::kTime ? Objective::kFrequency : Objective::kTime;
  nlohmann::json layers = nlohmann::json::array();
  for (size_t l = 0; l < p.layers.size(); ++l) {
    nlohmann::json layer = {{"layer", l},
                            {"gpu_neurons", run.chosen.placement.GpuNeurons(p, l)},
                            {"n_ff", p.layers[l].n_ff},
                            {"attention_gpu", run.chosen.placement.attention_gpu[l] != 0}};
    if (p.experts) layer["gpu_experts"] = GpuExperts(p, run.chosen.placement, l);
    layers.push_back(std::move(layer));
  }
  return {{"hardware", run.hardware.name},
          {"gpu_budget_bytes", p.budget_bytes},
          {"cpu_bandwidth_gbps", run.hardware.cpu_bandwidth_gbps},
          {"gpu_bandwidth_gbps", run.hardware.gpu_bandwidth_gbps},
          {"min_neurons", p.min_neurons},
          {"all_cpu_tokens_per_s", 1.0 / PlacementSeconds(p, Placement::AllCpu(p))},
          {"output_gpu", run.chosen.placement.output_gpu},
          {"chosen", summary(run.chosen, run.objective)},
          {"other", summary(run.other, other)},
          {"layers", layers}};
}

}  // namespace thermocline::offline
