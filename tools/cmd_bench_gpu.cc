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
#include "nlohmann/json.hpp"
#include "offline/sparse_loader.h"
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

// Stands in for the sparse backend while the memory of hybrid GPU layers is computed (which
// only asks whether the FFN runs on the host).
class HostFfnPlaceholder : public FfnBackend {
 public:
  void Forward(int, const float*, const float*, int64_t, float*) override {}
};

// (a): the placement's GPU attention layers as hybrid GPU layers (their FFN through the sparse
// backend), the sparse backend's GPU part under what is left of the cap.
absl::StatusOr<Row> Hybrid(const LlamaModel& model, ThreadPool& pool, Session& session,
                           const std::string& sidecar_path, uint64_t cap, int64_t pt, int64_t gt,
                           int reps) {
  absl::StatusOr<offline::Sidecar> sidecar = offline::LoadSidecarFor(sidecar_path, model);
  if (!sidecar.ok()) return sidecar.status();
  const int64_t n_layer = model.hparams().n_layer;
  gpu::GpuLayersSpec spec;
  spec.model = &model;
  spec.layers.assign(n_layer, 0);
  int64_t n_attn = 0;
  for (int64_t l = 0; l < n_layer && l < static_cast<int64_t>(sidecar->layers.size()); ++l) {
    spec.layers[l] = sidecar->layers[l].attention_gpu ? 1 : 0;
    n_attn += spec.layers[l];
  }
  spec.output = sidecar->placement.output_gpu && n_layer > 0 && spec.layers[n_layer - 1];
  spec.n_ctx = session.n_ctx();
  spec.max_batch = session.max_batch();
  HostFfnPlaceholder placeholder;
  spec.host_ffn = &placeholder;
  const uint64_t layer_bytes = n_attn > 0 ? gpu::ComputeGpuLayersMemory(spec).Total(spec) : 0;
  Row row;
  row.name = "(a) hybrid sparse, solved placement";
  for (bool with_attention : {true, false}) {
    if (with_attention && n_attn == 0) continue;
    const uint64_t layers_cap = with_attention ? layer_bytes : 0;
    if (layers_cap > cap) continue;
    SparseFfnOptions options;
    options.gpu = true;
    options.gpu_memory = cap - layers_cap;
    options.dense_prefill = true;
    absl::StatusOr<std::unique_ptr<SparseFfn>> sparse =
        offline::LoadSparseFfn(sidecar_path, model, &pool, options);
    if (!sparse.ok() && absl::IsResourceExhausted(sparse.status()) && with_attention) continue;
    if (!sparse.ok()) return sparse.status();
    if (!(*sparse)->gpu_status().ok()) return (*sparse)->gpu_status();
    std::unique_ptr<gpu::GpuLayers> layers;
    if (with_attention) {
      spec.host_ffn = sparse->get();
      spec.memory_cap = layers_cap;
      absl::StatusOr<std::unique_ptr<gpu::GpuLayers>> l = gpu::CreateGpuLayers(spec);
      if (!l.ok()) return l.status();
      layers = *std::move(l);
    }
    (*sparse)->set_session(&session);
    session.set_ffn_backend(sparse->get());
    session.set_layer_backend(layers.get());
    absl::StatusOr<double> tps = DecodeTokensPerS(session, pt, gt, reps);
    session.set_ffn_backend(nullptr);
    session.set_layer_backend(nullptr);
    if (!tps.ok()) return tps.status();
    row.tokens_per_s = *tps;
    row.gpu_bytes = (*sparse)->gpu_device_bytes() + (layers ? layers->device_bytes() : 0);
    const SparseFfnStats& st = (*sparse)->stats();
    const double active =
        st.layer_tokens ? st.predicted / st.layer_tokens / model.hparams().n_ff : 0;
    row.note = absl::StrCat(with_attention ? n_attn : 0, " attention layers on the GPU",
                            spec.output && with_attention ? " + head" : "", ", ",
                            static_cast<int>(100 * active + 0.5), "% neurons predicted active");
    return row;
  }
  return absl::ResourceExhaustedError(
      "the sidecar's placement does not fit under --gpu-memory; "
      "solve it for this cap (thermocline solve --gpu-memory)");
}

// (b): the first n layers dense on the GPU.
absl::StatusOr<Row> Ngl(const LlamaModel& model, Session& session, int64_t requested, uint64_t cap,
                        int64_t pt, int64_t gt, int reps) {
  absl::StatusOr<gpu::GpuLayersSpec> spec =
      gpu::PlanWholeLayers(model, requested, session.n_ctx(), session.max_batch(), cap);
  if (!spec.ok()) return spec.status();
  const int64_t n = std::count(spec->layers.begin(), spec->layers.end(), 1);
  std::unique_ptr<gpu::GpuLayers> layers;
  if (n > 0) {
    absl::StatusOr<std::unique_ptr<gpu::GpuLayers>> l = gpu::CreateGpuLayers(*spec);
    if (!l.ok()) return l.status();
    layers = *std::move(l);
  }
  session.set_layer_backend(layers.get());
  absl::StatusOr<double> tps = DecodeTokensPerS(session, pt, gt, reps);
  session.set_layer_backend(nullptr);
  if (!tps.ok()) return tps.status();
  Row row{absl::StrCat("(b) dense, ", n, "/", model.hparams().n_layer, " layers on the GPU",
                       spec->output ? " + head" : ""),
          *tps, layers ? layers->device_bytes() : 0, "-ngl style"};
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
  SessionOptions so;
  so.n_ctx = *pt + *gt + 1;
  so.max_batch = std::min<int64_t>(*pt, 64);
  auto session = Session::Create(**model, &pool, so);
  if (!session.ok()) return Fail("bench", session.status());
  const uint64_t cap =
      *cap_arg > 0 ? static_cast<uint64_t>(*cap_arg) : gpu::MemoryBudget::kUnlimited;

  std::vector<Row> rows;
  if (compare) {
    auto a = Hybrid(**model, pool, **session, *args.Get("--sidecar"), cap, *pt, *gt,
                    static_cast<int>(*reps));
    if (!a.ok()) return Fail("bench", a.status());
    rows.push_back(*a);
  }
  auto b = Ngl(**model, **session, *requested, cap, *pt, *gt, static_cast<int>(*reps));
  if (!b.ok()) return Fail("bench", b.status());
  rows.push_back(*b);
  auto c = DecodeTokensPerS(**session, *pt, *gt, static_cast<int>(*reps));
  if (!c.ok()) return Fail("bench", c.status());
  rows.push_back(Row{"(c) dense, all on the CPU", *c, 0, "reference"});

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
          : "unlimited",
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
