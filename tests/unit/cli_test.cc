// The `thermocline` binary driven as a user would: exit codes, --json outputs, error messages.
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "model_fixtures.h"

namespace thermocline {
namespace {

using testing::TestModelPath;

using Result = testing::CliResult;

Result Run(const std::string& args) { return testing::RunThermocline(args); }

nlohmann::json JsonOf(const Result& r) {
  INFO(r.out);
  REQUIRE(r.exit_code == 0);
  // Progress or notes may precede the object on stderr; the object is the last thing printed.
  const size_t start =
      r.out.find("\n{") == std::string::npos ? r.out.find('{') : r.out.find("\n{") + 1;
  REQUIRE(start != std::string::npos);
  return nlohmann::json::parse(r.out.substr(start));
}

TEST_CASE("generate --json gives the reference greedy tokens", "[cli]") {
  const nlohmann::json ref = testing::LoadReference("stories260K.reference.json");
  const nlohmann::json& p = ref["prompts"][0];
  const Result r = Run("generate -m " + TestModelPath("stories260K.gguf") +
                       " -p 'Once upon a time' -n 48 --temp 0 --ignore-eos --threads 2 --json");
  const nlohmann::json j = JsonOf(r);
  CHECK(j["prompt_tokens"] == p["prompt_ids"]);
  CHECK(j["tokens"] == p["greedy_ids"]);
  CHECK(j["text"] == p["greedy_text"]);  // the first piece is ",": no leading space to differ
  CHECK(j["decode_tokens_per_s"].get<double>() > 0);
  CHECK(j["prompt_tokens_per_s"].get<double>() > 0);
}

TEST_CASE("generate streams text and seeds make sampling reproducible", "[cli]") {
  const std::string base = "generate -m " + TestModelPath("stories260K.gguf") +
                           " -p 'The cat' -n 24 --temp 0.9 --top-k 20 --json --seed ";
  const nlohmann::json a = JsonOf(Run(base + "7"));
  const nlohmann::json b = JsonOf(Run(base + "7"));
  const nlohmann::json c = JsonOf(Run(base + "8"));
  CHECK(a["tokens"] == b["tokens"]);
  CHECK(a["tokens"] != c["tokens"]);
  const Result text = Run("generate -m " + TestModelPath("stories260K.gguf") +
                          " -p 'Once upon a time' -n 16 --temp 0");
  REQUIRE(text.exit_code == 0);
  CHECK_THAT(text.out, Catch::StartsWith("Once upon a time, there was a little girl"));
}

TEST_CASE("command line errors are clear", "[cli]") {
  Result r = Run("generate -p hi");
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.out, Catch::Contains("--model"));
  r = Run("generate -m " + TestModelPath("stories260K.gguf") + " -p hi --temp abc");
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.out, Catch::Contains("--temp"));
  r = Run("generate -m " + TestModelPath("stories260K.gguf") + " -p hi --bogus");
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.out, Catch::Contains("unknown option --bogus"));
  r = Run("generate -m /nonexistent.gguf -p hi");
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.out, Catch::Contains("/nonexistent.gguf"));
  r = Run("generate -m " + TestModelPath("stories260K.ggufv1-original.gguf") + " -p hi");
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.out, Catch::Contains("version 1"));
  r = Run("frobnicate");
  CHECK(r.exit_code == 2);
  r = Run("generate -m " + TestModelPath("relu-tiny.f32.gguf") + " -p hi --activation tanh");
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.out, Catch::Contains("tanh"));
  r = Run("generate -m " + TestModelPath("stories260K.gguf") + " -p hi --kv-type q8");
  CHECK(r.exit_code != 0);
  CHECK_THAT(r.out, Catch::Contains("--kv-type 'q8' is not one of f16, f32"));
  r = Run("serve --model " + TestModelPath("stories260K.gguf") +
          " --kv-type q8 --port 0 --grpc-port off");
  CHECK(r.exit_code != 0);
  CHECK_THAT(r.out, Catch::Contains("models.kv_type"));
  r = Run("generate -m " + TestModelPath("stories260K.gguf") + " -p hi -c -1");
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.out, Catch::Contains("context length -1: it must be positive"));
  // "nan" parses as a double and passes every `x < lo || x > hi` check: refused where parsed.
  for (const char* flag : {"--target-sparsity nan", "--temp inf", "--top-p -nan"}) {
    r = Run("generate -m " + TestModelPath("stories260K.gguf") + " -p hi " + flag);
    INFO(flag);
    CHECK(r.exit_code == 2);
    CHECK_THAT(r.out, Catch::Contains("is not a finite number"));
  }
  r = Run("profile -m " + TestModelPath("stories260K.gguf") + " --corpus " +
          TestModelPath("tinystories-profile.txt") + " --recall nan -o /dev/null");
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.out, Catch::Contains("--recall: 'nan' is not a finite number"));
  // An output that is the input (a link to it included) would replace it: refused before any
  // work, the file kept.
  const auto [model, link] = testing::ScratchModelCopy("stories260K.gguf", "overwrite-me");
  const auto size = std::filesystem::file_size(model);
  for (const std::string out : {model.string(), link.string()}) {
    r = Run("profile -m " + model.string() + " --corpus " +
            TestModelPath("tinystories-profile.txt") + " --tokens 64 -o " + out);
    CHECK(r.exit_code == 2);
    CHECK_THAT(r.out, Catch::Contains("writing it would replace it"));
  }
  r =
      Run("synth --layers 1 --embd 64 --ff 128 --heads 4 --vocab 300 --activation relu "
          "--sparsity 0.9 -o " +
          model.string() + " --sidecar " + link.string());
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.out, Catch::Contains("--sidecar"));
  CHECK(std::filesystem::file_size(model) == size);
  r = Run("solve -m " + model.string() +
          " --sidecar x.thermo.gguf --gpu-memory 1M "
          "--save-hardware " +
          link.string());
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.out, Catch::Contains("--save-hardware"));
  r = Run("bench --hardware -m " + model.string() + " -o " + model.string());
  CHECK(r.exit_code == 2);
  CHECK_THAT(r.out, Catch::Contains("--output"));
  CHECK(std::filesystem::file_size(model) == size);
  const std::string fresh = (testing::TempDir() / "not-yet.gguf").string();
  r =
      Run("synth --layers 1 --embd 64 --ff 128 --heads 4 --vocab 300 --activation relu "
          "--sparsity 0.9 -o " +
          fresh + " --sidecar " + fresh);
  CHECK(r.exit_code == 2);
}

