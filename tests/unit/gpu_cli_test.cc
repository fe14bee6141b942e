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

namespace thermocline {
namespace {

TEST_CASE("bench --gpu-compare on the stand-in device: the rows' tokens agree, the model beside",
          "[gpu][cli]") {
  // A small synthetic ReLU model with its sidecar, a placement solved for a cap of about 40% of
  // its weights, then the comparison with the CPU stand-in as the device.
  const std::string dir = testing::TempDir().string();
  const std::string model = dir + "/compare.gguf", sidecar = dir + "/compare.thermo.gguf";
  testing::CliResult r = testing::RunThermocline(
      "synth --layers 4 --embd 256 --ff 1024 --heads 4 --kv-heads 4 --vocab 512 --type q4_0 "
      "--activation relu --sparsity 0.9 --hot-fraction 0.05 -o " +
      model + " --sidecar " + sidecar);
  INFO(r.out);
  REQUIRE(r.exit_code == 0);
  r = testing::RunThermocline("solve -m " + model + " --sidecar " + sidecar +
                              " --gpu-memory 1M --context 49 --objective frequency");
  INFO(r.out);
  REQUIRE(r.exit_code == 0);
  r = testing::RunThermocline("bench -m " + model + " --sidecar " + sidecar +
                              " --gpu-compare --gpu-memory 1M --stand-in --threads 2");
  INFO(r.out);
  REQUIRE(r.exit_code == 0);
  CHECK_THAT(r.out,
             Catch::Contains("(a) and (b) gave (c)'s greedy tokens (32, or up to a near-tie"));
  CHECK_THAT(r.out, Catch::Contains("(a) modelled by the placement:"));
  CHECK_THAT(r.out, Catch::Contains("hybrid on CPU stand-in device"));
  CHECK_THAT(r.out, Catch::Contains("model GPU us"));
  // Without --stand-in and without a device it names what it needs.
  if (!gpu::DeviceAvailable()) {
    r = testing::RunThermocline("bench -m " + model + " --sidecar " + sidecar +
                                " --gpu-compare --gpu-memory 1M");
    CHECK(r.exit_code != 0);
    CHECK_THAT(r.out, Catch::Contains("needs a CUDA device"));
  }
}

}  // namespace
}  // namespace thermocline

namespace thermocline {
namespace {

TEST_CASE("bench --gpu-layers with an input-sparse or gate-first plan: held to the CPU's tokens",
          "[gpu][cli]") {
  // A profile of a SwiGLU test model gives the input-sparse statistics; the plan at 0.5 on the
  // stand-in device: (s) whole layers input-sparse there, (s') the same plan on the CPU, whose
  // greedy tokens (s) must give; its speed on the stand-in means nothing.
  const std::string model = TestModelPath("kquants/stories-wide.q4_0.gguf");
  if (!std::filesystem::exists(model)) THERMOCLINE_SKIP("stories-wide.q4_0.gguf not found");
  const std::string sidecar = (testing::TempDir() / "gpu-cli-wide.thermo.gguf").string();
  testing::CliResult r = testing::ProfileSwiglu(model, sidecar);
  INFO(r.out);
  REQUIRE(r.exit_code == 0);
  const std::string bench = "bench -m " + model + " --sidecar " + sidecar +
                            " --target-sparsity 0.5 --gpu-layers auto --stand-in"
                            " --prompt-tokens 8 --gen-tokens 16 --repetitions 1 --threads 2";
  r = testing::RunThermocline(bench + " --sparse-method input-sparse");
  INFO(r.out);
  REQUIRE(r.exit_code == 0);
  CHECK_THAT(r.out, Catch::Contains("5/5 whole layers (5 input-sparse) and the output head"));
  CHECK_THAT(r.out, Catch::Contains("kept 50% of attention's inputs"));
  CHECK_THAT(r.out, Catch::Contains("(s) gave (s')'s greedy tokens (16"));
  r = testing::RunThermocline(bench + " --sparse-method gate-first");
  INFO(r.out);
  REQUIRE(r.exit_code == 0);
  CHECK_THAT(r.out, Catch::Contains("5/5 whole layers (5 gate-first) and the output head"));
  CHECK_THAT(r.out, Catch::Contains("(s) gave (s')'s greedy tokens (16"));
  // A plan of another method has no whole-layer form: said, not ignored.
  r = testing::RunThermocline(bench + " --sparse-method predicted");
  CHECK(r.exit_code != 0);
  CHECK_THAT(r.out, Catch::Contains("--sparse-method input-sparse"));
}

}  // namespace
}  // namespace thermocline
