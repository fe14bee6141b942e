#include "server/model_job.h"

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "engine/model/activation.h"
#include "engine/model/llama_model.h"
#include "engine/util/thread_pool.h"
#include "offline/pipeline.h"
#include "offline/sparse_source.h"
#include "offline/sparsity_calibration.h"
#include "offline/speed_check.h"
#include "server/engine_report.h"
#include "server/model_registry.h"
#include "spdlog/spdlog.h"

namespace thermocline::server {
namespace {

namespace fs = std::filesystem;

// Each stage's share of the job's percent: [start, end).
struct StageSpan {
  const char* name;
  double start, end;
};
constexpr StageSpan kLoad{"load", 0, 5};
constexpr StageSpan kProfile{"profile", 5, 60};
constexpr StageSpan kPredictors{"predictors", 60, 85};
constexpr StageSpan kSolve{"solve", 85, 97};
constexpr StageSpan kSidecar{"sidecar", 97, 100};

class JobRun {
 public:
  JobRun(const ModelJobSpec& spec, ModelJobObserver& observer) : spec_(spec), observer_(observer) {}

  bool Progress(const StageSpan& s, double fraction) {
    return observer_.OnProgress(s.name, s.start + (s.end - s.start) * fraction);
  }
  absl::Status Enter(const StageSpan& s) {
    if (!Progress(s, 0)) return absl::CancelledError("cancelled");
    return absl::OkStatus();
  }
  absl::Status Done(const StageSpan& s) {
    observer_.OnStageDone(s.name);
    if (spec_.stage_delay_ms > 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(spec_.stage_delay_ms));
    }
    if (!Progress(s, 1)) return absl::CancelledError("cancelled");
    return absl::OkStatus();
  }

 private:
  const ModelJobSpec& spec_;
  ModelJobObserver& observer_;
};

// spec.target_ppl_increase for a SwiGLU model: the calibration on the corpus's unread part (or
// all of it when too little is left), else on text the model samples; into the sidecar.
absl::Status Calibrate(const ModelJobSpec& spec, const LlamaModel& model, ThreadPool& pool,
                       JobRun& run, offline::PipelineResult& piped) {
  const LlamaHparams& h = model.hparams();
  if (spec.target_ppl_increase <= 0 || h.is_moe() || GateDecides(h.activation)) {
    return absl::OkStatus();
  }
  offline::CalibrationOptions o;
  o.max_ppl_increase = spec.target_ppl_increase;
  auto text = offline::ChooseCalibrationText(model, pool, "", spec.corpus,
                                             piped.source.corpus_bytes_read, o, 1000003);
  if (!text.ok()) return text.status();
  if (!text->held_out) {
    spdlog::warn("job '{}': calibrating on the profiled corpus itself (too little of it is left)",
                 spec.name);
  }
  offline::ProgressReporter progress("calibrate", nullptr, [&](const std::string&, double) {
    return run.Progress(kPredictors, 1.0);
  });
  auto c = offline::CalibrateSparsity(model, piped.sidecar, text->text, pool, o, &progress);
  if (!c.ok()) return c.status();
  offline::ApplyCalibration(*c, text->held_out, piped.sidecar);
  for (const offline::MethodCalibration& m : c->methods) {
    spdlog::info("job '{}': {} at sparsity {:.3f}: ppl {:.4f} (dense {:.4f}, target +{:.2f}%{})",
                 spec.name, offline::MethodChoiceName(m.method), m.sparsity, m.ppl, c->dense_ppl,
                 100 * o.max_ppl_increase, m.met ? "" : ": no level met it");
  }
  return absl::OkStatus();
}

// Decode speed of dense and of each sparse method on this machine, into the sidecar: loading
// here, `sparse = "auto"` serves dense when sparse measured slower (offline/speed_check.h).
absl::Status CheckSpeed(const ModelJobSpec& spec, const LlamaModel& model, ThreadPool& pool,
                        JobRun& run, offline::PipelineResult& piped) {
  if (!spec.speed_check || model.hparams().is_moe()) return absl::OkStatus();
  auto prompt = offline::SpeedCheckPrompt(model, pool, spec.corpus, 2000003);
  if (!prompt.ok()) return prompt.status();
  offline::ProgressReporter progress("speed check", nullptr, [&](const std::string&, double) {
    return run.Progress(kPredictors, 1.0);
  });
  auto check = offline::CheckSparseSpeed(model, piped.sidecar, *prompt, pool,
                                         offline::SpeedCheckOptions(), &progress);
  if (!check.ok()) return check.status();
  offline::ApplySpeedCheck(*check, piped.sidecar);
  spdlog::info("job '{}': speed check: {}", spec.name, offline::DescribeSpeed(piped.sidecar.speed));
  return absl::OkStatus();
}

absl::Status WriteText(const std::string& path, const std::string& text) {
  // Written to a temporary name and renamed: a kill leaves the old file or the new, not half.
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::trunc);
    f << text;
    if (!f) return absl::InternalError(absl::StrCat("cannot write ", tmp));
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot rename ", tmp, ": ", ec.message()));
  return absl::OkStatus();
}