TEST_CASE("inspect lists metadata and tensors", "[cli]") {
  const nlohmann::json j = JsonOf(Run("inspect --json " + TestModelPath("relu-tiny.f16.gguf")));
  CHECK(j["version"] == 3);
  CHECK(j["metadata"]["llama.feed_forward_activation"] == "relu");
  bool found = false;
  for (const auto& t : j["tensors"]) {
    if (t["name"] == "blk.0.ffn_up.weight") {
      found = true;
      CHECK(t["type"] == "f16");
      CHECK(t["shape"] == nlohmann::json::array({128, 512}));
    }
  }
  CHECK(found);
  const Result text = Run("inspect " + TestModelPath("stories260K.gguf"));
  CHECK(text.exit_code == 0);
  CHECK_THAT(text.out, Catch::Contains("general.architecture"));
  CHECK_THAT(text.out, Catch::Contains("tensor types: f32 x"));
}

TEST_CASE("inspect counts the tensors of each type of a llama.cpp file", "[cli][kquants]") {
  const std::string path = TestModelPath("kquants/stories-wide.q4_k_m.gguf");
  if (!std::filesystem::exists(path)) THERMOCLINE_SKIP("kquants/ not found");
  const Result text = Run("inspect " + path);
  CHECK(text.exit_code == 0);
  // The kit's README: q4_K x32, q6_K x5, the norms f32.
  CHECK_THAT(text.out, Catch::Contains("tensor types: f32 x11, q4_K x32, q6_K x5"));
  CHECK_THAT(text.out, Catch::Contains("blk.2.attn_v.weight"));
  const nlohmann::json j = JsonOf(Run("inspect --json " + path));
  CHECK(j["tensor_types"]["q6_K"] == 5);
  for (const auto& t : j["tensors"]) {
    if (t["name"] == "output.weight") CHECK(t["type"] == "q6_K");
  }
}

