// scripts/compare-llama-cpp.sh against stand-ins for llama.cpp's tools: stubs that print fixed
// figures in the formats llama-bench (`-o json`) and llama-batched-bench (`--output-format
// jsonl`) write, and log the arguments they were given. The script runs the real `thermocline
// bench` on stories260K; the test checks the figures it reads from each side, the medians and
// ratios it prints, the options it passes, and that a failing tool stops it with that tool's
// message.
#include <sys/stat.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "test_util.h"

namespace thermocline {
namespace {

namespace fs = std::filesystem;
using testing::CliResult;
using testing::TempDir;
using testing::TestModelPath;
using testing::TestModelsDir;

void WriteExecutable(const fs::path& path, const std::string& text) {
  std::ofstream(path) << text;
  REQUIRE(::chmod(path.c_str(), 0755) == 0);
}

// Stubs for llama-bench and llama-batched-bench in `dir`: fixed figures (prefill 100 and decode
// 10 tokens/s; after a prompt, prefill 50 and decode 5), each call's arguments appended to
// dir/NAME.args. With `batched_fails`, llama-batched-bench says why on stderr and exits 3.
void WriteStubs(const fs::path& dir, bool batched_fails) {
  fs::create_directories(dir);
  WriteExecutable(dir / "llama-bench",
                  "#!/bin/sh\n"
                  "echo \"$@\" >> \"$(dirname \"$0\")/llama-bench.args\"\n"
                  "echo '[{\"n_prompt\": 8, \"n_gen\": 0, \"avg_ts\": 100.0},'\n"
                  "echo ' {\"n_prompt\": 0, \"n_gen\": 4, \"avg_ts\": 10.0}]'\n");
  WriteExecutable(
      dir / "llama-batched-bench",
      batched_fails
          ? "#!/bin/sh\necho 'stub: no model here' >&2\nexit 3\n"
          : "#!/bin/sh\n"
            "echo \"$@\" >> \"$(dirname \"$0\")/llama-batched-bench.args\"\n"
            "echo 'main: n_kv_max = 84'\n"
            "echo '{\"pp\": 16, \"tg\": 4, \"pl\": 1, \"speed_pp\": 50.0, \"speed_tg\": 5.0}'\n");
}

std::string ReadFile(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// The script, one round at one thread, against the stubs written into `stubs`.
CliResult RunScript(const fs::path& stubs, bool batched_fails, const std::string& model) {
  WriteStubs(stubs, batched_fails);
  return testing::RunShell("THERMOCLINE=" + testing::ThermoclineBinary() +
                           " ROUNDS=1 THREADS=1 PROMPT=8 GEN=4 DEPTHS=16 bash " +
                           THERMOCLINE_SOURCE_DIR + "/scripts/compare-llama-cpp.sh " +
                           (stubs / "llama-bench").string() + " " + model);
}

struct Row {
  std::string llama, ours;
  double ratio = 0;
};

// The table's rows by figure: "| model | threads | figure | llama.cpp | Thermocline | ratio |".
std::map<std::string, Row> ParseTable(const std::string& out) {
  std::map<std::string, Row> rows;
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("| stories260K.gguf |", 0) != 0) continue;
    std::vector<std::string> cells;
    std::stringstream cs(line.substr(1));
    for (std::string c; std::getline(cs, c, '|');) {
      const size_t b = c.find_first_not_of(' '), e = c.find_last_not_of(' ');
      cells.push_back(b == std::string::npos ? "" : c.substr(b, e - b + 1));
    }
    REQUIRE(cells.size() == 6);
    rows[cells[2]] = {cells[3], cells[4], std::stod(cells[5])};
  }
  return rows;
}

double Median(const std::string& cell) { return std::stod(cell.substr(0, cell.find(' '))); }

TEST_CASE("compare-llama-cpp.sh reads both sides' figures and prints their ratios", "[scripts]") {
  const std::string model = TestModelPath("stories260K.gguf");
  if (!fs::exists(model)) THERMOCLINE_SKIP("stories260K.gguf is not in " + TestModelsDir());
  const fs::path stubs = TempDir() / "compare-stubs";
  const CliResult r = RunScript(stubs, /*batched_fails=*/false, model);
  INFO(r.out);
  REQUIRE(r.exit_code == 0);

  const std::map<std::string, Row> rows = ParseTable(r.out);
  const std::map<std::string, std::string> llama = {{"prefill", "100.0 (100.0-100.0)"},
                                                    {"decode", "10.0 (10.0-10.0)"},
                                                    {"prefill@16", "50.0 (50.0-50.0)"},
                                                    {"decode@16", "5.0 (5.0-5.0)"}};
  REQUIRE(rows.size() == llama.size());
  for (const auto& [figure, theirs] : llama) {
    INFO(figure);
    REQUIRE(rows.count(figure) == 1);
    const Row& row = rows.at(figure);
    CHECK(row.llama == theirs);
    const double ours = Median(row.ours);
    CHECK(ours > 0);
    CHECK(row.ratio == Approx(ours / Median(theirs)).margin(0.006));
  }

  // One round; each side was asked for the prompt, the generated tokens and the depth given.
  const std::string bench_args = ReadFile(stubs / "llama-bench.args");
  const std::string batched_args = ReadFile(stubs / "llama-batched-bench.args");
  CHECK(std::count(bench_args.begin(), bench_args.end(), '\n') == 1);
  CHECK(bench_args.find("-t 1 -p 8 -n 4 -r 1") != std::string::npos);
  CHECK(std::count(batched_args.begin(), batched_args.end(), '\n') == 1);
  CHECK(batched_args.find("-t 1 -c 84 ") != std::string::npos);
  CHECK(batched_args.find("-npp 16 -ntg 4 -npl 1 --output-format jsonl") != std::string::npos);
}

TEST_CASE("compare-llama-cpp.sh stops with the failing tool's message", "[scripts]") {
  const std::string model = TestModelPath("stories260K.gguf");
  if (!fs::exists(model)) THERMOCLINE_SKIP("stories260K.gguf is not in " + TestModelsDir());
  const CliResult r = RunScript(TempDir() / "compare-stubs-failing", /*batched_fails=*/true, model);
  INFO(r.out);
  CHECK(r.exit_code != 0);
  CHECK(r.out.find("compare-llama-cpp: failed:") != std::string::npos);
  CHECK(r.out.find("stub: no model here") != std::string::npos);
  CHECK(r.out.find("| model |") == std::string::npos);  // no one-sided table
}

}  // namespace
}  // namespace thermocline
