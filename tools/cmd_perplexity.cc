// thermocline perplexity: llama.cpp-compatible perplexity of a model on a text file.
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "engine/runtime/perplexity.h"
#include "nlohmann/json.hpp"
#include "tools/commands.h"

namespace thermocline::cli {

int RunPerplexity(int argc, char** argv) {
  auto args = Args::Parse(
      argc, argv,
      {"--model", "--file", "--ctx", "--threads", "--activation", "--sparse", "--sidecar",
       "--target-sparsity", "--sparse-method", "--gpu-memory", "--gpu-layers", "--kv-type"},
      {"--json", "--help", "--oracle", "--no-repack"},
      {{"-m", "--model"},
       {"-f", "--file"},
       {"-c", "--ctx"},
       {"-t", "--threads"},
       {"-h", "--help"}});
  if (!args.ok()) return Fail("perplexity", args.status(), true);
  if (args->Has("--help")) {
    std::puts(
        "usage: thermocline perplexity -m MODEL -f TEXT [--ctx 512] [--threads N] "
        "[--activation A] [--kv-type f16|f32] [--no-repack] [--json]\n"
        "  --no-repack  read the weights as the file stores them (generate --help)");
    std::fputs(kSparseUsage, stdout);
    std::fputs(kGpuLayersUsage, stdout);
    return 0;
  }
  auto file = args->Get("--file");
  if (!file) return Fail("perplexity", absl::InvalidArgumentError("--file is required"), true);
  auto ctx = args->GetInt("--ctx", 512);
  if (!ctx.ok()) return Fail("perplexity", ctx.status(), true);
  auto threads = ThreadsFromArgs(*args);
  if (!threads.ok()) return Fail("perplexity", threads.status(), true);
  std::ifstream in(*file, std::ios::binary);
  if (!in) return Fail("perplexity", absl::NotFoundError(absl::StrCat("cannot read ", *file)));
  std::stringstream text;
  text << in.rdbuf();

  if (absl::Status s = CheckModelArgs(*args); !s.ok()) return Fail("perplexity", s, true);
  auto model = LoadModelFromArgs(*args);
  if (!model.ok()) return Fail("perplexity", model.status());
  if (*ctx < 4 || *ctx > (*model)->hparams().n_ctx_train) {
    return Fail("perplexity",
                absl::InvalidArgumentError(
                    absl::StrCat("--ctx must be in [4, ", (*model)->hparams().n_ctx_train, "]")),
                true);
  }
  ThreadPool pool(*threads);
  EngineOptions engine_options;
  engine_options.n_ctx = *ctx;
  engine_options.max_batch = std::min<int64_t>(*ctx, 4096);
  // Every token through the sparse FFN (no dense prefill): the perplexity measures sparsity.
  engine_options.dense_prefill = false;
  engine_options.repack = !args->Has("--no-repack");
  auto engine = EngineFromArgs(*args, **model, pool, engine_options);
  if (!engine.ok()) {
    return Fail("perplexity", engine.status(), absl::IsInvalidArgument(engine.status()));
  }
  auto session = SessionFor(**engine, &pool);
  if (!session.ok()) return Fail("perplexity", session.status());
  const SparseFfn* sparse = (*session)->sparse();
  const int64_t n_ff = (*model)->hparams().n_ff;
  auto active = [&](double SparseFfnStats::*field) {
    const SparseFfnStats& s = sparse->stats();
    return s.layer_tokens > 0 ? s.*field / s.layer_tokens / n_ff : 1.0;
  };
  // Input-sparse layers: the shares of the inputs kept (of n_embd) and of the neurons fired.
  auto input_share = [&](double SparseFfnStats::*field, int64_t SparseFfnStats::*tokens,
                         int64_t width) {
    const SparseFfnStats& s = sparse->stats();
    return s.*tokens > 0 ? s.*field / s.*tokens / width : 1.0;
  };
  const int64_t n_embd = (*model)->hparams().n_embd;
  const bool json = args->Has("--json");
  auto result =
      ComputePerplexity((*session)->session(), text.str(), *ctx, [&](int64_t c, double ppl) {
        if (!json) {
          std::printf("[%lld]%.4f,", static_cast<long long>(c + 1), ppl);
          std::fflush(stdout);
        }
      });
  if (!result.ok()) return Fail("perplexity", result.status());
  if (json) {
    nlohmann::json out = {{"ppl", result->ppl},         {"chunks", result->chunk_ppl},
                          {"ctx", result->n_ctx},       {"tokens_scored", result->tokens_scored},
                          {"seconds", result->seconds}, {"sparse", sparse != nullptr}};
    if (sparse != nullptr && sparse->stats().ffn_in_tokens > 0) {
      out["attn_inputs_kept"] =
          input_share(&SparseFfnStats::attn_in_kept, &SparseFfnStats::attn_in_tokens, n_embd);
      out["ffn_inputs_kept"] =
          input_share(&SparseFfnStats::ffn_in_kept, &SparseFfnStats::ffn_in_tokens, n_embd);
      out["input_sparse_fired"] =
          input_share(&SparseFfnStats::ffn_in_fired, &SparseFfnStats::ffn_in_tokens, n_ff);
    }
    if (sparse != nullptr && sparse->stats().layer_tokens > 0) {
      out["predicted_active"] = active(&SparseFfnStats::predicted);
      out["fired"] = active(&SparseFfnStats::fired);
    }
    if (sparse != nullptr) {
      out["thresholds"] = (*engine)->sparse_plan()->thresholds;
    }
    std::cout << out.dump(2) << "\n";
  } else {
    std::printf("\nppl = %.4f (%lld tokens scored, ctx %lld, %.2f s)\n", result->ppl,
                static_cast<long long>(result->tokens_scored),
                static_cast<long long>(result->n_ctx), result->seconds);
    if (sparse != nullptr && sparse->stats().layer_tokens > 0) {
      std::printf("sparse FFN: %.1f%% of neurons predicted active, %.1f%% fired\n",
                  100 * active(&SparseFfnStats::predicted), 100 * active(&SparseFfnStats::fired));
    }
    if (sparse != nullptr && sparse->stats().ffn_in_tokens > 0) {
      std::printf(
          "input-sparse: %.1f%% of q/k/v's inputs kept, %.1f%% of gate/up's, %.1f%% of neurons "
          "fired\n",
          100 * input_share(&SparseFfnStats::attn_in_kept, &SparseFfnStats::attn_in_tokens, n_embd),
          100 * input_share(&SparseFfnStats::ffn_in_kept, &SparseFfnStats::ffn_in_tokens, n_embd),
          100 * input_share(&SparseFfnStats::ffn_in_fired, &SparseFfnStats::ffn_in_tokens, n_ff));
    }
    if (sparse != nullptr) {
      if (const SparsePlan* plan = (*engine)->sparse_plan(); !plan->thresholds.empty()) {
        std::printf("thresholds: %s\n", plan->thresholds.c_str());
      }
    }
  }
  return 0;
}

}  // namespace thermocline::cli