// The commands compute a K-quant file as llama.cpp does, bit for bit (docs/types.md, "Against
// llama.cpp"), over the re-laid rows (the default) as over the file's (--no-repack): greedy tokens
// and perplexity. A Q3_K_M prompt on which a re-laid row's one integer sum per block parted from
// llama.cpp at token 13.
TEST_CASE("generate and perplexity give llama.cpp's tokens and perplexity, with and without repack",
          "[cli][kquants]") {
  const std::string path = TestModelPath("kquants/stories-wide.q3_k_m.gguf");
  if (!std::filesystem::exists(path)) THERMOCLINE_SKIP("kquants/ not found");
  const nlohmann::json ref = testing::LoadReference("kquants/stories-wide.q3_k_m.llama-cpp.json");
  const nlohmann::json& prompt = ref["prompts"][3];
  REQUIRE(prompt["prompt"] == "One day, a little");
  for (const std::string flag : {"", "--no-repack "}) {
    INFO("flags: " << flag);
    const nlohmann::json j = JsonOf(Run("generate " + flag + "-m " + path + " -p '" +
                                        prompt["prompt"].get<std::string>() +
                                        "' -n 48 --temp 0 --ignore-eos --threads 2 --json"));
    CHECK(j["tokens"] == prompt["greedy_ids"]);
    const nlohmann::json ppl =
        JsonOf(Run("perplexity " + flag + "-m " + path + " -f " +
                   TestModelPath("stories260K.ppl-sample.txt") + " --ctx 128 --json"));
    CHECK(std::abs(ppl["ppl"].get<double>() / 2.8318 - 1) < 1e-4);  // the kit's README
  }
}

TEST_CASE("perplexity --json prints ppl", "[cli]") {
  const nlohmann::json j =
      JsonOf(Run("perplexity -m " + TestModelPath("stories260K.gguf") + " -f " +
                 TestModelPath("stories260K.ppl-sample.txt") + " --ctx 128 --json"));
  CHECK(std::abs(j["ppl"].get<double>() / 2.2991 - 1) < 0.005);
  // The F32 cache: llama.cpp gives 2.2990 with its F32 cache on these F32 weights.
  const nlohmann::json f32 =
      JsonOf(Run("perplexity -m " + TestModelPath("stories260K.gguf") + " -f " +
                 TestModelPath("stories260K.ppl-sample.txt") + " --ctx 128 --kv-type f32 --json"));
  CHECK(std::abs(f32["ppl"].get<double>() / 2.2991 - 1) < 0.005);
  CHECK(f32["ppl"].get<double>() != j["ppl"].get<double>());  // the flag reaches the session
}

TEST_CASE("synth, quantize and bench work together", "[cli]") {
  const std::string dir = testing::TempDir().string();
  Result r =
      Run("synth --layers 2 --embd 128 --ff 352 --heads 4 --kv-heads 2 --vocab 600 "
          "--type q8_0 --activation relu -o " +
          dir + "/synth.gguf");
  INFO(r.out);
  REQUIRE(r.exit_code == 0);
  const nlohmann::json info = JsonOf(Run("inspect --json " + dir + "/synth.gguf"));
  CHECK(info["metadata"]["llama.block_count"] == 2);
  r = Run("quantize " + dir + "/synth.gguf " + dir + "/synth.q4.gguf --type q4_0");
  INFO(r.out);
  REQUIRE(r.exit_code == 0);
  const nlohmann::json bench = JsonOf(Run("bench -m " + dir +
                                          "/synth.q4.gguf --prompt-tokens 16 "
                                          "--gen-tokens 8 --repetitions 2 --threads 2 --json"));
  CHECK(bench["decode_tokens_per_s"].get<double>() > 0);
  CHECK(bench["prompt_tokens_per_s"].get<double>() > 0);
  CHECK(bench["memory_read_gbps"].get<double>() > 0);
  CHECK(bench["decode_runs"].size() == 2);
  // llama-quantize's form, the type a third argument in capitals, gives the same file.
  r = Run("quantize " + dir + "/synth.gguf " + dir + "/synth.q4b.gguf Q4_0");
  INFO(r.out);
  REQUIRE(r.exit_code == 0);
  auto bytes = [](const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(f), {});
  };
  CHECK(bytes(dir + "/synth.q4b.gguf") == bytes(dir + "/synth.q4.gguf"));
  // Over its own input it refuses, and the input is kept.
  r = Run("quantize " + dir + "/synth.q4.gguf " + dir + "/synth.q4.gguf --type q8_0");
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.out, Catch::Contains("is the input file"));
  CHECK(bytes(dir + "/synth.q4.gguf") == bytes(dir + "/synth.q4b.gguf"));
  r = Run("quantize " + dir + "/synth.gguf " + dir + "/x.gguf q4_0 --type q8_0");
  CHECK(r.exit_code == 2);
  r = Run("synth --layers 2 --embd 100 --ff 352 --heads 3 --vocab 600 -o " + dir + "/bad.gguf");
  CHECK(r.exit_code == 1);
  CHECK_THAT(r.out, Catch::Contains("multiple"));
}

}  // namespace
}  // namespace thermocline

