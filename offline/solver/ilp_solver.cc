// CBC formulation of the placement ILP (see ilp_solver.h for the model).
#include "offline/solver/ilp_solver.h"

#include <chrono>
#include <cmath>
#include <iterator>
#include <vector>

#include "CbcModel.hpp"
#include "CbcSolver.hpp"
#include "CoinPackedMatrix.hpp"
#include "OsiClpSolverInterface.hpp"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace thermocline::offline {
namespace {

constexpr double kMiB = 1024.0 * 1024.0;
constexpr double kMicro = 1e6;

// Columns and rows built up before loading into the solver.
struct Lp {
  std::vector<double> lb, ub, obj;
  std::vector<bool> integer;
  CoinPackedMatrix rows{false, 0, 0};
  std::vector<double> row_lb, row_ub;

  int Add(double cost, bool is_int, double lo = 0, double hi = 1) {
    lb.push_back(lo);
    ub.push_back(hi);
    obj.push_back(cost);
    integer.push_back(is_int);
    return static_cast<int>(obj.size()) - 1;
  }
  void Row(const std::vector<int>& idx, const std::vector<double>& coef, double lo, double hi) {
    rows.appendRow(static_cast<int>(idx.size()), idx.data(), coef.data());
    row_lb.push_back(lo);
    row_ub.push_back(hi);
  }
};

int QuietCallback(CbcModel*, int) { return 0; }

}  // namespace

