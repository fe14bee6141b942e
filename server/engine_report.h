// The one place the engine's typed reports become JSON for the front ends: a sidecar's solved
// placement and profile, and where a served model's parts run (`runs_on` in /v1/models/{id} and
// the admin API).
#pragma once

#include "engine/runtime/engine.h"
#include "engine/sparse/sparse_plan.h"
#include "nlohmann/json.hpp"

namespace thermocline::server {

// {"gpu_neurons","cpu_neurons","gpu_memory","objective","hardware","solved"}
nlohmann::json PlacementSummaryJson(const PlacementSummary& p);
// {"sparsity","recall","layers","tokens","corpus"}
nlohmann::json ProfileSummaryJson(const ProfileSummary& p);
// {"device","gpu_requested","whole_gpu_layers","input_sparse_gpu_layers","gate_first_gpu_layers",
//  "attention_gpu_layers","n_layer","output_head","ffn_neurons_on_gpu","ffn_neurons","gpu_bytes",
//  "sparse","sparse_source","sparse_method","note"}
nlohmann::json RunsOnJson(const EnginePlacement& p);
// The solved placement of the engine's sidecar; null when it runs dense or not from a sidecar.
nlohmann::json EnginePlacementSummaryJson(const Engine& engine);

}  // namespace thermocline::server