namespace thermocline {
namespace {

TEST_CASE("bench with a sidecar: sparse against dense, the ideal and the read floor", "[cli]") {
  const std::string dir = testing::TempDir().string();
  Result r =
      Run("synth --layers 2 --embd 128 --ff 512 --heads 4 --kv-heads 2 --vocab 600 --type q4_0 "
          "--activation relu --sparsity 0.9 --hot-fraction 0.03 -o " +
          dir + "/sp.gguf --sidecar " + dir + "/sp.thermo.gguf");
  INFO(r.out);
  REQUIRE(r.exit_code == 0);
  const nlohmann::json j =
      JsonOf(Run("bench -m " + dir + "/sp.gguf --sidecar " + dir +
                 "/sp.thermo.gguf --prompt-tokens 4 --gen-tokens 8 --repetitions 2 --threads 2 "
                 "--json"));
  const double dense = j["dense_decode_tokens_per_s"], sparse = j["sparse_decode_tokens_per_s"];
  REQUIRE(dense > 0);
  REQUIRE(sparse > 0);
  CHECK(j["ratio"].get<double>() == Approx(sparse / dense));
  const double ideal = j["ideal_ratio"];
  CHECK(ideal > 1.2);  // ~90% sparse: far fewer FFN bytes (the head and attention are read alike)
  CHECK(j["of_ideal"].get<double>() == Approx(sparse / dense / ideal));
  CHECK(j["predicted_active"].get<double>() >= j["fired"].get<double>());
  CHECK(j["fired"].get<double>() > 0);
  CHECK(j["sparse_token_ms"].get<double>() == Approx(1e3 / sparse));
  // The read floor: the token with its FFN's time replaced by only reading its rows.
  const double floor_ms = j["ffn_read_floor_ms_per_token"];
  CHECK(floor_ms > 0);
  const double floor_token =
      j["sparse_token_ms"].get<double>() - j["sparse_ffn_ms_per_token"].get<double>() + floor_ms;
  CHECK(j["floor_token_ms"].get<double>() == Approx(floor_token));
  CHECK(j["floor_ratio"].get<double>() == Approx(1e3 / dense / floor_token));
  CHECK(j["floor_of_ideal"].get<double>() == Approx(j["floor_ratio"].get<double>() / ideal));
  // Without --json the same figures as lines.
  r = Run("bench -m " + dir + "/sp.gguf --sidecar " + dir +
          "/sp.thermo.gguf --prompt-tokens 4 --gen-tokens 4 --repetitions 1 --threads 2");
  INFO(r.out);
  CHECK(r.exit_code == 0);
  CHECK_THAT(r.out, Catch::Contains("% of ideal"));
  CHECK_THAT(r.out, Catch::Contains("read floor: the FFN's rows alone"));
}

TEST_CASE("bench with an input-sparse plan: its kept columns' read floor", "[cli]") {
  // A SwiGLU test model profiled for the input-sparse thresholds; at 0.5 about half of every
  // projection's columns are read, and the floor replays those reads alone.
  const std::string model = TestModelPath("kquants/stories-wide.q4_0.gguf");
  if (!std::filesystem::exists(model)) THERMOCLINE_SKIP("stories-wide.q4_0.gguf not found");
  const std::string sidecar = (testing::TempDir() / "cli-wide.thermo.gguf").string();
  Result r = testing::ProfileSwiglu(model, sidecar);
  INFO(r.out);
  REQUIRE(r.exit_code == 0);
  const std::string bench = "bench -m " + model + " --sidecar " + sidecar +
                            " --sparse-method input-sparse --target-sparsity 0.5"
                            " --prompt-tokens 4 --gen-tokens 8 --repetitions 2 --threads 2";
  const nlohmann::json j = JsonOf(Run(bench + " --json"));
  CHECK(j["method"] == "input-sparse");
  const double kept = j["attn_inputs_kept"];
  CHECK(kept > 0.3);
  CHECK(kept < 0.7);
  const double floor_ms = j["ffn_read_floor_ms_per_token"];
  CHECK(floor_ms > 0);
  // The measured sparse part (q/k/v and the FFN) replaced by the floor.
  CHECK(j["sparse_ffn_ms_per_token"].get<double>() > 0);
  CHECK(j["sparse_ffn_ms_per_token"].get<double>() < j["sparse_token_ms"].get<double>());
  const double floor_token =
      j["sparse_token_ms"].get<double>() - j["sparse_ffn_ms_per_token"].get<double>() + floor_ms;
  CHECK(j["floor_token_ms"].get<double>() == Approx(floor_token));
  CHECK(j["floor_ratio"].get<double>() ==
        Approx(1e3 / j["dense_decode_tokens_per_s"].get<double>() / floor_token));
  r = Run(bench);
  INFO(r.out);
  CHECK(r.exit_code == 0);
  CHECK_THAT(r.out, Catch::Contains("read floor: q/k/v's and the FFN's kept columns alone"));
}

TEST_CASE("bench --hardware measures the CPU and writes a profile solve reads", "[cli]") {
  const std::string out = (testing::TempDir() / "hw.toml").string();
  const Result r =
      Run("bench --hardware --threads 2 --gpu-profile " + std::string(THERMOCLINE_SOURCE_DIR) +
          "/configs/hardware/rtx4090.toml -o " + out);
  INFO(r.out);
  REQUIRE(r.exit_code == 0);
  const std::string text = testing::ReadTextFile(out);
  CHECK_THAT(text, Catch::Contains("name = \"rtx4090\""));
  CHECK_THAT(text, Catch::Contains("[cpu]"));
  CHECK_THAT(text, !Catch::Contains("bandwidth_gbps = 0\n"));
  const Result bad = Run("bench --hardware --gpu-profile /nonexistent.toml");
  CHECK(bad.exit_code == 1);
}

}  // namespace
}  // namespace thermocline

