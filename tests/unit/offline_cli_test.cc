// `thermocline profile` and `thermocline solve` driven as a user would: files written, exit
// codes, and the error a user sees for a sidecar of another model.
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "nlohmann/json.hpp"
#include "test_util.h"

namespace thermocline {
namespace {

using testing::TempDir;
using testing::TestModelPath;

using Result = testing::CliResult;

Result Run(const std::string& args) { return testing::RunThermocline(args); }

TEST_CASE("profile then solve from the command line", "[offline][cli]") {
  const std::string model = TestModelPath("relu-tiny.f32.gguf");
  if (!std::filesystem::exists(model)) THERMOCLINE_SKIP("relu-tiny.f32.gguf not found");
  const std::string dir = (TempDir() / "cli-offline").string();
  std::filesystem::create_directories(dir);
  const std::string sidecar = dir + "/relu-tiny.thermo.gguf";
  // A short self-generated profile: no corpus needed.
  Result r =
      Run("profile -m " + model + " --self-generate --tokens 512 --samples 512 --epochs 2 -o " +
          sidecar + " --report " + dir + "/REPORT.json --plots " + dir + "/plots -t 2");
  INFO(r.out);
  REQUIRE(r.exit_code == 0);
  CHECK(r.out.find("profile: done") != std::string::npos);
  std::ifstream report_file(dir + "/REPORT.json");
  const nlohmann::json report = nlohmann::json::parse(report_file);
  CHECK(report["source"] == "self-generate");
  CHECK(report["layers"].size() == 6);
  for (const char* f : {"firing_frequency.svg", "recall_vs_rank.svg", "active_vs_rank.svg"}) {
    CHECK(std::filesystem::exists(dir + "/plots/" + f));
  }

  r = Run("solve -m " + model + " --sidecar " + sidecar + " --gpu-memory 2M --cpu-bandwidth 10 " +
          "--hardware " + THERMOCLINE_SOURCE_DIR + "/configs/hardware/rtx4070.toml --json " +
          "--plots " + dir + "/plots");
  INFO(r.out);
  REQUIRE(r.exit_code == 0);
  const nlohmann::json j = nlohmann::json::parse(r.out.substr(r.out.find('{')));
  CHECK(j["hardware"] == "rtx4070");
  CHECK(j["chosen"]["gpu_bytes"].get<double>() <= 2 * 1048576.0);
  CHECK(j["chosen"]["modelled_tokens_per_s"].get<double>() >=
        j["other"]["modelled_tokens_per_s"].get<double>() * 0.999);
  CHECK(std::filesystem::exists(dir + "/plots/placement.svg"));

  r = Run("solve -m " + model + " --sidecar " + sidecar + " --gpu-memory 1K --cpu-bandwidth 10");
  CHECK(r.exit_code == 1);
  CHECK(r.out.find("minimum useful budget") != std::string::npos);

  r = Run("solve -m " + TestModelPath("stories260K.gguf") + " --sidecar " + sidecar +
          " --gpu-memory 1M --cpu-bandwidth 10");
  CHECK(r.exit_code == 1);
  CHECK(r.out.find("belongs to another model") != std::string::npos);
}

}  // namespace
}  // namespace thermocline
