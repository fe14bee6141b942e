// thermocline bench --ops: the sparse operator benchmark (bench/sparse_op_bench.h) as a
// table or JSON, with the bar per type: at 10% active, sparse gate+up+down <= 20% of
// dense.
#include <cmath>
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "bench/sparse_op_bench.h"
#include "nlohmann/json.hpp"
#include "tools/commands.h"

namespace thermocline::cli {
namespace {

constexpr double kBarFraction = 0.10;  // the check: at 10% active ...
constexpr double kBarRatio = 0.20;     // ... sparse takes at most 20% of dense

constexpr char kUsage[] =
    "usage: thermocline bench --ops [--embd 2048] [--ff 5632] [--types f32,f16,bf16,q8_0,q4_0]\n"
    "         [--fractions 0.01,0.02,0.05,0.1,0.2,0.5,1] [--pattern random|mixed|both]\n"
    "         [--gate-up interleaved|separate] [--threads N] [--repetitions 21]\n"
    "         [--weights-mib 256] [--seed 1] [--json]\n"
    "  dense gate+up+down of one token (MatMul over the row groups the engine's dense path\n"
    "  reads for Q4_0 and the K-quants, else the rows) against the sparse operators (fused\n"
    "  row-sparse gate/up + axpy over down_t) at each active fraction, random weights of the FFN\n"
    "  shape; median of interleaved runs (min ratio: of the fastest runs). --pattern mixed: half\n"
    "  the active set a contiguous hot block.\n"
    "  read floor: the time of only reading the sparse path's rows (a word per cache line) over\n"
    "  the dense time: the ratio of a sparse path whose kernels cost nothing beyond the reads.\n"
    "  --gate-up: the sparse path reads a neuron's gate, up and down_t rows interleaved (one\n"
    "  read per neuron, as the engine does) or as three matrices. --weights-mib: weight copies\n"
    "  cycled so that no op finds its weights in cache.\n";

absl::Status ParseList(const std::string& flag, const std::string& text,
                       std::vector<std::string>* out) {
  out->clear();
  for (absl::string_view part : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    out->emplace_back(part);
  }
  if (out->empty()) return absl::InvalidArgumentError(absl::StrCat(flag, " is empty"));
  return absl::OkStatus();
}

absl::StatusOr<SparseOpBenchOptions> OptionsFromArgs(const Args& args) {
  SparseOpBenchOptions o;
  auto embd = args.GetInt("--embd", o.n_embd);
  auto ff = args.GetInt("--ff", o.n_ff);
  auto reps = args.GetInt("--repetitions", o.repetitions);
  auto mib = args.GetInt("--weights-mib", o.min_weight_bytes >> 20);
  auto seed = args.GetInt("--seed", static_cast<int64_t>(o.seed));
  for (auto* v : {&embd, &ff, &reps, &mib, &seed}) {
    if (!v->ok()) return v->status();
  }
  if (*reps < 1 || *reps > 100000) {
    return absl::InvalidArgumentError("--repetitions must be in [1, 100000]");
  }
  if (*mib < 0) return absl::InvalidArgumentError("--weights-mib must be >= 0");
  o.n_embd = *embd;
  o.n_ff = *ff;
  o.repetitions = static_cast<int>(*reps);
  o.min_weight_bytes = *mib << 20;
  o.seed = static_cast<uint64_t>(*seed);
  std::vector<std::string> items;
  if (auto types = args.Get("--types")) {
    if (absl::Status s = ParseList("--types", *types, &items); !s.ok()) return s;
    o.types.clear();
    for (const std::string& name : items) {
      const GgmlTypeInfo* info = FindGgmlTypeByName(name);
      if (info == nullptr) {
        return absl::InvalidArgumentError(
            absl::StrCat("--types: unknown type '", name, "'; use f32, f16, bf16, q8_0, q4_0"));
      }
      o.types.push_back(info->type);
    }
  }
  if (auto fractions = args.Get("--fractions")) {
    if (absl::Status s = ParseList("--fractions", *fractions, &items); !s.ok()) return s;
    o.fractions.clear();
    for (const std::string& item : items) {
      double f;
      if (!absl::SimpleAtod(item, &f)) {
        return absl::InvalidArgumentError(
            absl::StrCat("--fractions: '", item, "' is not a number (e.g. 0.1 for 10%)"));
      }
      o.fractions.push_back(f);
    }
  }
  const std::string layout = args.GetOr("--gate-up", "interleaved");
  if (layout != "separate" && layout != "interleaved") {
    return absl::InvalidArgumentError(
        absl::StrCat("--gate-up '", layout, "': use separate or interleaved"));
  }
  o.interleave_gate_up = layout == "interleaved";
  const std::string pattern = args.GetOr("--pattern", "random");
  if (pattern == "random") {
    o.patterns = {ActivePattern::kRandom};
  } else if (pattern == "mixed") {
    o.patterns = {ActivePattern::kMixed};
  } else if (pattern == "both") {
    o.patterns = {ActivePattern::kRandom, ActivePattern::kMixed};
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("--pattern '", pattern, "': use random, mixed or both"));
  }
  return o;
}

// The bar's row of a type: its first pattern at 10% active; nullptr when not measured.
const SparseOpBenchRow* BarRow(const SparseOpBenchResult& r, GgmlType type) {
  for (const SparseOpBenchRow& row : r.rows) {
    if (row.type == type && std::abs(row.fraction - kBarFraction) < 1e-9) return &row;
  }
  return nullptr;
}

void PrintJson(const SparseOpBenchOptions& o, const SparseOpBenchResult& r) {
  nlohmann::json rows = nlohmann::json::array();
  for (const SparseOpBenchRow& row : r.rows) {
    rows.push_back({{"type", TypeName(row.type)},
                    {"pattern", ActivePatternName(row.pattern)},
                    {"fraction", row.fraction},
                    {"active", row.active},
                    {"dense_us", row.dense_us},
                    {"dense_gate_up_us", row.dense_gate_up_us},
                    {"dense_down_us", row.dense_down_us},
                    {"sparse_us", row.sparse_us},
                    {"sparse_gate_up_us", row.sparse_gate_up_us},
                    {"sparse_down_us", row.sparse_down_us},
                    {"ratio", row.ratio()},
                    {"dense_min_us", row.dense_min_us},
                    {"sparse_min_us", row.sparse_min_us},
                    {"min_ratio", row.min_ratio()},
                    {"dense_read_us", row.dense_read_us},
                    {"sparse_read_us", row.sparse_read_us},
                    {"read_floor", row.read_floor()},
                    {"ideal_ratio", row.ideal()}});
  }
  nlohmann::json bar = nlohmann::json::array();
  for (size_t t = 0; t < o.types.size(); ++t) {
    if (const SparseOpBenchRow* row = BarRow(r, o.types[t])) {
      bar.push_back({{"type", TypeName(row->type)},
                     {"pattern", ActivePatternName(row->pattern)},
                     {"ratio", row->ratio()},
                     {"read_floor", row->read_floor()},
                     {"pass", row->ratio() <= kBarRatio}});
    }
  }
  nlohmann::json out = {
      {"threads", r.threads},
      {"isa", IsaName(r.isa)},
      {"n_embd", r.n_embd},
      {"n_ff", r.n_ff},
      {"repetitions", r.repetitions},
      {"rows", rows},
      {"bar", {{"fraction", kBarFraction}, {"max_ratio", kBarRatio}, {"types", bar}}}};
  std::cout << out.dump(2) << "\n";
}

void PrintTable(const SparseOpBenchOptions& o, const SparseOpBenchResult& r) {
  std::printf(
      "sparse FFN operators: n_embd %lld, n_ff %lld, threads %d, %s, median of %d interleaved "
      "runs\n",
      static_cast<long long>(r.n_embd), static_cast<long long>(r.n_ff), r.threads, IsaName(r.isa),
      r.repetitions);
  std::printf("%-5s %-7s %7s %6s %10s %10s %7s %6s %9s %8s %9s %10s\n", "type", "pattern", "active",
              "rows", "dense us", "sparse us", "ratio", "ideal", "g+u ratio", "dn ratio",
              "min ratio", "read floor");
  for (const SparseOpBenchRow& row : r.rows) {
    const double gu = row.dense_gate_up_us > 0 ? row.sparse_gate_up_us / row.dense_gate_up_us : 0;
    const double dn = row.dense_down_us > 0 ? row.sparse_down_us / row.dense_down_us : 0;
    std::printf("%-5s %-7s %6.1f%% %6lld %10.1f %10.1f %7.3f %6.3f %9.3f %8.3f %9.3f %10.3f\n",
                TypeName(row.type), ActivePatternName(row.pattern), 100 * row.fraction,
                static_cast<long long>(row.active), row.dense_us, row.sparse_us, row.ratio(),
                row.ideal(), gu, dn, row.min_ratio(), row.read_floor());
  }
  std::printf("bar: at %.0f%% active, sparse gate+up+down <= %.0f%% of dense\n", 100 * kBarFraction,
              100 * kBarRatio);
  for (GgmlType type : o.types) {
    if (const SparseOpBenchRow* row = BarRow(r, type)) {
      std::printf(
          "  %-5s %-7s ratio %.3f  %s  (read floor %.3f%s)\n", TypeName(type),
          ActivePatternName(row->pattern), row->ratio(),
          row->ratio() <= kBarRatio ? "PASS" : "FAIL", row->read_floor(),
          row->read_floor() > kBarRatio ? ": only reading the rows is over the bar here" : "");
    }
  }
}

}  // namespace

int RunBenchOps(int argc, char** argv) {
  auto args = Args::Parse(argc, argv,
                          {"--embd", "--ff", "--types", "--fractions", "--pattern", "--threads",
                           "--repetitions", "--weights-mib", "--seed", "--gate-up"},
                          {"--ops", "--json", "--help"}, {{"-t", "--threads"}, {"-h", "--help"}});
  if (!args.ok()) return Fail("bench --ops", args.status(), true);
  if (args->Has("--help")) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  auto options = OptionsFromArgs(*args);
  if (!options.ok()) return Fail("bench --ops", options.status(), true);
  auto threads = ThreadsFromArgs(*args);
  if (!threads.ok()) return Fail("bench --ops", threads.status(), true);
  ThreadPool pool(*threads);
  auto result = RunSparseOpBench(pool, *options);
  if (!result.ok()) return Fail("bench --ops", result.status(), true);
  if (args->Has("--json")) {
    PrintJson(*options, *result);
  } else {
    PrintTable(*options, *result);
  }
  return 0;
}

}  // namespace thermocline::cli