namespace thermocline {
namespace {

TEST_CASE("generate with a GPU memory cap gives the CPU tokens, with or without a CUDA device",
          "[cli][sparse]") {
  const std::string model = TestModelPath("relu-tiny.f32.gguf");
  if (!std::filesystem::exists(model)) THERMOCLINE_SKIP("relu-tiny.f32.gguf not found");
  const std::string args = "generate -m " + model +
                           " -p 'Once upon a time' -n 24 --temp 0 --ignore-eos --threads 2"
                           " --sparse on --oracle --json";
  const Result cpu = Run(args);
  REQUIRE(cpu.exit_code == 0);
  // stderr is merged: without a device one line says so before the JSON.
  Result gpu = Run(args + " --gpu-memory 256M");
  INFO(gpu.out);
  REQUIRE(gpu.exit_code == 0);
  const size_t json_start = gpu.out.find('{');
  REQUIRE(json_start != std::string::npos);
  const std::string notice = gpu.out.substr(0, json_start);
  CHECK((notice.empty() || notice.find("--gpu-memory: no CUDA device") != std::string::npos));
  gpu.out = gpu.out.substr(json_start);
  CHECK(JsonOf(gpu)["tokens"] == JsonOf(cpu)["tokens"]);
  CHECK_FALSE(Run(args + " --gpu-memory 0").exit_code == 0);
}

}  // namespace
}  // namespace thermocline
