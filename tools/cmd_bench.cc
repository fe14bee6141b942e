// thermocline bench: prefill and decode tokens/s (median of several runs), the weight-read
// bandwidth decode achieves, and the memory read bandwidth measured on the same run.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "bench/model_bench.h"
#include "bench/sparse_read_floor.h"
#include "engine/model/activation.h"
#include "engine/ops/kernels.h"
#include "nlohmann/json.hpp"
#include "offline/solver/hardware.h"
#include "tools/commands.h"

namespace thermocline::cli {
namespace {

// Decode tokens/s of one run of `session` (its FFN backend as set): a prompt of prompt_tokens,
// then gen_tokens single-token evaluations.
absl::StatusOr<double> DecodeTokensPerS(Session& session, const BenchOptions& o) {
  const int64_t n_vocab = session.model().hparams().n_vocab;
  std::vector<int32_t> prompt(std::max<int64_t>(o.prompt_tokens, 1));
  for (size_t i = 0; i < prompt.size(); ++i)
    prompt[i] = static_cast<int32_t>((i * 7919 + 1) % n_vocab);
  session.Reset();
  if (absl::Status s = session.Eval(prompt); !s.ok()) return s;
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t t = 0; t < o.gen_tokens; ++t) {
    const float* l = session.logits();
    const int32_t next = static_cast<int32_t>(std::max_element(l, l + n_vocab) - l);
    if (absl::Status s = session.Eval({&next, 1}); !s.ok()) return s;
  }
  return o.gen_tokens /
         std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Dense and sparse decode in the same run, their ratio, the ideal ratio from the weight bytes
// each reads per token (predictors included), and the read floor
// (bench/sparse_read_floor.h): the ratio of a sparse token whose FFN cost only
// fetching its rows.
int BenchSparse(const Engine& dense_engine, const Engine& sparse_engine, ThreadPool& pool,
                const BenchOptions& o, bool json) {
  const LlamaModel& model = sparse_engine.model();
  auto dense_session = dense_engine.NewSession(&pool);
  if (!dense_session.ok()) return Fail("bench", dense_session.status());
  auto sparse_session = SessionFor(sparse_engine, &pool);
  if (!sparse_session.ok()) return Fail("bench", sparse_session.status());
  SparseFfn& sparse = *(*sparse_session)->sparse();
  sparse.ResetStats();
  // Interleaved, so that load from elsewhere hits both alike; medians of the runs.
  std::vector<double> dense_runs, sparse_runs;
  for (int r = 0; r < std::max(1, o.repetitions); ++r) {
    for (bool use_sparse : {false, true}) {
      EngineSession& s = use_sparse ? **sparse_session : **dense_session;
      auto tps = DecodeTokensPerS(s.session(), o);
      if (!tps.ok()) return Fail("bench", tps.status());
      (use_sparse ? sparse_runs : dense_runs).push_back(*tps);
    }
  }
  const double dense_tps_value = Median(dense_runs), sparse_tps_value = Median(sparse_runs);
  const double* dense_tps = &dense_tps_value;
  const double* sparse_tps = &sparse_tps_value;
  const SparseFfnStats& st = sparse.stats();
  const double n_ff = model.hparams().n_ff;
  const double predicted = st.layer_tokens ? st.predicted / st.layer_tokens / n_ff : 0;
  const double up_rows = st.layer_tokens ? st.up_rows / st.layer_tokens / n_ff : 0;
  const double fired = st.layer_tokens ? st.fired / st.layer_tokens / n_ff : 0;
  // Input-sparse layers: the shares of q/k/v's and gate/up's input entries kept (columns read)
  // and of the neurons whose activation passed to down.
  const double n_embd = model.hparams().n_embd;
  const double attn_in = st.attn_in_tokens ? st.attn_in_kept / st.attn_in_tokens / n_embd : 0;
  const double ffn_in = st.ffn_in_tokens ? st.ffn_in_kept / st.ffn_in_tokens / n_embd : 0;
  const double ffn_in_fired = st.ffn_in_tokens ? st.ffn_in_fired / st.ffn_in_tokens / n_ff : 0;
  const std::string methods = SparseMethodsOf(sparse.plan());
  const double ratio = *sparse_tps / *dense_tps;
  const double dense_bytes = sparse.DenseBytesPerToken(),
               sparse_bytes = sparse.SparseBytesPerToken();
  const double ideal = dense_bytes / sparse_bytes;
  const double predictor_share = st.total_s > 0 ? st.predictor_s / st.total_s : 0;
  // Per decoded token: the sparse FFN's share of the whole token (predictors within it); of an
  // input-sparse plan, its q/k/v's and FFN's.
  const double layer_tokens =
      std::max<double>(1.0, static_cast<double>(st.layer_tokens + st.ffn_in_tokens));
  const double ffn_ms = 1e3 * st.total_s * model.hparams().n_layer / layer_tokens;
  // The read floor: one more sparse run, recorded (untimed), and the rows it read read again
  // with nothing computed, the rest of a token's weights streamed between tokens. The token it
  // bounds: the measured one with its sparse part replaced by only those reads. For a plan of
  // one kind: the fused path's rows, or the input-sparse layouts' (whose q/k/v are sparse too).
  double floor_ms = 0;
  const bool all_input_sparse = st.layer_tokens == 0 && st.ffn_in_tokens > 0;
  if (st.ffn_in_tokens == 0 || all_input_sparse) {
    ActiveSetRecorder recorder;
    sparse.set_active_set_observer(&recorder);
    const absl::StatusOr<double> recorded = DecodeTokensPerS((*sparse_session)->session(), o);
    sparse.set_active_set_observer(nullptr);
    if (!recorded.ok()) return Fail("bench", recorded.status());
    const auto replay = all_input_sparse ? ReplayColumnReads : ReplaySparseReads;
    floor_ms = 1e3 * replay(*sparse.weights(), pool, recorder, std::max(1, o.repetitions),
                            static_cast<size_t>(sparse.NonFfnBytesPerToken()));
  }
  const bool have_floor = floor_ms > 0;
  const double floor_token_ms = 1e3 / *sparse_tps - ffn_ms + floor_ms;
  const double floor_ratio = (1e3 / *dense_tps) / floor_token_ms;
  if (json) {
    nlohmann::json out = {{"dense_decode_tokens_per_s", *dense_tps},
                          {"sparse_decode_tokens_per_s", *sparse_tps},
                          {"ratio", ratio},
                          {"ideal_ratio", ideal},
                          {"of_ideal", ratio / ideal},
                          {"method", methods},
                          {"predicted_active", predicted},
                          {"up_rows", up_rows},
                          {"fired", fired},
                          {"attn_inputs_kept", attn_in},
                          {"ffn_inputs_kept", ffn_in},
                          {"input_sparse_fired", ffn_in_fired},
                          {"predictor_share_of_ffn_time", predictor_share},
                          {"sparse_ffn_ms_per_token", ffn_ms},
                          {"sparse_token_ms", 1e3 / *sparse_tps},
                          {"oracle", sparse.options().oracle}};
    if (have_floor) {
      out["ffn_read_floor_ms_per_token"] = floor_ms;
      out["floor_token_ms"] = floor_token_ms;
      out["floor_ratio"] = floor_ratio;
      out["floor_of_ideal"] = floor_ratio / ideal;
    }
    std::cout << out.dump(2) << "\n";
  } else {
    std::printf(
        "threads %d, %s | decode %lld tokens after %lld: dense %.2f tokens/s, sparse "
        "%.2f tokens/s%s\nratio %.2fx, ideal %.2fx (weight bytes dense %.1f MiB / sparse "
        "%.1f MiB per token), %.0f%% of ideal\n",
        pool.size(), IsaName(BestIsa()), static_cast<long long>(o.gen_tokens),
        static_cast<long long>(o.prompt_tokens), *dense_tps, *sparse_tps,
        sparse.options().oracle ? " (oracle)" : "", ratio, ideal, dense_bytes / 1048576.0,
        sparse_bytes / 1048576.0, 100 * ratio / ideal);
    if (st.layer_tokens > 0) {
      std::printf(
          "%s: %.1f%% of gate rows, %.1f%% of up rows, %.1f%% of down rows; "
          "predictors %.0f%% of sparse FFN time; sparse FFN %.2f of %.2f ms per token\n",
          methods.c_str(), 100 * predicted, 100 * up_rows, 100 * fired, 100 * predictor_share,
          ffn_ms, 1e3 / *sparse_tps);
    }
    if (st.ffn_in_tokens > 0) {
      std::printf(
          "input-sparse: columns of %.1f%% of q/k/v's inputs and %.1f%% of gate/up's, %.1f%% of "
          "down rows; q/k/v and FFN %.2f of %.2f ms per token\n",
          100 * attn_in, 100 * ffn_in, 100 * ffn_in_fired, ffn_ms, 1e3 / *sparse_tps);
    }
    if (have_floor) {
      std::printf(
          "read floor: %s alone %.2f ms per token (%s replayed, cold); a sparse token at that "
          "floor %.2f ms: %.2fx, %.0f%% of ideal\n",
          all_input_sparse ? "q/k/v's and the FFN's kept columns" : "the FFN's rows", floor_ms,
          all_input_sparse ? "the kept inputs and fired neurons" : "its active sets",
          floor_token_ms, floor_ratio, 100 * floor_ratio / ideal);
    }
  }
  return 0;
}

// bench --hardware: the solver's hardware profile with this machine's CPU measured; the GPU
// figures come from --gpu-profile (configs/hardware/*.toml) or the built-in defaults.
int BenchHardware(const Args& args) {
  for (const char* in : {"--model", "--sidecar"}) {
    if (absl::Status s = CheckNotOverwriting(args, "--output", in); !s.ok()) {
      return Fail("bench", s, true);
    }
  }
  auto threads = ThreadsFromArgs(args);
  if (!threads.ok()) return Fail("bench", threads.status(), true);
  offline::HardwareProfile hw;
  if (auto path = args.Get("--gpu-profile")) {
    auto read = offline::ReadHardwareProfile(*path);
    if (!read.ok()) return Fail("bench", read.status());
    hw = *read;
  }
  hw.cpu_bandwidth_gbps = 0;  // always measure: that is what this command is for
  ThreadPool pool(*threads);
  offline::MeasureCpuIfMissing(hw, pool);
  const std::string text = offline::FormatHardwareProfile(hw);
  if (auto out = args.Get("--output")) {
    std::ofstream f(*out);
    f << text;
    if (!f) return Fail("bench", absl::InternalError(absl::StrCat("cannot write ", *out)));
    std::printf("wrote %s (CPU read bandwidth %.2f GB/s)\n", out->c_str(), hw.cpu_bandwidth_gbps);
  } else {
    std::fputs(text.c_str(), stdout);
  }
  return 0;
}

// SwiGLU: the sparsity each method runs at and where it comes from.
void PrintThresholds(const SparsePlan& plan) {
  if (!plan.thresholds.empty()) std::printf("thresholds: %s\n", plan.thresholds.c_str());
  if (!plan.speed.empty()) std::printf("the sidecar's speed check: %s\n", plan.speed.c_str());
}

}  // namespace

int RunBench(int argc, char** argv) {
  // `bench --ops`: the sparse operator benchmark, with its own flags (tools/cmd_bench_ops.cc).
  for (int i = 0; i < argc; ++i) {
    if (std::strcmp(argv[i], "--ops") == 0) return RunBenchOps(argc, argv);
  }
  auto args = Args::Parse(
      argc, argv,
      {"--model", "--prompt-tokens", "--gen-tokens", "--threads", "--repetitions", "--activation",
       "--sparse", "--sidecar", "--target-sparsity", "--sparse-method", "--gpu-profile", "--output",
       "--gpu-memory", "--gpu-layers", "--hardware-profile", "--json-schema", "--prompt",
       "--kv-type"},
      {"--json", "--help", "--oracle", "--hardware", "--gpu-compare", "--stand-in", "--no-repack"},
      {{"-m", "--model"}, {"-t", "--threads"}, {"-h", "--help"}, {"-o", "--output"}});
  if (!args.ok()) return Fail("bench", args.status(), true);
  if (args->Has("--help")) {
    std::puts(
        "usage: thermocline bench -m MODEL [--prompt-tokens 64] [--gen-tokens 64] "
        "[--threads N] [--repetitions 5] [--json]\n"
        "  --activation A           override the FFN activation: silu | relu | drelu\n"
        "  --kv-type f16|f32        KV cache element type (default f16, as llama.cpp's)\n"
        "  --no-repack              read the weights from the file's mapping (default: Q4_0 and\n"
        "                           Q2_K..Q6_K re-laid at load in groups of 16 rows, the other\n"
        "                           types copied onto huge pages, for the CPU's dense path)");
    std::fputs(kSparseUsage, stdout);
    std::fputs(kGpuLayersUsage, stdout);
    std::puts(
        "  --sparse-method A,B      several methods: each against dense, in turn (default for\n"
        "                           a SwiGLU sidecar: predicted, and gate-first and\n"
        "                           input-sparse where it has their statistics)\n"
        "  a mixture of experts: decode tokens/s of every expert computed (dense), of the\n"
        "  routed experts on the CPU, and of --sidecar's expert placement under --gpu-memory\n"
        "  (--stand-in: on the CPU stand-in device)\n"
        "  --gpu-compare            decode tokens/s of (a) the hybrid sparse placement of\n"
        "                           --sidecar, (b) dense with --gpu-layers (default auto) whole\n"
        "                           layers on the GPU, (c) all on the CPU, under --gpu-memory;\n"
        "                           (a) and (b) must give (c)'s greedy tokens; then the\n"
        "                           placement's modelled time per layer beside what (a) measured\n"
        "                           (--hardware-profile FILE.toml: the machine it was solved for;\n"
        "                           --stand-in: on the CPU stand-in device, to check the tool)\n"
        "       thermocline bench --hardware [--gpu-profile FILE.toml] [-o FILE.toml] "
        "[--threads N]\n  measures this machine's CPU read bandwidth and writes the "
        "hardware profile `solve --hardware` reads\n"
        "       thermocline bench -m MODEL --json-schema FILE [--prompt TEXT] [--gen-tokens N]\n"
        "  greedy decode tokens/s with and without the JSON schema's grammar constraint\n"
        "       thermocline bench --ops [--embd 2048] [--ff 5632] [--types f32,...] [--threads N]\n"
        "                               [--fractions 0.01,...,1] [--pattern random|mixed|both]\n"
        "                               [--gate-up interleaved|separate] [--repetitions 21]\n"
        "                               [--weights-mib 256] [--seed 1] [--json]\n"
        "  the sparse FFN operators against dense at 1-100% active (bench --ops --help: all of\n"
        "  its flags)");
    return 0;
  }
  if (args->Has("--hardware")) return BenchHardware(*args);
  if (args->Has("--gpu-compare") || args->Get("--gpu-layers")) return RunBenchGpuCompare(*args);
  BenchOptions o;
  auto pt = args->GetInt("--prompt-tokens", 64);
  auto gt = args->GetInt("--gen-tokens", 64);
  auto reps = args->GetInt("--repetitions", 5);
  for (auto* v : {&pt, &gt, &reps}) {
    if (!v->ok()) return Fail("bench", v->status(), true);
  }
  o.prompt_tokens = *pt;
  o.gen_tokens = *gt;
  o.repetitions = static_cast<int>(*reps);
  auto threads = ThreadsFromArgs(*args);
  if (!threads.ok()) return Fail("bench", threads.status(), true);
  if (absl::Status s = CheckModelArgs(*args); !s.ok()) return Fail("bench", s, true);
  auto model = LoadModelFromArgs(*args);
  if (!model.ok()) return Fail("bench", model.status());
  if ((*model)->hparams().is_moe()) {
    return RunBenchMoe(*args, **model, o.prompt_tokens, o.gen_tokens, o.repetitions);
  }
  ThreadPool pool(*threads);
  EngineOptions engine_options;
  engine_options.n_ctx = o.prompt_tokens + o.gen_tokens + 1;
  engine_options.max_batch = std::clamp<int64_t>(o.prompt_tokens, 1, 4096);
  engine_options.repack = !args->Has("--no-repack");
  // --sparse-method A,B,...: each method against dense in turn, the same dense engine. Without
  // it (and without --json), a SwiGLU model's sidecar runs every method it has statistics for.
  std::vector<std::string> methods =
      absl::StrSplit(args->Get("--sparse-method").value_or("predicted"), ',');
  const LlamaHparams& hp = (*model)->hparams();
  if (!args->Get("--sparse-method") && !GateDecides(hp.activation) && !args->Has("--oracle") &&
      !args->Has("--json")) {  // --json: one object, the default method's
    for (const char* m : {"gate-first", "input-sparse"}) {
      auto plan = SparsePlanFromArgs(args->With("--sparse-method", m), **model, false);
      if (plan.ok() && plan->has_value()) methods.push_back(m);
    }
  }
  if (methods.size() > 1) {
    auto dense = Engine::Create(**model, std::nullopt, engine_options, pool);
    if (!dense.ok()) return Fail("bench", dense.status());
    for (const std::string& m : methods) {
      auto engine = EngineFromArgs(args->With("--sparse-method", m), **model, pool, engine_options,
                                   /*check_speed=*/false);
      if (!engine.ok())
        return Fail("bench", engine.status(), absl::IsInvalidArgument(engine.status()));
      if ((*engine)->sparse_plan() == nullptr) {
        return Fail(
            "bench",
            absl::InvalidArgumentError("--sparse-method with several methods needs a sparse plan "
                                       "(--sidecar, or MODEL.thermo.gguf beside the model)"),
            true);
      }
      if (!args->Has("--json")) {
        std::printf("--sparse-method %s\n", m.c_str());
        PrintThresholds(*(*engine)->sparse_plan());
      }
      if (int rc = BenchSparse(**dense, **engine, pool, o, args->Has("--json")); rc != 0) return rc;
    }
    return 0;
  }
  // Sparse against dense wherever a plan is found, even one its speed check measured slower.
  auto engine = EngineFromArgs(*args, **model, pool, engine_options, /*check_speed=*/false);
  if (!engine.ok()) return Fail("bench", engine.status(), absl::IsInvalidArgument(engine.status()));
  if (args->Get("--json-schema")) {
    return RunBenchGrammar(*args, **engine, pool, o.gen_tokens, o.repetitions);
  }
  if ((*engine)->sparse_plan() != nullptr) {
    // The reference: the same model dense, all on the CPU.
    auto dense = Engine::Create(**model, std::nullopt, engine_options, pool);
    if (!dense.ok()) return Fail("bench", dense.status());
    if (!args->Has("--json")) PrintThresholds(*(*engine)->sparse_plan());
    return BenchSparse(**dense, **engine, pool, o, args->Has("--json"));
  }
  auto r = BenchModel(**engine, pool, o);
  if (!r.ok()) return Fail("bench", r.status());
  const double mem_gbps = MeasureReadBandwidth(pool);
  const double ratio = mem_gbps > 0 ? r->decode_weight_gbps / mem_gbps : 0;
  if (args->Has("--json")) {
    nlohmann::json out = {{"model", *args->Get("--model")},
                          {"threads", *threads},
                          {"isa", IsaName(BestIsa())},
                          {"prompt_tokens", o.prompt_tokens},
                          {"gen_tokens", o.gen_tokens},
                          {"prompt_tokens_per_s", r->prompt_tokens_per_s},
                          {"decode_tokens_per_s", r->decode_tokens_per_s},
                          {"prompt_runs", r->prompt_runs},
                          {"decode_runs", r->decode_runs},
                          {"weight_bytes", r->weight_bytes},
                          {"decode_weight_read_gbps", r->decode_weight_gbps},
                          {"memory_read_gbps", mem_gbps},
                          {"bandwidth_ratio", ratio}};
    std::cout << out.dump(2) << "\n";
  } else {
    std::printf(
        "threads %d, %s | prompt %lld tokens: %.1f tokens/s | decode %lld tokens: "
        "%.1f tokens/s\nweights %.1f MiB per token: %.2f GB/s read by decode, "
        "memory reads %.2f GB/s (%.0f%%)\n",
        *threads, IsaName(BestIsa()), static_cast<long long>(o.prompt_tokens),
        r->prompt_tokens_per_s, static_cast<long long>(o.gen_tokens), r->decode_tokens_per_s,
        r->weight_bytes / 1048576.0, r->decode_weight_gbps, mem_gbps, 100 * ratio);
  }
  return 0;
}

}  // namespace thermocline::cli
