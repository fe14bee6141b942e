// The CLI's GPU layer flags: `generate --gpu-layers` gives the CPU's tokens and, without a CUDA
// device, says on stderr that everything runs on the CPU; bad values are usage errors; `bench
// --gpu-compare` names what it needs.
#include <filesystem>

#include "engine/gpu/gpu_backend.h"
#include "model_fixtures.h"

namespace thermocline {
namespace {

using testing::TestModelPath;

TEST_CASE("generate --gpu-layers gives the CPU tokens, and says so without a CUDA device",
          "[gpu][cli]") {
  const std::string model = TestModelPath("relu-tiny.f32.gguf");
  if (!std::filesystem::exists(model)) THERMOCLINE_SKIP("relu-tiny.f32.gguf not found");
  const std::string args = "generate -m " + model +
                           " -p 'Once upon a time' -n 24 --temp 0 --ignore-eos --threads 2"
                           " --sparse off --json";
  const testing::CliResult cpu = testing::RunThermocline(args);
  REQUIRE(cpu.exit_code == 0);
  for (const char* flag : {" --gpu-layers auto", " --gpu-layers 3", " --gpu-layers 99",
                           " --gpu-layers auto --gpu-memory 1M"}) {
    INFO(flag);
    testing::CliResult gpu = testing::RunThermocline(args + flag);
    INFO(gpu.out);
    REQUIRE(gpu.exit_code == 0);
    const size_t json_start = gpu.out.find('{');
    REQUIRE(json_start != std::string::npos);
    const std::string notice = gpu.out.substr(0, json_start);
    if (!gpu::DeviceAvailable()) {
      CHECK_THAT(notice, Catch::Contains("--gpu-layers: no CUDA device"));
    }
    CHECK(nlohmann::json::parse(gpu.out.substr(json_start))["tokens"] ==
          nlohmann::json::parse(cpu.out.substr(cpu.out.find('{')))["tokens"]);
  }
  const testing::CliResult bad = testing::RunThermocline(args + " --gpu-layers many");
  CHECK(bad.exit_code == 2);
  CHECK_THAT(bad.out, Catch::Contains("--gpu-layers many"));
  const testing::CliResult bench =
      testing::RunThermocline("bench -m " + model + " --gpu-compare --gpu-memory 1M --threads 2");
  CHECK(bench.exit_code != 0);
  CHECK_THAT(bench.out, Catch::Contains("--sidecar"));
}

}  // namespace
}  // namespace thermocline