absl::Status WriteSidecarAtomically(const offline::Sidecar& sidecar, const std::string& path) {
  const std::string tmp = path + ".tmp";
  if (absl::Status s = offline::WriteSidecar(sidecar, tmp); !s.ok()) return s;
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot rename ", tmp, ": ", ec.message()));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ModelJobResult> RunModelJob(const ModelJobSpec& spec, ModelJobObserver& observer) {
  JobRun run(spec, observer);
  std::error_code ec;
  fs::create_directories(spec.dir, ec);
  if (ec) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot create the job directory ", spec.dir, ": ", ec.message()));
  }
  const std::string profiled = (fs::path(spec.dir) / "profiled.thermo.gguf").string();
  const std::string report_path = (fs::path(spec.dir) / "report.json").string();
  const std::string final_path = (fs::path(spec.dir) / (spec.name + ".thermo.gguf")).string();
  ModelJobResult result;

  // load
  if (absl::Status s = run.Enter(kLoad); !s.ok()) return s;
  ModelOptions options;
  if (!spec.activation.empty()) {
    auto act = ParseActivation(spec.activation);
    if (!act.ok()) return act.status();
    options.activation = *act;
  }
  auto model = LlamaModel::Load(spec.path, options);
  if (!model.ok()) {
    return absl::Status(model.status().code(),
                        absl::StrCat("cannot load ", spec.path, ": ", model.status().message()));
  }
  if (absl::Status s = run.Done(kLoad); !s.ok()) return s;
  ThreadPool pool(std::max(1, spec.threads));

  // profile + predictors, or the artefact of an earlier run of this job.
  absl::StatusOr<offline::Sidecar> sidecar = absl::NotFoundError("");
  if (fs::exists(profiled, ec)) {
    sidecar = offline::LoadSidecarFor(profiled, **model);
    if (sidecar.ok()) {
      result.resumed = true;
      spdlog::info("job '{}': resuming after the profile ({})", spec.name, profiled);
    } else {
      spdlog::warn("job '{}': discarding {}: {}", spec.name, profiled,
                   std::string(sidecar.status().message()));
    }
  }
  if (!sidecar.ok()) {
    if (absl::Status s = run.Enter(kProfile); !s.ok()) return s;
    offline::PipelineOptions o;
    o.run.corpus_path = spec.corpus;
    if (spec.profile_tokens > 0) o.run.tokens = spec.profile_tokens;
    o.profiler.max_samples = std::min<int64_t>(o.profiler.max_samples, o.run.tokens);
    bool profile_done = false;
    auto callback = [&](const std::string& stage, double fraction) {
      if (stage == "profile") return run.Progress(kProfile, fraction);
      if (!profile_done) {
        profile_done = true;
        observer.OnStageDone("profile");
      }
      return run.Progress(kPredictors, fraction);
    };
    auto piped =
        offline::RunProfilePipeline(**model, fs::path(spec.path).filename().string(), pool, o,
                                    /*progress_out=*/nullptr, callback);
    if (!piped.ok()) return piped.status();
    if (absl::Status s = Calibrate(spec, **model, pool, run, *piped); !s.ok()) return s;
    if (absl::Status s = CheckSpeed(spec, **model, pool, run, *piped); !s.ok()) return s;
    if (absl::Status s = WriteSidecarAtomically(piped->sidecar, profiled); !s.ok()) return s;
    if (absl::Status s = WriteText(report_path, offline::ProfileReportJson(*piped).dump(2));
        !s.ok()) {
      return s;
    }
    sidecar = std::move(piped->sidecar);
    if (absl::Status s = run.Done(kPredictors); !s.ok()) return s;
  }

  // solve
  if (absl::Status s = run.Enter(kSolve); !s.ok()) return s;
  offline::ProblemOptions po;
  po.budget_bytes =
      spec.gpu_memory > 0 ? static_cast<double>(spec.gpu_memory) : spec.hardware.gpu_memory_bytes;
  po.context = spec.context;
  po.max_batch = spec.max_batch;
  po.kv_type = spec.kv_type;
  offline::SolveOptions so;
  so.time_limit_s = spec.solve_time_limit_s;
  auto placed = offline::SolvePlacementFor(**model, *sidecar, spec.hardware, po, so);
  if (!placed.ok()) return placed.status();
  offline::ApplyPlacement(*placed, *sidecar);
  if (absl::Status s = run.Done(kSolve); !s.ok()) return s;

  // sidecar
  if (absl::Status s = run.Enter(kSidecar); !s.ok()) return s;
  if (absl::Status s = WriteSidecarAtomically(*sidecar, final_path); !s.ok()) return s;
  result.sidecar_path = final_path;
  result.placement = PlacementSummaryJson(offline::SummarizePlacement(*sidecar));
  result.report = ProfileSummaryJson(offline::SummarizeProfile(*sidecar));
  // The speed check's figures (null when the job did not measure): why the model is served as
  // it is.
  const offline::SidecarSpeed& sp = sidecar->speed;
  result.report["speed_check"] =
      sp.present ? nlohmann::json{{"cpu", sp.cpu},
                                  {"threads", sp.threads},
                                  {"dense_tokens_per_s", sp.dense_tokens_per_s},
                                  {"predicted_tokens_per_s", sp.predicted_tokens_per_s},
                                  {"gate_first_tokens_per_s", sp.gate_first_tokens_per_s},
                                  {"input_sparse_tokens_per_s", sp.input_sparse_tokens_per_s}}
                 : nlohmann::json(nullptr);
  observer.OnStageDone(kSidecar.name);
  return result;
}

