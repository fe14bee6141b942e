// The placement ILP against brute force on instances small enough to enumerate, the memory
// budget and minimum-neurons rule, PowerInfer's objective against the greedy top-k choice, and
// the hardware profile files.
#include <algorithm>
#include <filesystem>
#include <random>

#include "offline/solver/hardware.h"
#include "offline/solver/ilp_solver.h"
#include "offline/solver/placement.h"
#include "test_util.h"

namespace thermocline::offline {
namespace {

double U(std::mt19937& rng, double lo, double hi) {
  return std::uniform_real_distribution<double>(lo, hi)(rng);
}
int I(std::mt19937& rng, int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); }

// 2-3 layers, 1-4 buckets each (equal sizes, the last maybe smaller), costs in the ranges a
// real model has relative to each other (a sync costs about one layer's CPU FFN time).
PlacementProblem RandomProblem(std::mt19937& rng) {
  PlacementProblem p;
  const int layers = I(rng, 2, 3);
  int32_t id = 0;
  double all_bytes = 0;
  for (int l = 0; l < layers; ++l) {
    LayerCosts L;
    const int nb = I(rng, 1, 4), size = I(rng, 2, 4), last = I(rng, 1, size);
    const double precision = U(rng, 0.5, 1.0);
    double freq = U(rng, 0.5, 1.0);
    for (int b = 0; b < nb; ++b) {
      const int n = b + 1 == nb ? last : size;
      std::vector<int32_t> ids;
      double mass = 0;
      for (int i = 0; i < n; ++i, freq *= U(rng, 0.3, 1.0)) {
        ids.push_back(id++);
        mass += freq;
      }
      L.buckets.push_back(ids);
      L.bucket_freq.push_back(mass);
      L.bucket_work.push_back(mass / precision);
      L.n_ff += n;
    }
    L.bytes_per_neuron = U(rng, 1e3, 3e3);
    L.attn_bytes = U(rng, 2e3, 2e4);
    L.kv_bytes = U(rng, 0, 8e3);
    L.kv_read_bytes = L.kv_bytes / 2;
    L.predictor_bytes = U(rng, 0, 4e3);
    all_bytes += L.n_ff * L.bytes_per_neuron + L.attn_bytes + L.kv_bytes + L.predictor_bytes;
    p.layers.push_back(std::move(L));
  }
  p.output_bytes = U(rng, 0, 3e4);
  all_bytes += p.output_bytes;
  p.min_neurons = I(rng, 0, 6);
  p.gpu_bytes_per_s = U(rng, 5e10, 2e11);
  p.cpu_bytes_per_s = U(rng, 5e9, 2e10);
  p.sync_s = U(rng, 0, 2e-6);
  p.budget_bytes = std::max(MinimumUsefulBudget(p), U(rng, 0.05, 0.9) * all_bytes);
  return p;
}

// Every placement: bit k of `mask` decides the k-th binary (buckets, then attention, then head).
Placement BruteForceBest(const PlacementProblem& p, Objective o, double* best_value) {
  std::vector<std::pair<size_t, size_t>> bits;  // (layer, bucket); bucket == npos: attention
  for (size_t l = 0; l < p.layers.size(); ++l) {
    for (size_t b = 0; b < p.layers[l].buckets.size(); ++b) bits.push_back({l, b});
    bits.push_back({l, std::string::npos});
  }
  const size_t n = bits.size() + 1;
  REQUIRE(n <= 20);
  Placement best;
  *best_value = -INFINITY;
  for (uint32_t mask = 0; mask < (1u << n); ++mask) {
    Placement x = Placement::AllCpu(p);
    for (size_t k = 0; k < bits.size(); ++k) {
      if (!((mask >> k) & 1)) continue;
      auto [l, b] = bits[k];
      if (b == std::string::npos) {
        x.attention_gpu[l] = 1;
      } else {
        x.gpu_bucket[l][b] = 1;
      }
    }
    x.output_gpu = (mask >> bits.size()) & 1;
    if (!PlacementFeasible(p, x)) continue;
    const double v = PlacementObjective(p, x, o);
    if (v > *best_value) {
      *best_value = v;
      best = x;
    }
  }
  return best;
}

TEST_CASE("placement ILP finds the brute-force optimum", "[offline]") {
  std::mt19937 rng(20240607);
  for (Objective o : {Objective::kTime, Objective::kFrequency}) {
    for (int trial = 0; trial < 40; ++trial) {
      INFO("objective " << ObjectiveName(o) << " trial " << trial);
      const PlacementProblem p = RandomProblem(rng);
      double best = 0;
      BruteForceBest(p, o, &best);
      SolveOptions so;
      so.objective = o;
      so.time_limit_s = 10;
      so.relative_gap = 0;  // prove optimality
      auto r = SolvePlacement(p, so);
      REQUIRE(r.ok());
      CHECK(r->optimal);
      // The ILP works in microseconds / MiB; its optimum equals the enumerated one to well
      // within CBC's relative tolerances (1e-9 feasibility, 1e-6 here for the objective).
      CHECK(r->objective == Approx(best).epsilon(1e-6).margin(1e-7));
      // The memory budget and the minimum-neurons rule, checked directly.
      CHECK(PlacementGpuBytes(p, r->placement) <= p.budget_bytes * (1 + 1e-9));
      for (size_t l = 0; l < p.layers.size(); ++l) {
        const int64_t n = r->placement.GpuNeurons(p, l);
        CHECK((n == 0 || n >= p.MinNeurons(l)));
      }
    }
  }
}

TEST_CASE("with only memory binding, frequency placement is the greedy top-k", "[offline]") {
  std::mt19937 rng(7);
  PlacementProblem p;
  std::vector<std::pair<double, int32_t>> all;  // (frequency, neuron id)
  int32_t id = 0;
  for (int l = 0; l < 3; ++l) {
    LayerCosts L;
    std::vector<double> f(20);
    for (double& v : f) v = U(rng, 0, 1);
    std::sort(f.rbegin(), f.rend());
    for (double v : f) {
      L.buckets.push_back({id});
      L.bucket_freq.push_back(v);
      L.bucket_work.push_back(v);
      all.push_back({v, id++});
    }
    L.n_ff = 20;
    L.bytes_per_neuron = 1000;
    p.layers.push_back(std::move(L));
  }
  p.min_neurons = 0;
  const int k = 17;
  p.budget_bytes = k * 1000;
  SolveOptions so;
  so.objective = Objective::kFrequency;
  auto r = SolvePlacement(p, so);
  REQUIRE(r.ok());
  std::sort(all.rbegin(), all.rend());
  std::vector<int32_t> greedy, ilp;
  for (int i = 0; i < k; ++i) greedy.push_back(all[i].second);
  for (size_t l = 0; l < p.layers.size(); ++l) {
    for (size_t b = 0; b < p.layers[l].buckets.size(); ++b) {
      if (r->placement.gpu_bucket[l][b]) ilp.push_back(p.layers[l].buckets[b][0]);
    }
  }
  std::sort(greedy.begin(), greedy.end());
  std::sort(ilp.begin(), ilp.end());
  CHECK(ilp == greedy);
}

TEST_CASE("a budget too small for anything is refused with the minimum", "[offline]") {
  std::mt19937 rng(3);
  PlacementProblem p = RandomProblem(rng);
  const double min_budget = MinimumUsefulBudget(p);
  p.budget_bytes = min_budget * 0.5;
  auto r = SolvePlacement(p, SolveOptions{});
  REQUIRE(!r.ok());
  CHECK(std::string(r.status().message()).find("minimum useful budget") != std::string::npos);
  p.budget_bytes = min_budget;
  CHECK(SolvePlacement(p, SolveOptions{}).ok());
}

TEST_CASE("hardware profiles parse and typos are errors", "[offline]") {
  const auto dir = std::filesystem::path(THERMOCLINE_SOURCE_DIR) / "configs" / "hardware";
  int files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().extension() != ".toml") continue;
    auto hw = ReadHardwareProfile(entry.path().string());
    INFO(entry.path());
    REQUIRE(hw.ok());
    CHECK(hw->gpu_bandwidth_gbps > 100);
    CHECK(hw->gpu_memory_bytes >= 8e9);
    ++files;
  }
  CHECK(files >= 3);
  auto bad = ParseHardwareProfile("[gpu]\nbandwidth_gbs = 300\n");
  REQUIRE(!bad.ok());
  CHECK(std::string(bad.status().message()).find("bandwidth_gbs") != std::string::npos);
  HardwareProfile hw;
  hw.name = "x";
  hw.cpu_bandwidth_gbps = 12.5;
  auto round = ParseHardwareProfile(FormatHardwareProfile(hw));
  REQUIRE(round.ok());
  CHECK(round->cpu_bandwidth_gbps == Approx(12.5));
  CHECK(round->name == "x");
}

}  // namespace
}  // namespace thermocline::offline
