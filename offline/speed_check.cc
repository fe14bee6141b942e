#include "offline/speed_check.h"

#include <algorithm>
#include <chrono>
#include <fstream>
#include <optional>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "engine/ops/kernels.h"
#include "engine/runtime/engine.h"
#include "offline/sparsity_calibration.h"

namespace thermocline::offline {
namespace {

// Decode tokens/s of one run: the prompt, then gen_tokens greedy single-token evaluations.
absl::StatusOr<double> DecodeRun(const Engine& engine, ThreadPool& pool,
                                 const std::vector<int32_t>& prompt, int64_t gen_tokens) {
  auto session = engine.NewSession(&pool);
  if (!session.ok()) return session.status();
  Session& s = (*session)->session();
  if (absl::Status st = s.Eval(prompt); !st.ok()) return st;
  const int64_t n_vocab = engine.model().hparams().n_vocab;
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t t = 0; t < gen_tokens; ++t) {
    const float* l = s.logits();
    const int32_t next = static_cast<int32_t>(std::max_element(l, l + n_vocab) - l);
    if (absl::Status st = s.Eval({&next, 1}); !st.ok()) return st;
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return static_cast<double>(gen_tokens) / std::max(seconds, 1e-9);
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

}  // namespace

std::string HostCpu() {
  static const std::string cpu = [] {  // what the machine is does not change while it runs
    std::string name;
    std::ifstream cpuinfo("/proc/cpuinfo");
    for (std::string line; name.empty() && std::getline(cpuinfo, line);) {
      const size_t colon = line.find(':');
      if (absl::StartsWith(line, "model name") && colon != std::string::npos) {
        name = std::string(absl::StripAsciiWhitespace(absl::string_view(line).substr(colon + 1)));
      }
    }
    if (name.empty()) name = "unknown CPU";
    return absl::StrCat(name, " (", IsaName(BestIsa()), ")");
  }();
  return cpu;
}

absl::StatusOr<SpeedCheck> CheckSparseSpeed(const LlamaModel& model, const Sidecar& sidecar,
                                            const std::vector<int32_t>& prompt, ThreadPool& pool,
                                            const SpeedCheckOptions& options,
                                            ProgressReporter* progress) {
  const LlamaHparams& h = model.hparams();
  if (h.is_moe()) {
    return absl::InvalidArgumentError(
        "the speed check compares neuron-sparse plans; a mixture of experts has none");
  }
  if (options.prompt_tokens < 1 || options.gen_tokens < 1 || options.rounds < 1) {
    return absl::InvalidArgumentError("speed check: prompt, tokens and rounds must be positive");
  }
  if (prompt.size() < 2) {
    return absl::InvalidArgumentError("speed check: the prompt needs at least 2 tokens");
  }
  const std::vector<int32_t> head(
      prompt.begin(), prompt.begin() + std::min<int64_t>(options.prompt_tokens,
                                                         static_cast<int64_t>(prompt.size())));

  EngineOptions eo;  // as `serve` and `generate` build it, on the CPU
  eo.n_ctx =
      std::min<int64_t>(h.n_ctx_train, static_cast<int64_t>(head.size()) + options.gen_tokens + 1);
  const std::vector<MethodChoice> methods = SidecarMethods(sidecar, model);

  SpeedCheck result;
  result.cpu = HostCpu();
  result.threads = pool.size();
  // One engine at a time (each holds its own re-laid weights, about the model again: two at
  // once could exhaust a machine that runs the model comfortably), in the order dense, each
  // method, dense again, so that a drift of the machine's load reaches dense on both sides.
  const int total = static_cast<int>(methods.size() + 2) * options.rounds;
  int done = 0;
  auto measure = [&](std::optional<SparsePlan> plan,
                     const char* name) -> absl::StatusOr<std::vector<double>> {
    auto engine = Engine::Create(model, std::move(plan), eo, pool);
    if (!engine.ok()) return engine.status();
    std::vector<double> runs;
    for (int r = 0; r < options.rounds; ++r) {
      auto tps = DecodeRun(**engine, pool, head, options.gen_tokens);
      if (!tps.ok()) return tps.status();
      runs.push_back(*tps);
      if (progress != nullptr &&
          !progress->Update(static_cast<double>(++done) / total,
                            absl::StrFormat("%s %.1f tokens/s", name, *tps))) {
        return absl::CancelledError("speed check cancelled");
      }
    }
    return runs;
  };
  auto dense_runs = measure(std::nullopt, "dense");
  if (!dense_runs.ok()) return dense_runs.status();
  for (MethodChoice method : methods) {
    auto plan = SparsePlanFromSidecar(sidecar, model, 0, method);
    if (!plan.ok()) return plan.status();
    auto runs = measure(*std::move(plan), MethodChoiceName(method));
    if (!runs.ok()) return runs.status();
    result.methods.push_back({method, SidecarLevel(sidecar, 0, method), Median(*runs)});
  }
  auto again = measure(std::nullopt, "dense");
  if (!again.ok()) return again.status();
  dense_runs->insert(dense_runs->end(), again->begin(), again->end());
  result.dense_tokens_per_s = Median(*dense_runs);
  if (progress != nullptr) {
    Sidecar copy;
    ApplySpeedCheck(result, copy);
    progress->Finish(DescribeSpeed(copy.speed));
  }
  return result;
}

void ApplySpeedCheck(const SpeedCheck& check, Sidecar& sidecar) {
  SidecarSpeed& s = sidecar.speed;
  s = SidecarSpeed();
  s.present = true;
  s.cpu = check.cpu;
  s.threads = check.threads;
  s.dense_tokens_per_s = check.dense_tokens_per_s;
  for (const MethodSpeed& m : check.methods) {
    if (m.method == MethodChoice::kGateFirst) {
      s.gate_first_tokens_per_s = m.tokens_per_s;
      s.gate_first_sparsity = m.sparsity;
    } else if (m.method == MethodChoice::kInputSparse) {
      s.input_sparse_tokens_per_s = m.tokens_per_s;
      s.input_sparse_sparsity = m.sparsity;
    } else {
      s.predicted_tokens_per_s = m.tokens_per_s;
      s.predicted_sparsity = m.sparsity;
    }
  }
}

absl::StatusOr<std::vector<int32_t>> SpeedCheckPrompt(const LlamaModel& model, ThreadPool& pool,
                                                      const std::string& corpus_path,
                                                      uint64_t seed) {
  if (!corpus_path.empty()) {
    std::ifstream f(corpus_path, std::ios::binary);
    if (!f) return absl::NotFoundError(absl::StrCat("cannot read ", corpus_path));
    std::string text(4096, '\0');
    f.read(text.data(), static_cast<std::streamsize>(text.size()));
    text.resize(static_cast<size_t>(f.gcount()));
    text = text.substr(0, text.find("\n\n"));
    std::vector<int32_t> ids = model.tokenizer().Encode(text, true);
    if (ids.size() >= 2) return ids;
  }
  auto text = SampleCalibrationText(model, pool, 64,
                                    std::min<int64_t>(128, model.hparams().n_ctx_train), seed);
  if (!text.ok()) return text.status();
  return model.tokenizer().Encode(*text, true);
}

const SidecarSpeed* ApplicableSpeed(const Sidecar& sidecar, double target_sparsity) {
  const SidecarSpeed& s = sidecar.speed;
  if (!s.present || target_sparsity > 0 || s.cpu != HostCpu()) return nullptr;
  return &s;
}

std::string DescribeSpeed(const SidecarSpeed& s) {
  std::vector<std::string> parts = {absl::StrFormat("dense %.1f", s.dense_tokens_per_s)};
  auto add = [&](const char* name, double tps) {
    if (tps > 0) {
      parts.push_back(absl::StrFormat("%s %.1f (%.2fx)", name, tps, tps / s.dense_tokens_per_s));
    }
  };
  add("predicted", s.predicted_tokens_per_s);
  add("gate-first", s.gate_first_tokens_per_s);
  add("input-sparse", s.input_sparse_tokens_per_s);
  return absl::StrCat(absl::StrJoin(parts, ", "), " tokens/s on ", s.threads, " threads of ",
                      s.cpu);
}

}  // namespace thermocline::offline