absl::StatusOr<offline::HardwareProfile> HardwareProfileFor(const std::string& state_dir,
                                                            const std::string& file, int threads) {
  if (!file.empty()) {
    auto hw = offline::ReadHardwareProfile(file);
    if (!hw.ok()) {
      return absl::Status(hw.status().code(),
                          absl::StrCat("[registry] hardware ", file, ": ", hw.status().message()));
    }
    ThreadPool pool(std::max(1, threads));
    offline::MeasureCpuIfMissing(*hw, pool);
    return hw;
  }
  const std::string path = (fs::path(state_dir) / "hardware.toml").string();
  std::error_code ec;
  if (fs::exists(path, ec)) {
    auto hw = offline::ReadHardwareProfile(path);
    if (hw.ok() && hw->cpu_bandwidth_gbps > 0) return *hw;
    spdlog::warn("{}: {}; measuring again", path,
                 hw.ok() ? "no CPU bandwidth" : std::string(hw.status().message()));
  }
  offline::HardwareProfile hw;
  ThreadPool pool(std::max(1, threads));
  offline::MeasureCpuIfMissing(hw, pool);
  if (absl::Status s = WriteText(path, offline::FormatHardwareProfile(hw)); !s.ok()) {
    spdlog::warn("cannot cache the hardware profile: {}", std::string(s.message()));
  }
  spdlog::info("hardware profile: CPU read bandwidth {:.1f} GB/s (cached in {})",
               hw.cpu_bandwidth_gbps, path);
  return hw;
}

}  // namespace thermocline::server
