// The speed check (offline/speed_check.h): the profiler measures dense and each sparse method's
// decode on this machine into the sidecar, and loading here serves what was fastest: `auto`
// serves dense where sparse measured slower (and says why), `--sparse-method auto` takes the
// fastest method; on another CPU, at another level, with sparse on or a sidecar the user named,
// the measurement does not decide.
#include "offline/speed_check.h"

#include <filesystem>

#include "model_fixtures.h"
#include "offline/pipeline.h"
#include "test_util.h"

namespace thermocline {
namespace {

using testing::CachedModel;
using testing::TempDir;
using testing::TestModelPath;

absl::StatusOr<offline::PipelineResult> Profile(const LlamaModel& model, const std::string& name,
                                                ThreadPool& pool) {
  offline::PipelineOptions po;
  po.run.corpus_path = TestModelPath("tinystories-profile.txt");
  po.run.tokens = 1024;
  po.profiler.max_samples = 512;
  po.predictors.train.epochs = 1;
  return offline::RunProfilePipeline(model, name, pool, po, nullptr);
}

TEST_CASE("the speed check measures dense and each method, and the sidecar keeps it",
          "[sparse][offline]") {
  const std::string corpus = TestModelPath("tinystories-profile.txt");
  for (const char* file : {"stories260K.gguf", "relu-tiny.f32.gguf"}) {
    INFO(file);
    const std::string path = TestModelPath(file);
    if (!std::filesystem::exists(path) || !std::filesystem::exists(corpus)) {
      THERMOCLINE_SKIP("stories260K.gguf, relu-tiny.f32.gguf or tinystories-profile.txt missing");
    }
    const LlamaModel& model = CachedModel(path);
    ThreadPool pool(2);
    auto profiled = Profile(model, file, pool);
    INFO(profiled.status().ToString());
    REQUIRE(profiled.ok());
    auto prompt = offline::SpeedCheckPrompt(model, pool, corpus, 1);
    REQUIRE(prompt.ok());
    REQUIRE(prompt->size() >= 2);
    CHECK((*prompt)[0] == model.tokenizer().bos_id());

    offline::SpeedCheckOptions o;
    o.prompt_tokens = 8;
    o.gen_tokens = 8;
    o.rounds = 2;
    auto check = offline::CheckSparseSpeed(model, profiled->sidecar, *prompt, pool, o);
    INFO(check.status().ToString());
    REQUIRE(check.ok());
    CHECK(check->cpu == offline::HostCpu());
    CHECK(check->cpu.find(IsaName(BestIsa())) != std::string::npos);
    CHECK(check->threads == 2);
    CHECK(check->dense_tokens_per_s > 0);
    const bool swiglu = std::string(file) == "stories260K.gguf";
    // gate-first and input-sparse are for SwiGLU only
    REQUIRE(check->methods.size() == (swiglu ? 3u : 1u));
    CHECK(check->methods[0].method == offline::MethodChoice::kPredicted);
    if (swiglu) {
      CHECK(check->methods[1].method == offline::MethodChoice::kGateFirst);
      CHECK(check->methods[2].method == offline::MethodChoice::kInputSparse);
    }
    for (const offline::MethodSpeed& m : check->methods) {
      CHECK(m.tokens_per_s > 0);
      // The level a load without --target-sparsity uses: the profile's target here.
      CHECK(m.sparsity == Approx(profiled->sidecar.target_sparsity));
    }

    offline::ApplySpeedCheck(*check, profiled->sidecar);
    const std::string out = (TempDir() / (std::string(file) + ".speed.thermo.gguf")).string();
    REQUIRE(offline::WriteSidecar(profiled->sidecar, out).ok());
    auto back = offline::ReadSidecar(out);
    REQUIRE(back.ok());
    const offline::SidecarSpeed& s = back->speed;
    REQUIRE(s.present);
    CHECK(s.cpu == check->cpu);
    CHECK(s.threads == 2);
    CHECK(s.dense_tokens_per_s == Approx(check->dense_tokens_per_s));
    CHECK(s.predicted_tokens_per_s == Approx(check->methods[0].tokens_per_s));
    CHECK((s.gate_first_tokens_per_s > 0) == swiglu);
    CHECK((s.input_sparse_tokens_per_s > 0) == swiglu);
    if (swiglu) CHECK(s.input_sparse_sparsity == Approx(profiled->sidecar.target_sparsity));
    CHECK((offline::DescribeSpeed(s).find("input-sparse ") != std::string::npos) == swiglu);
    const nlohmann::json report = offline::ProfileReportJson(*profiled);
    CHECK(report["speed_check"]["dense_tokens_per_s"].get<double>() ==
          Approx(check->dense_tokens_per_s));
    CHECK(report["speed_check"]["methods"].contains("gate_first") == swiglu);
    CHECK(report["speed_check"]["methods"].contains("input_sparse") == swiglu);

    o.rounds = 0;
    CHECK(absl::IsInvalidArgument(
        offline::CheckSparseSpeed(model, profiled->sidecar, *prompt, pool, o).status()));
    o.rounds = 1;
    CHECK(absl::IsInvalidArgument(
        offline::CheckSparseSpeed(model, profiled->sidecar, {1}, pool, o).status()));
  }
}

// What ResolveSparsePlan makes of a sidecar with these measurements.
struct Resolved {
  bool sparse = false;
  std::string warning;
  double checked = 0;
  std::string methods;
};

TEST_CASE("auto serves dense where the speed check measured sparse slower, the fastest method",
          "[sparse][offline]") {
  const std::string path = TestModelPath("stories260K.gguf");
  if (!std::filesystem::exists(path) ||
      !std::filesystem::exists(TestModelPath("tinystories-profile.txt"))) {
    THERMOCLINE_SKIP("stories260K.gguf or tinystories-profile.txt not found");
  }
  const LlamaModel& model = CachedModel(path);
  ThreadPool pool(2);
  auto profiled = Profile(model, "stories260K.gguf", pool);
  REQUIRE(profiled.ok());
  const double level = profiled->sidecar.target_sparsity;  // what both methods load at
  REQUIRE(level > 0);
  const std::string file = (TempDir() / "speed-resolve.thermo.gguf").string();

  // Writes the sidecar with these figures and resolves it as a request sets it.
  auto resolve = [&](double dense, double predicted, double gate_first,
                     offline::SparseRequest request, const std::string& cpu = "",
                     double measured_level = -1, double input_sparse = 0) {
    offline::Sidecar sidecar = profiled->sidecar;
    offline::SidecarSpeed& s = sidecar.speed;
    s.present = true;
    s.cpu = cpu.empty() ? offline::HostCpu() : cpu;
    s.threads = 2;
    s.dense_tokens_per_s = dense;
    s.predicted_tokens_per_s = predicted;
    s.gate_first_tokens_per_s = gate_first;
    s.input_sparse_tokens_per_s = input_sparse;
    s.predicted_sparsity = s.gate_first_sparsity = s.input_sparse_sparsity =
        measured_level < 0 ? level : measured_level;
    REQUIRE(offline::WriteSidecar(sidecar, file).ok());
    request.sidecar = file;
    auto r = offline::ResolveSparsePlan(model, request);
    INFO(r.status().ToString());
    REQUIRE(r.ok());
    Resolved out;
    out.sparse = r->plan.has_value();
    out.warning = r->warning;
    if (out.sparse) {
      out.checked = r->plan->checked_tokens_per_s;
      out.methods = SparseMethodsOf(r->plan->layers);
    }
    return out;
  };
  offline::SparseRequest automatic;  // mode auto, method predicted, check_speed: as generate
  REQUIRE(automatic.mode == offline::SparseMode::kAuto);

  // Measured slower: dense, and why.
  Resolved r = resolve(100, 50, 80, automatic);
  CHECK(!r.sparse);
  CHECK(r.warning.find("slower than dense on this machine") != std::string::npos);
  CHECK(r.warning.find("dense 100.0, predicted 50.0 (0.50x), gate-first 80.0 (0.80x)") !=
        std::string::npos);
  // Faster: sparse, with the measurement on the plan.
  r = resolve(100, 150, 80, automatic);
  CHECK(r.sparse);
  CHECK(r.warning.empty());
  CHECK(r.checked == 150);
  CHECK(r.methods == "predicted");

  // The measurement does not decide: sparse on, a sidecar the user named (check_speed off),
  // another CPU, another level asked for or measured.
  offline::SparseRequest on = automatic;
  on.mode = offline::SparseMode::kOn;
  r = resolve(100, 50, 80, on);
  CHECK(r.sparse);
  CHECK(r.checked == 50);  // still reported
  offline::SparseRequest named = automatic;
  named.check_speed = false;
  CHECK(resolve(100, 50, 80, named).sparse);
  r = resolve(100, 50, 80, automatic, "Another CPU (avx2)");
  CHECK(r.sparse);
  CHECK(r.checked == 0);
  offline::SparseRequest asked = automatic;
  asked.target_sparsity = 0.3;
  r = resolve(100, 50, 80, asked);
  CHECK(r.sparse);
  CHECK(r.checked == 0);
  r = resolve(100, 50, 80, automatic, "", level / 2);
  CHECK(r.sparse);
  CHECK(r.checked == 0);

  // --sparse-method auto: the fastest method measured, every layer; dense when none pays.
  offline::SparseRequest fastest = automatic;
  fastest.method = offline::MethodChoice::kAuto;
  r = resolve(100, 50, 120, fastest);
  CHECK(r.sparse);
  CHECK(r.methods == "gate-first");
  CHECK(r.checked == 120);
  r = resolve(100, 130, 120, fastest);
  CHECK(r.methods == "predicted");
  CHECK(r.checked == 130);
  r = resolve(100, 50, 80, fastest);
  CHECK(!r.sparse);
  CHECK(r.warning.find("slower than dense") != std::string::npos);
  r = resolve(100, 130, 120, fastest, "", -1, 140);
  CHECK(r.sparse);
  CHECK(r.methods == "input-sparse");
  CHECK(r.checked == 140);
  r = resolve(100, 50, 80, fastest, "", -1, 90);
  CHECK(!r.sparse);
  CHECK(r.warning.find("input-sparse 90.0 (0.90x)") != std::string::npos);
  // Asked for input-sparse: its own figure, at its own level.
  offline::SparseRequest input_sparse = automatic;
  input_sparse.method = offline::MethodChoice::kInputSparse;
  r = resolve(100, 150, 80, input_sparse, "", -1, 60);
  CHECK(!r.sparse);  // input-sparse measured slower than dense
  r = resolve(100, 50, 80, input_sparse, "", -1, 110);
  CHECK(r.sparse);
  CHECK(r.methods == "input-sparse");
  CHECK(r.checked == 110);
}

TEST_CASE("profile then bench: a SwiGLU sidecar's methods against dense, and its speed check",
          "[sparse][offline][cli]") {
  const std::string model = TestModelPath("stories260K.gguf");
  const std::string corpus = TestModelPath("tinystories-profile.txt");
  if (!std::filesystem::exists(model) || !std::filesystem::exists(corpus)) {
    THERMOCLINE_SKIP("stories260K.gguf or tinystories-profile.txt not found");
  }
  const std::string sidecar = (TempDir() / "bench-speed.thermo.gguf").string();
  testing::CliResult r =
      testing::RunThermocline("profile -m " + model + " --corpus " + corpus +
                              " --tokens 512 --epochs 1 -t 2 --quiet -o " + sidecar);
  INFO(r.out);
  REQUIRE(r.exit_code == 0);
  CHECK(r.out.find("speed check: dense ") != std::string::npos);
  CHECK(r.out.find("gate-first") != std::string::npos);
  CHECK(r.out.find("input-sparse") != std::string::npos);
  r = testing::RunThermocline("bench -m " + model + " --sidecar " + sidecar +
                              " --prompt-tokens 4 --gen-tokens 4 --repetitions 1 --threads 2");
  INFO(r.out);
  REQUIRE(r.exit_code == 0);
  CHECK(r.out.find("--sparse-method predicted\n") != std::string::npos);
  CHECK(r.out.find("--sparse-method gate-first\n") != std::string::npos);
  CHECK(r.out.find("the sidecar's speed check: dense ") != std::string::npos);
  // --no-speed-check: no figures in the sidecar.
  r = testing::RunThermocline("profile -m " + model + " --corpus " + corpus +
                              " --tokens 512 --epochs 1 -t 2 --quiet --no-speed-check -o " +
                              sidecar);
  REQUIRE(r.exit_code == 0);
  CHECK(r.out.find("speed check") == std::string::npos);
  auto read = offline::ReadSidecar(sidecar);
  REQUIRE(read.ok());
  CHECK(!read->speed.present);
}

}  // namespace
}  // namespace thermocline
