// thermocline bench --gpu-compare / --gpu-layers: decode tokens/s with the GPU, in one run.
//   (a) hybrid sparse: the sidecar's solved placement (GPU attention layers, hot neurons on the
//       GPU, cold neurons on the CPU) under --gpu-memory;
//   (b) dense, -ngl style: as many whole layers on the GPU as fit under --gpu-memory (or
//       --gpu-layers N), the rest on the CPU;
//   (c) dense, all on the CPU (the reference);
// with the ratios (a)/(b) and each against (c). `--gpu-layers` without --gpu-compare measures
// (b) and (c); with an input-sparse or gate-first plan (--sidecar, --sparse-method) also
//   (s) its layers so, whole on the GPU as (b)'s, and (s') all on the CPU,
// with (s)/(b), (s)'s greedy tokens held to (s')'s.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bench/cpu_device.h"
#include "engine/gpu/gpu_backend.h"
#include "engine/gpu/gpu_layers.h"
#include "engine/runtime/engine.h"
#include "nlohmann/json.hpp"
#include "offline/sidecar/sidecar.h"
#include "offline/solver/hardware.h"
#include "offline/solver/placement.h"
#include "tools/commands.h"

namespace thermocline::cli {
namespace {

// Measured per layer on the hybrid row: the host's part and the waits for the device's.
struct LayerMeasured {
  double host_s = 0, wait_s = 0;  // per token
};

struct Row {
  std::string name;
  double tokens_per_s = 0;
  uint64_t gpu_bytes = 0;
  std::string note;
  std::vector<int32_t> tokens;  // the greedy tokens of the first run
  std::vector<float> logits;    // (tokens, n_vocab): the logits each of them was chosen from
  std::vector<LayerMeasured> layers;
  // The row whose greedy tokens this one must give: an index into the rows, kLastRow ((c)), or
  // kUnchecked.
  int reference = kLastRow;
  static constexpr int kLastRow = -1, kUnchecked = -2;
};

// How far a row's logits may stray from (c)'s at a step with the same context, as a share of
// (c)'s logit range there: a sparse row moves them by its predictor's misses (the stand-in test
// model: 0.3-0.5% of the range at recall 0.99), a device row by its summation order; a wrong
// kernel moves them by whole units.
constexpr double kMaxDeviation = 0.05;

// Where a row's greedy tokens part from (c)'s, whether that is a near-tie: both rows have the
// same context up to it, so their logits are compared step by step; the row's logits stay within
// kMaxDeviation of (c)'s range, and at the step where they part, (c) prefers its token by no
// more than twice what the row's logits deviate there (either candidate may win). Empty when
// the row passes; else what is wrong.
std::string CompareWithCpu(const Row& row, const Row& cpu, int64_t n_vocab) {
  for (size_t i = 0; i < cpu.tokens.size(); ++i) {
    if (i >= row.tokens.size()) return absl::StrCat("stops at token ", i);
    const float* want = cpu.logits.data() + i * n_vocab;
    const float* got = row.logits.data() + i * n_vocab;
    double deviation = 0, lo = want[0], hi = want[0];
    for (int64_t v = 0; v < n_vocab; ++v) {
      deviation = std::max(deviation, static_cast<double>(std::fabs(got[v] - want[v])));
      lo = std::min<double>(lo, want[v]);
      hi = std::max<double>(hi, want[v]);
    }
    if (deviation > kMaxDeviation * (hi - lo)) {
      return absl::StrCat("at token ", i, " its logits differ from the CPU's by up to ", deviation,
                          " (their range: ", hi - lo, ")");
    }
    if (row.tokens[i] == cpu.tokens[i]) continue;
    const double gap = want[cpu.tokens[i]] - want[row.tokens[i]];
    if (gap > 2 * deviation) {
      return absl::StrCat("decodes token ", i, " as ", row.tokens[i], " where the CPU gives ",
                          cpu.tokens[i], ", ", gap, " above it in the CPU's logits");
    }
    return "";  // a near-tie: the contexts differ from here on
  }
  return "";
}

// Median decode tokens/s over `reps` runs: a prompt, then `gen` greedy single-token steps; the
// first run's tokens into *tokens and the logits they were chosen from into *logits (a copy
// per step, in the first run only: the median is of the untouched runs when reps >= 3).
absl::StatusOr<double> DecodeTokensPerS(Session& session, int64_t prompt_tokens, int64_t gen,
                                        int reps, std::vector<int32_t>* tokens,
                                        std::vector<float>* logits) {
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
      if (r == 0) {
        tokens->push_back(next);
        logits->insert(logits->end(), l, l + n_vocab);
      }
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
  Row row;
  if (SparseFfn* sparse = (*session)->sparse(); sparse != nullptr) sparse->ResetStats();
  absl::StatusOr<double> tps =
      DecodeTokensPerS((*session)->session(), pt, gt, reps, &row.tokens, &row.logits);
  if (!tps.ok()) return tps.status();
  row.name = name;
  row.tokens_per_s = *tps;
  row.gpu_bytes = (*session)->device_bytes();
  row.note = DescribePlacement((*session)->placement());
  if (const SparseFfn* sparse = (*session)->sparse(); sparse != nullptr) {
    const SparseFfnStats& st = sparse->stats();
    const gpu::GpuLayers* layers = (*session)->gpu_layers();
    for (size_t l = 0; l < st.layer_calls.size(); ++l) {
      LayerMeasured m;
      const double calls = std::max<int64_t>(1, st.layer_calls[l]);
      m.host_s = st.layer_host_s[l] / calls;
      m.wait_s = st.layer_wait_s[l] / calls;
      if (layers != nullptr && l < layers->resident_wait_seconds().size()) {
        m.wait_s += layers->resident_wait_seconds()[l] / calls;
      }
      row.layers.push_back(m);
    }
    const LlamaHparams& h = model.hparams();
    if (st.layer_tokens > 0) {
      const double active = st.predicted / st.layer_tokens / h.n_ff;
      absl::StrAppend(&row.note, ", ", static_cast<int>(100 * active + 0.5),
                      "% neurons predicted active");
    }
    if (st.attn_in_tokens > 0) {
      auto percent = [&](double kept, double tokens) {
        return static_cast<int>(100 * kept / tokens / h.n_embd + 0.5);
      };
      absl::StrAppend(&row.note, ", the CPU layers kept ",
                      percent(st.attn_in_kept, st.attn_in_tokens), "% of attention's inputs and ",
                      percent(st.ffn_in_kept, st.ffn_in_tokens), "% of the FFN's");
    }
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
  // --stand-in: the CPU stand-in device (bench/cpu_device.h) instead of CUDA, to check the
  // comparison itself (tokens, placement, the modelled table) on a machine without a GPU; its
  // speeds mean nothing.
  const bool stand_in = args.Has("--stand-in");
  static const CpuStandInDevice stand_in_device;
  if (absl::StatusOr<gpu::DeviceInfo> d = gpu::Probe(); !d.ok() && !stand_in) {
    return Fail("bench", absl::UnavailableError(
                             absl::StrCat(compare ? "--gpu-compare" : "--gpu-layers",
                                          " needs a CUDA device: ", d.status().message())));
  }
  auto model = LoadModelFromArgs(args);
  if (!model.ok()) return Fail("bench", model.status());
  ThreadPool pool(*threads);
  EngineOptions base;
  if (stand_in) base.device = &stand_in_device;
  base.n_ctx = *pt + *gt + 1;
  base.max_batch = std::min<int64_t>(*pt, 64);
  // Every row with the same KV cache type (--kv-type, default f16): the device layers keep theirs
  // in it too, so the rows' greedy tokens can be held to the CPU row's.
  if (auto text = args.Get("--kv-type"); text && !ParseKvType(*text, &base.kv_type)) {
    return Fail("bench", absl::InvalidArgumentError(
                             absl::StrCat("--kv-type '", *text, "' is not one of f16, f32")));
  }
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
    auto a = Measure("(a) hybrid sparse, solved placement", **model, pool, *std::move(plan), hybrid,
                     *pt, *gt, r);
    if (!a.ok()) return Fail("bench", a.status());
    rows.push_back(*a);
  }
  EngineOptions ngl = base;
  ngl.gpu_layers = *requested;
  if (*cap_arg > 0) ngl.gpu_memory = static_cast<uint64_t>(*cap_arg);
  EngineOptions cpu_only = base;
  cpu_only.device = nullptr;
  // An input-sparse or gate-first plan: its whole layers on the GPU, against the same plan on the
  // CPU.
  std::optional<Row> cpu_input_sparse;
  if (!compare && args.Get("--sidecar")) {
    absl::StatusOr<std::optional<SparsePlan>> plan =
        SparsePlanFromArgs(args, **model, /*check_speed=*/false);
    if (!plan.ok()) return Fail("bench", plan.status());
    if (!plan->has_value() ||
        std::none_of((*plan)->layers.begin(), (*plan)->layers.end(), [](const SparseLayerPlan& p) {
          return p.method == SparseMethod::kInputSparse || p.method == SparseMethod::kGateFirst;
        })) {
      return Fail("bench",
                  absl::InvalidArgumentError(
                      "--gpu-layers with --sidecar: whole GPU layers run an input-sparse or "
                      "gate-first plan (--sparse-method input-sparse or gate-first); a hybrid "
                      "placement is --gpu-compare's"),
                  true);
    }
    const std::string method = SparseMethodsOf((*plan)->layers);
    // The prompt sparse too on both sides: with dense prefill the GPU reads every column of its
    // layouts (int8 activations) where the CPU reads its own matrices, and a context that
    // differs by that rounding would part their tokens at the first near-tie. Decode speed is
    // the same either way.
    EngineOptions ngl_sparse = ngl;
    ngl_sparse.dense_prefill = false;
    EngineOptions cpu_sparse = cpu_only;
    cpu_sparse.dense_prefill = false;
    auto s = Measure("(s) " + method + ", whole layers on the GPU", **model, pool, *std::move(plan),
                     ngl_sparse, *pt, *gt, r);
    if (!s.ok()) return Fail("bench", s.status());
    plan = SparsePlanFromArgs(args, **model, /*check_speed=*/false);  // a plan is moved per use
    if (!plan.ok()) return Fail("bench", plan.status());
    auto sc = Measure("(s') " + method + ", all on the CPU", **model, pool, *std::move(plan),
                      cpu_sparse, *pt, *gt, r);
    if (!sc.ok()) return Fail("bench", sc.status());
    rows.push_back(*s);
    rows.back().reference = 2;  // (s'), after (b)
    cpu_input_sparse = *sc;
    cpu_input_sparse->reference = Row::kUnchecked;  // sparse: not dense's tokens
  }
  auto b = Measure("(b) dense, whole layers on the GPU (-ngl)", **model, pool, std::nullopt, ngl,
                   *pt, *gt, r);
  if (!b.ok()) return Fail("bench", b.status());
  rows.push_back(*b);
  if (cpu_input_sparse.has_value()) rows.push_back(*cpu_input_sparse);
  auto c = Measure("(c) dense, all on the CPU", **model, pool, std::nullopt, cpu_only, *pt, *gt, r);
  if (!c.ok()) return Fail("bench", c.status());
  rows.push_back(*c);

  // Speed means nothing if the placement computes another model: (a) and (b) must give (c)'s
  // greedy tokens, up to a near-tie (CompareWithCpu).
  const int64_t n_vocab = (*model)->hparams().n_vocab;
  for (size_t r = 0; r + 1 < rows.size(); ++r) {
    if (rows[r].reference == Row::kUnchecked) continue;
    const Row& ref = rows[r].reference == Row::kLastRow ? rows.back() : rows[rows[r].reference];
    const std::string label = ref.name.substr(0, ref.name.find(' '));
    const std::string wrong = CompareWithCpu(rows[r], ref, n_vocab);
    if (!wrong.empty()) {
      return Fail("bench", absl::InternalError(absl::StrCat(rows[r].name, " ", wrong, " (against ",
                                                            label, "): not reporting its speed")));
    }
    const std::vector<int32_t>& want = ref.tokens;
    const auto parted = std::mismatch(want.begin(), want.end(), rows[r].tokens.begin()).first;
    if (parted != want.end()) {
      absl::StrAppend(&rows[r].note, "; greedy tokens as ", label, "'s up to a near-tie at token ",
                      parted - want.begin());
    }
  }
  const LlamaHparams& h = (*model)->hparams();
  const double weights = static_cast<double>((*model)->weight_bytes());
  // The placement's model of this machine next to what (a) measured.
  std::vector<offline::ModelledLayer> modelled;
  double modelled_tps = 0;
  if (compare) {
    absl::StatusOr<offline::Sidecar> sidecar =
        offline::LoadSidecarFor(*args.Get("--sidecar"), **model);
    offline::HardwareProfile hw;
    if (auto path = args.Get("--hardware-profile")) {
      absl::StatusOr<offline::HardwareProfile> read = offline::ReadHardwareProfile(*path);
      if (!read.ok()) return Fail("bench", read.status());
      hw = *read;
    }
    offline::MeasureCpuIfMissing(hw, pool);
    if (sidecar.ok()) {
      offline::ProblemOptions po;
      po.budget_bytes = static_cast<double>(*cap_arg);
      po.context = base.n_ctx;
      po.max_batch = base.max_batch;
      po.kv_type = base.kv_type;
      absl::StatusOr<offline::PlacementProblem> problem =
          offline::BuildPlacementProblem(**model, *sidecar, hw, po);
      if (problem.ok()) {
        double output_s = 0;
        modelled = offline::ModelledLayerTimes(*problem, *sidecar, &output_s);
        double token_s = output_s;
        for (const offline::ModelledLayer& m : modelled) {
          token_s += m.attention_s + std::max(m.gpu_ffn_s, m.cpu_ffn_s) + m.sync_s;
        }
        modelled_tps = token_s > 0 ? 1.0 / token_s : 0;
      }
    }
  }
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
    if (cpu_input_sparse.has_value()) {
      out["input_sparse_vs_ngl"] = rows[0].tokens_per_s / rows[1].tokens_per_s;
    }
    if (compare) {
      out["hybrid_vs_ngl"] = rows[0].tokens_per_s / rows[1].tokens_per_s;
      out["modelled_tokens_per_s"] = modelled_tps;
      for (size_t l = 0; l < modelled.size(); ++l) {
        const offline::ModelledLayer& m = modelled[l];
        nlohmann::json j = {{"layer", l},
                            {"attention_gpu", m.attention_gpu},
                            {"gpu_neurons", m.gpu_neurons},
                            {"modelled_gpu_ffn_s", m.gpu_ffn_s},
                            {"modelled_cpu_ffn_s", m.cpu_ffn_s},
                            {"modelled_sync_s", m.sync_s}};
        if (l < rows[0].layers.size()) {
          j["measured_host_s"] = rows[0].layers[l].host_s;
          j["measured_wait_s"] = rows[0].layers[l].wait_s;
        }
        out["layers"].push_back(j);
      }
    }
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
  if (cpu_input_sparse.has_value()) {
    std::printf(
        "(s)/(b) = %.2fx: sparse over dense, both whole layers on the GPU; (s) gave (s')'s "
        "greedy tokens (%zu, or up to a near-tie: see the notes)\n",
        rows[0].tokens_per_s / rows[1].tokens_per_s, rows[2].tokens.size());
  }
  if (compare) {
    std::printf(
        "(a)/(b) = %.2fx (target >= 3x); (a) and (b) gave (c)'s greedy tokens (%zu, or up to a "
        "near-tie: see the notes)\n",
        rows[0].tokens_per_s / rows[1].tokens_per_s, rows.back().tokens.size());
    std::printf("(a) modelled by the placement: %.2f tokens/s, measured %.2f (%.2fx)\n",
                modelled_tps, rows[0].tokens_per_s,
                modelled_tps > 0 ? rows[0].tokens_per_s / modelled_tps : 0.0);
    std::printf("%5s %4s %8s | %12s %12s %10s | %12s %12s\n", "layer", "attn", "gpu neur",
                "model GPU us", "model CPU us", "sync us", "host us", "wait us");
    for (size_t l = 0; l < modelled.size(); ++l) {
      const offline::ModelledLayer& m = modelled[l];
      const LayerMeasured got = l < rows[0].layers.size() ? rows[0].layers[l] : LayerMeasured{};
      std::printf("%5zu %4s %8lld | %12.1f %12.1f %10.1f | %12.1f %12.1f\n", l,
                  m.attention_gpu ? "gpu" : "cpu", static_cast<long long>(m.gpu_neurons),
                  1e6 * m.gpu_ffn_s, 1e6 * m.cpu_ffn_s, 1e6 * m.sync_s, 1e6 * got.host_s,
                  1e6 * got.wait_s);
    }
    std::printf(
        "(host: the CPU's part of the layer's FFN; wait: the host blocked on the device, before "
        "its part in a resident layer, after it otherwise)\n");
    double host = 0, wait = 0;
    for (const LayerMeasured& m : rows[0].layers) {
      host += m.host_s;
      wait += m.wait_s;
    }
    if (rows[0].tokens_per_s > 0) {
      const double token = 1.0 / rows[0].tokens_per_s;
      std::printf(
          "(a) per token: %.0f us = host parts %.0f + waits %.0f + the rest %.0f (launches, the "
          "GPU's attention and head, the CPU's other work)\n",
          1e6 * token, 1e6 * host, 1e6 * wait, 1e6 * (token - host - wait));
    }
  }
  const gpu::GraphCounts graphs = gpu::CudaGraphCounts();
  std::printf("CUDA graphs: %lld captured, %lld run as direct launches%s%s\n",
              static_cast<long long>(graphs.captured), static_cast<long long>(graphs.direct),
              graphs.last_refusal != nullptr ? "; last refusal: " : "",
              graphs.last_refusal != nullptr ? graphs.last_refusal : "");
  return 0;
}

}  // namespace thermocline::cli
