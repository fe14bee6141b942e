// The placement ILP, solved with COIN-OR CBC. Variables (all binary except t):
//   y[l,b]  bucket b of layer l on the GPU        a[l]  layer l's attention (+ KV) on the GPU
//   u[l]    layer l's FFN uses the GPU            w[l]  layer l uses the GPU at all (pays a sync)
//   o       output head on the GPU                t[l]  (time) the layer's FFN time, >= 0
// Constraints:
//   memory   Σ_l a[l](attn_l + kv_l) + Σ_lb y[l,b] n_lb bpn_l + Σ_l u[l] pred_l + o·head <= budget
//   link     y[l,b] <= u[l];   Σ_b n_lb y[l,b] >= m_l u[l]        (minimum neurons m_l)
//   time     w[l] >= a[l], w[l] >= u[l];  t[l] >= GPU FFN time;  t[l] >= CPU FFN time
// Objective time: minimise Σ_l (attention time + t[l] + sync·w[l]) + head time.
// Objective frequency: maximise Σ y[l,b]·firings_lb (+ a tiny tie-break for attention/head).
// Times are scaled to microseconds and memory to MiB so CBC's tolerances are meaningful.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "offline/solver/placement.h"

namespace thermocline::offline {

struct SolveOptions {
  Objective objective = Objective::kTime;
  double time_limit_s = 30.0;  // wall clock; CBC stops here and keeps the best solution found
  // CBC stops once the best solution is within this relative gap of its proven bound
  // (0: prove optimality).
  double relative_gap = 1e-4;
};

struct SolveResult {
  Placement placement;
  bool optimal = false;  // proven optimal within relative_gap (else: time limit reached)
  double gap = 0;        // relative gap between the solution and CBC's bound
  double objective = 0;  // PlacementObjective of the placement
  double seconds = 0;    // solver wall time
  int variables = 0;
  int constraints = 0;
};

// Error (with the minimum useful budget) when the budget cannot hold anything.
absl::StatusOr<SolveResult> SolvePlacement(const PlacementProblem& problem,
                                           const SolveOptions& options);

}  // namespace thermocline::offline
