#include "server/engine_report.h"

namespace thermocline::server {

using nlohmann::json;

json PlacementSummaryJson(const PlacementSummary& p) {
  return {{"gpu_neurons", p.gpu_neurons},
          {"cpu_neurons", p.cpu_neurons},
          {"gpu_memory", p.solved ? p.gpu_memory : 0},
          {"objective", p.solved ? json(p.objective) : json(nullptr)},
          {"hardware", p.solved ? json(p.hardware) : json(nullptr)},
          {"solved", p.solved}};
}

json ProfileSummaryJson(const ProfileSummary& p) {
  return {{"sparsity", p.sparsity},
          {"recall", p.recall},
          {"layers", p.layers},
          {"tokens", p.tokens},
          {"corpus", p.corpus}};
}

json RunsOnJson(const EnginePlacement& p) {
  const bool on_device = !p.device.empty();
  return {{"device", on_device ? p.device : "cpu"},
          {"gpu_requested", p.gpu_requested},
          {"whole_gpu_layers", p.gpu_layers},
          {"input_sparse_gpu_layers", p.gpu_input_sparse_layers},
          {"gate_first_gpu_layers", p.gpu_gate_first_layers},
          {"attention_gpu_layers", p.gpu_layers + p.attention_gpu_layers},
          {"n_layer", p.n_layer},
          {"output_head", p.output_gpu ? "gpu" : "cpu"},
          {"ffn_neurons_on_gpu", p.gpu_neurons},
          {"ffn_neurons", p.ffn_neurons},
          {"gpu_bytes", p.gpu_bytes},
          {"sparse", p.sparse},
          {"sparse_source", p.sparse ? json(SparseSourceName(p.sparse_source)) : json(nullptr)},
          {"sparse_method", p.sparse ? json(p.sparse_method) : json(nullptr)},
          {"note", p.note.empty() ? json(nullptr) : json(p.note)}};
}

json EnginePlacementSummaryJson(const Engine& engine) {
  const SparsePlan* plan = engine.sparse_plan();
  if (plan == nullptr || plan->source != SparsePlan::Source::kSidecar) return nullptr;
  return PlacementSummaryJson(plan->placement);
}

}  // namespace thermocline::server
