// thermocline bench --gpu-compare / --gpu-layers: decode tokens/s with the GPU, in one run.
//   (a) hybrid sparse: the sidecar's solved placement (GPU attention layers, hot neurons on the
//       GPU, cold neurons on the CPU) under --gpu-memory;
//   (b) dense, -ngl style: as many whole layers on the GPU as fit under --gpu-memory (or
//       --gpu-layers N), the rest on the CPU;
//   (c) dense, all on the CPU (the reference);
// with the ratios (a)/(b) and each against (c). `--gpu-layers` without --gpu-compare measures
// (b) and (c) only.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/gpu/gpu_backend.h"
#include "engine/gpu/gpu_layers.h"
#include "engine/runtime/engine.h"
#include "nlohmann/json.hpp"
#include "tools/commands.h"

namespace thermocline::cli {
namespace {

struct Row {
  std::string name;
  double tokens_per_s = 0;
  uint64_t gpu_bytes = 0;
  std::string note;
};

// Median decode tokens/s over `reps` runs: a prompt, then `gen` greedy single-token steps.
absl::StatusOr<double> DecodeTokensPerS(Session& session, int64_t prompt_tokens, int64_t gen,
                                        int reps) {
  const int64_t n_vocab = session.model().hparams().n_vocab;
  std::vector<int32_t> prompt(std::max<int64_t>(prompt_tokens, 1));
  for (size_t i = 0; i < prompt.size(); ++i) {
    prompt[i] = static_cast<int32_t>((i * 7919 + 1) % n_vocab);
  }
  std::vector<double> runs;
  for (int r = 0; r < std::max(reps, 1); ++r) {
    session.Reset();
    if (absl::Status s = session.Eval(prompt); !s.ok()) return s;
    const auto t0 = std::chrono::steady_clock::now();
    for (int64_t t = 0; t < gen; ++t) {
      const float* l = session.logits();
      const int32_t next = static_cast<int32_t>(std::max_element(l, l + n_vocab) - l);
      if (absl::Status s = session.Eval({&next, 1}); !s.ok()) return s;
    }
    runs.push_back(gen /
                   std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(runs.begin(), runs.end());
  return runs[runs.size() / 2];
}

// One row: an engine of `model` with `plan` and the GPU options, decoded on one session.
absl::StatusOr<Row> Measure(const std::string& name, const LlamaModel& model, ThreadPool& pool,
                            std::optional<SparsePlan> plan, const EngineOptions& options,
                            int64_t pt, int64_t gt, int reps) {
  absl::StatusOr<std::shared_ptr<const Engine>> engine =
      Engine::Create(model, std::move(plan), options, pool);
  if (!engine.ok()) return engine.status();
  absl::StatusOr<std::unique_ptr<EngineSession>> session = (*engine)->NewSession(&pool);
  if (!session.ok()) return session.status();
  absl::StatusOr<double> tps = DecodeTokensPerS((*session)->session(), pt, gt, reps);
  if (!tps.ok()) return tps.status();
  Row row;
  row.name = name;
  row.tokens_per_s = *tps;
  row.gpu_bytes = (*session)->device_bytes();
  row.note = DescribePlacement((*session)->placement());
  if (const SparseFfn* sparse = (*session)->sparse(); sparse != nullptr) {
    const SparseFfnStats& st = sparse->stats();
    const double active =
        st.layer_tokens ? st.predicted / st.layer_tokens / model.hparams().n_ff : 0;
    absl::StrAppend(&row.note, ", ", static_cast<int>(100 * active + 0.5),
                    "% neurons predicted active");
  }
  return row;
}

}  // namespace

int RunBenchGpuCompare(const Args& args) {
  const bool compare = args.Has("--gpu-compare");
  auto pt = args.GetInt("--prompt-tokens", 16);
  auto gt = args.GetInt("--gen-tokens", 32);
  auto reps = args.GetInt("--repetitions", 3);
  auto cap_arg = args.GetBytes("--gpu-memory", -1);
  for (auto* v : {&pt, &gt, &reps, &cap_arg}) {
    if (!v->ok()) return Fail("bench", v->status(), true);
  }
  absl::StatusOr<int64_t> requested = gpu::ParseGpuLayers(args.GetOr("--gpu-layers", "auto"));
  if (!requested.ok()) return Fail("bench", requested.status(), true);
  if (*pt < 1 || *gt < 1 || *reps < 1) {
    return Fail("bench", absl::InvalidArgumentError("token counts and repetitions must be >= 1"),
                true);
  }
  if (compare && (*cap_arg <= 0 || !args.Get("--sidecar"))) {
    return Fail("bench",
                absl::InvalidArgumentError("--gpu-compare needs --gpu-memory BYTES and --sidecar "
                                           "FILE (a placement solved for that cap)"),
                true);
  }
  auto threads = ThreadsFromArgs(args);
  if (!threads.ok()) return Fail("bench", threads.status(), true);
  if (absl::Status s = CheckModelArgs(args); !s.ok()) return Fail("bench", s, true);
  if (absl::StatusOr<gpu::DeviceInfo> d = gpu::Probe(); !d.ok()) {
    return Fail("bench", absl::UnavailableError(
                             absl::StrCat(compare ? "--gpu-compare" : "--gpu-layers",
                                          " needs a CUDA device: ", d.status().message())));
  }
  auto model = LoadModelFromArgs(args);
  if (!model.ok()) return Fail("bench", model.status());
  ThreadPool pool(*threads);
  EngineOptions base;
  base.n_ctx = *pt + *gt + 1;
  base.max_batch = std::min<int64_t>(*pt, 64);
  const int r = static_cast<int>(*reps);

  std::vector<Row> rows;
  if (compare) {
    absl::StatusOr<std::optional<SparsePlan>> plan = SparsePlanFromArgs(args, **model);
    if (!plan.ok()) return Fail("bench", plan.status());
    if (!plan->has_value()) {
      return Fail("bench", absl::InvalidArgumentError("--gpu-compare: --sidecar gives no plan"));
    }
    EngineOptions hybrid = base;
    hybrid.gpu_memory = static_cast<uint64_t>(*cap_arg);
    auto a = Measure("(a) hybrid sparse, solved placement", **model, pool, *std::move(plan),
                     hybrid, *pt, *gt, r);
    if (!a.ok()) return Fail("bench", a.status());
    rows.push_back(*a);
  }
  EngineOptions ngl = base;
  ngl.gpu_layers = *requested;
  if (*cap_arg > 0) ngl.gpu_memory = static_cast<uint64_t>(*cap_arg);
  auto b = Measure("(b) dense, whole layers on the GPU (-ngl)", **model, pool, std::nullopt, ngl,
                   *pt, *gt, r);
  if (!b.ok()) return Fail("bench", b.status());
  rows.push_back(*b);
  auto c = Measure("(c) dense, all on the CPU", **model, pool, std::nullopt, base, *pt, *gt, r);
  if (!c.ok()) return Fail("bench", c.status());
  rows.push_back(*c);

  const LlamaHparams& h = (*model)->hparams();
  const double weights = static_cast<double>((*model)->weight_bytes());
  if (args.Has("--json")) {
    nlohmann::json out = {{"model", *args.Get("--model")},
                          {"n_layer", h.n_layer},
                          {"weight_bytes", weights},
                          {"gpu_memory", *cap_arg > 0 ? *cap_arg : 0},
                          {"threads", *threads},
                          {"prompt_tokens", *pt},
                          {"gen_tokens", *gt}};
    for (const Row& r : rows) {
      out["rows"].push_back({{"config", r.name},
                             {"decode_tokens_per_s", r.tokens_per_s},
                             {"gpu_bytes", r.gpu_bytes},
                             {"note", r.note}});
    }
    if (compare) out["hybrid_vs_ngl"] = rows[0].tokens_per_s / rows[1].tokens_per_s;
    std::cout << out.dump(2) << "\n";
    return 0;
  }
  std::printf(
      "decode tokens/s: %s, %lld layers, weights %.0f MiB, --gpu-memory %s, "
      "%d threads, %lld tokens after %lld, median of %lld\n",
      args.Get("--model")->c_str(), static_cast<long long>(h.n_layer), weights / 1048576,
      *cap_arg > 0
          ? absl::StrCat(*cap_arg >> 20, " MiB (", static_cast<int>(100 * *cap_arg / weights + 0.5),
                         "% of the weights)")
                .c_str()
          : "free device memory",
      *threads, static_cast<long long>(*gt), static_cast<long long>(*pt),
      static_cast<long long>(*reps));
  std::printf("%-48s %10s %8s %10s  %s\n", "config", "tokens/s", "vs (c)", "GPU MiB", "note");
  const double cpu = rows.back().tokens_per_s;
  for (const Row& r : rows) {
    std::printf("%-48s %10.2f %7.2fx %10.0f  %s\n", r.name.c_str(), r.tokens_per_s,
                r.tokens_per_s / cpu, r.gpu_bytes / 1048576.0, r.note.c_str());
  }
  if (compare) {
    std::printf("(a)/(b) = %.2fx (target >= 3x)\n", rows[0].tokens_per_s / rows[1].tokens_per_s);
  }
  return 0;
}

}  // namespace thermocline::cli