absl::StatusOr<SolveResult> SolvePlacement(const PlacementProblem& p, const SolveOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  const double min_budget = MinimumUsefulBudget(p);
  if (!(p.budget_bytes >= min_budget)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "GPU memory budget %.0f bytes (%.2f MiB) is too small to place anything on the GPU; "
        "the minimum useful budget is %.0f bytes (%.2f MiB, with %.2f MiB of scratch)",
        p.budget_bytes + p.scratch_bytes, (p.budget_bytes + p.scratch_bytes) / kMiB,
        std::ceil(min_budget + p.scratch_bytes), (min_budget + p.scratch_bytes) / kMiB,
        p.scratch_bytes / kMiB));
  }
  const bool time = options.objective == Objective::kTime;
  const double g = p.gpu_bytes_per_s, c = p.cpu_bytes_per_s;
  const size_t L = p.layers.size();
  Lp lp;
  std::vector<std::vector<int>> y(L);
  std::vector<int> a(L), u(L), w(L, -1), t(L, -1);
  std::vector<int> mem_idx;
  std::vector<double> mem_coef;
  for (size_t l = 0; l < L; ++l) {
    const LayerCosts& C = p.layers[l];
    const double attn_time_delta = (C.attn_bytes + C.kv_read_bytes) * (1.0 / g - 1.0 / c) * kMicro;
    // Experts: attention stays on the CPU (a[l] and o fixed at 0).
    a[l] = lp.Add(time ? attn_time_delta : -kFrequencyTieBreak, true, 0, p.experts ? 0 : 1);
    u[l] = lp.Add(0, true);
    if (time) {
      w[l] = lp.Add(p.sync_s * kMicro, true);
      t[l] = lp.Add(1.0, false, 0, COIN_DBL_MAX);
    }
    for (size_t b = 0; b < C.buckets.size(); ++b) {
      y[l].push_back(lp.Add(time ? 0 : -C.bucket_freq[b], true));
    }
    mem_idx.push_back(a[l]);
    mem_coef.push_back((C.attn_bytes + C.kv_bytes) / kMiB);
    mem_idx.push_back(u[l]);
    mem_coef.push_back(C.predictor_bytes / kMiB);
    for (size_t b = 0; b < C.buckets.size(); ++b) {
      mem_idx.push_back(y[l][b]);
      mem_coef.push_back(C.bucket_neurons(b) * C.bytes_per_neuron / kMiB);
    }
  }
  const int o = lp.Add(time ? p.output_bytes * (1.0 / g - 1.0 / c) * kMicro : -kFrequencyTieBreak,
                       true, 0, p.experts ? 0 : 1);
  mem_idx.push_back(o);
  mem_coef.push_back(p.output_bytes / kMiB);
  lp.rows.setDimensions(0, static_cast<int>(lp.obj.size()));
  lp.Row(mem_idx, mem_coef, -COIN_DBL_MAX, p.budget_bytes / kMiB);

  for (size_t l = 0; l < L; ++l) {
    const LayerCosts& C = p.layers[l];
    std::vector<int> idx = {u[l]};
    std::vector<double> coef = {-static_cast<double>(p.MinNeurons(l))};
    for (size_t b = 0; b < C.buckets.size(); ++b) {
      lp.Row({y[l][b], u[l]}, {1, -1}, -COIN_DBL_MAX, 0);
      idx.push_back(y[l][b]);
      coef.push_back(static_cast<double>(C.bucket_neurons(b)));
      // Frequency objective: among equal-size buckets a hotter one is never worse, so only
      // prefixes need be searched (cuts symmetric solutions, keeps an optimum).
      if (!time && b + 1 < C.buckets.size() && C.bucket_neurons(b) == C.bucket_neurons(b + 1)) {
        lp.Row({y[l][b], y[l][b + 1]}, {1, -1}, 0, COIN_DBL_MAX);
      }
    }
    lp.Row(idx, coef, 0, COIN_DBL_MAX);
    if (!time) continue;
    lp.Row({w[l], a[l]}, {1, -1}, 0, COIN_DBL_MAX);
    lp.Row({w[l], u[l]}, {1, -1}, 0, COIN_DBL_MAX);
    // t >= Σ y·work·bpn/g + u·pred/g;  t >= Σ (1-y)·work·bpn/c + (1-u)·pred/c.
    std::vector<int> gi = {t[l], u[l]}, ci = {t[l], u[l]};
    std::vector<double> gc = {1, -C.predictor_bytes / g * kMicro};
    std::vector<double> cc = {1, C.predictor_bytes / c * kMicro};
    double cpu_all = C.predictor_bytes / c * kMicro;
    for (size_t b = 0; b < C.buckets.size(); ++b) {
      const double bw = C.bucket_work[b] * C.bytes_per_neuron * kMicro;
      gi.push_back(y[l][b]);
      gc.push_back(-bw / g);
      ci.push_back(y[l][b]);
      cc.push_back(bw / c);
      cpu_all += bw / c;
    }
    lp.Row(gi, gc, 0, COIN_DBL_MAX);
    lp.Row(ci, cc, cpu_all, COIN_DBL_MAX);
  }

  OsiClpSolverInterface solver;
  solver.loadProblem(lp.rows, lp.lb.data(), lp.ub.data(), lp.obj.data(), lp.row_lb.data(),
                     lp.row_ub.data());
  for (size_t i = 0; i < lp.integer.size(); ++i) {
    if (lp.integer[i]) solver.setInteger(static_cast<int>(i));  // bounds [0,1]: binary
  }
  solver.messageHandler()->setLogLevel(0);
  CbcModel model(solver);
  model.setLogLevel(0);
  CbcSolverUsefulData data;
  CbcMain0(model, data);
  data.noPrinting_ = true;
  model.setUseElapsedTime(true);
  const std::string seconds = absl::StrCat(std::max(0.1, options.time_limit_s));
  const std::string gap = absl::StrCat(std::max(0.0, options.relative_gap));
  const char* argv[] = {"thermocline", "-timeMode", "elapsed", "-sec", seconds.c_str(),
                        "-ratioGap",   gap.c_str(), "-log",    "0",    "-solve",
                        "-quit"};
  CbcMain1(static_cast<int>(std::size(argv)), argv, model, QuietCallback, data);

  const double* sol = model.bestSolution();
  if (sol == nullptr) {
    return absl::DeadlineExceededError(absl::StrCat(
        "CBC found no placement within ", options.time_limit_s, " s; raise --time-limit"));
  }
  SolveResult r;
  r.placement = Placement::AllCpu(p);
  for (size_t l = 0; l < L; ++l) {
    r.placement.attention_gpu[l] = sol[a[l]] > 0.5;
    for (size_t b = 0; b < y[l].size(); ++b) r.placement.gpu_bucket[l][b] = sol[y[l][b]] > 0.5;
  }
  r.placement.output_gpu = sol[o] > 0.5;
  if (!PlacementFeasible(p, r.placement)) {
    return absl::InternalError(
        "CBC returned a placement that breaks the memory budget or the "
        "minimum-neurons rule");
  }
  r.optimal = model.isProvenOptimal();
  const double found = model.getObjValue(), bound = model.getBestPossibleObjValue();
  r.gap = std::abs(found - bound) / std::max(1e-12, std::abs(found));
  r.objective = PlacementObjective(p, r.placement, options.objective);
  r.variables = static_cast<int>(lp.obj.size());
  r.constraints = static_cast<int>(lp.row_lb.size());
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return r;
}

}  // namespace thermocline::offline
