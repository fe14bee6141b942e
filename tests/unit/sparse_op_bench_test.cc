// The sparse operator benchmark (bench/sparse_op_bench.h) and `thermocline bench --ops`:
// what they measure and report on a tiny shape, and their argument errors. Speed itself is the
// benchmark's business, never a unit test's.
#include "bench/sparse_op_bench.h"

#include <catch2/catch.hpp>
#include <set>
#include <string>

#include "nlohmann/json.hpp"
#include "test_util.h"

namespace thermocline {
namespace {

SparseOpBenchOptions Tiny() {
  SparseOpBenchOptions o;
  o.n_embd = 64;
  o.n_ff = 160;
  o.fractions = {0.05, 0.5, 1.0};
  o.patterns = {ActivePattern::kRandom, ActivePattern::kMixed};
  o.repetitions = 3;
  o.min_weight_bytes = 0;
  return o;
}

TEST_CASE("operator benchmark measures every type, pattern and fraction", "[sparse][bench]") {
  ThreadPool pool(2);
  const SparseOpBenchOptions o = Tiny();
  absl::StatusOr<SparseOpBenchResult> r = RunSparseOpBench(pool, o);
  REQUIRE(r.ok());
  REQUIRE(r->threads == 2);
  REQUIRE(r->isa == BestIsa());
  REQUIRE(r->rows.size() == o.types.size() * o.patterns.size() * o.fractions.size());
  REQUIRE(r->layers.size() == o.types.size());
  std::set<std::string> seen;
  for (int layers : r->layers) REQUIRE(layers >= 2);  // cycled copies even when small
  for (const SparseOpBenchRow& row : r->rows) {
    seen.insert(std::string(TypeName(row.type)) + ActivePatternName(row.pattern) +
                std::to_string(row.fraction));
    const int64_t expect = row.fraction == 0.05 ? 8 : row.fraction == 0.5 ? 80 : 160;
    REQUIRE(row.active == expect);
    REQUIRE(row.ideal() == Approx(static_cast<double>(expect) / 160));
    REQUIRE(row.dense_us > 0);
    REQUIRE(row.sparse_us > 0);
    REQUIRE(row.dense_gate_up_us > 0);
    REQUIRE(row.sparse_down_us > 0);
    REQUIRE(row.ratio() == Approx(row.sparse_us / row.dense_us));
    REQUIRE(row.dense_read_us > 0);
    REQUIRE(row.sparse_read_us > 0);
    REQUIRE(row.read_floor() == Approx(row.sparse_read_us / row.dense_us));
  }
  REQUIRE(seen.size() == r->rows.size());
}

TEST_CASE("operator benchmark refuses bad options", "[sparse][bench]") {
  ThreadPool pool(1);
  SparseOpBenchOptions o = Tiny();
  o.fractions = {0.0};
  REQUIRE(RunSparseOpBench(pool, o).status().code() == absl::StatusCode::kInvalidArgument);
  o = Tiny();
  o.fractions = {1.5};
  REQUIRE(!RunSparseOpBench(pool, o).ok());
  o = Tiny();
  o.n_embd = 48;  // not a multiple of the 32-element blocks
  absl::StatusOr<SparseOpBenchResult> r = RunSparseOpBench(pool, o);
  REQUIRE(!r.ok());
  REQUIRE(std::string(r.status().message()).find("multiples of 32") != std::string::npos);
  o = Tiny();
  o.types = {GgmlType::kQ4_K};
  REQUIRE(!RunSparseOpBench(pool, o).ok());
  o = Tiny();
  o.repetitions = 0;
  REQUIRE(!RunSparseOpBench(pool, o).ok());
}

TEST_CASE("bench --ops prints JSON rows and the 10% bar per type", "[sparse][bench][cli]") {
  const testing::CliResult r = testing::RunThermocline(
      "bench --ops --embd 64 --ff 320 --types q4_0,f16 --fractions 0.1,1 --pattern both "
      "--repetitions 2 --weights-mib 0 --threads 2 --json");
  if (r.out.find("--ops") != std::string::npos && r.exit_code == 2) {
    THERMOCLINE_SKIP("tools/cmd_bench.cc does not hand --ops to RunBenchOps yet: " + r.out);
  }
  INFO(r.out);
  REQUIRE(r.exit_code == 0);
  const nlohmann::json j = nlohmann::json::parse(r.out);
  REQUIRE(j["threads"] == 2);
  REQUIRE(j["n_embd"] == 64);
  REQUIRE(j["rows"].size() == 2 * 2 * 2);
  REQUIRE(j["rows"][0]["type"] == "q4_0");
  REQUIRE(j["rows"][0]["active"] == 32);
  REQUIRE(j["bar"]["types"].size() == 2);
  for (const nlohmann::json& t : j["bar"]["types"]) {
    REQUIRE(t["pass"].get<bool>() == (t["ratio"].get<double>() <= 0.20));
    REQUIRE(t["read_floor"].get<double>() > 0);
  }
  for (const nlohmann::json& row : j["rows"]) {
    REQUIRE(row["read_floor"].get<double>() ==
            Approx(row["sparse_read_us"].get<double>() / row["dense_us"].get<double>()));
  }

  const testing::CliResult table = testing::RunThermocline(
      "bench --ops --embd 64 --ff 320 --types bf16 --fractions 0.1 --repetitions 1 "
      "--weights-mib 0 --threads 1");
  INFO(table.out);
  REQUIRE(table.exit_code == 0);
  REQUIRE(table.out.find("bf16  random") != std::string::npos);
  REQUIRE(table.out.find("read floor") != std::string::npos);
  REQUIRE(
      (table.out.find("PASS") != std::string::npos || table.out.find("FAIL") != std::string::npos));

  const testing::CliResult bad = testing::RunThermocline("bench --ops --types q9_9");
  REQUIRE(bad.exit_code == 2);
  REQUIRE(bad.out.find("unknown type 'q9_9'") != std::string::npos);
  const testing::CliResult bad_shape =
      testing::RunThermocline("bench --ops --embd 100 --types q8_0 --repetitions 1");
  REQUIRE(bad_shape.exit_code == 2);
  REQUIRE(bad_shape.out.find("multiples of 32") != std::string::npos);
}

}  // namespace
}  // namespace thermocline
