// thermocline generate: one-shot generation without a daemon, streaming text to stdout.
#include <cstdio>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "engine/runtime/generate.h"
#include "nlohmann/json.hpp"
#include "tools/commands.h"

namespace thermocline::cli {
namespace {

constexpr char kUsage[] = R"(usage: thermocline generate -m MODEL -p PROMPT [options]
  -m, --model FILE         GGUF model
  -p, --prompt TEXT        prompt
  -n, --n-predict N        tokens to generate (default 128)
  --temp T                 temperature, 0 = greedy (default 0.8)
  --top-k K                (default 40, 0 = off)
  --top-p P                (default 0.95)
  --min-p P                (default 0.05)
  --repeat-penalty R       (default 1.0 = off)
  --frequency-penalty F    (default 0)
  --presence-penalty F     (default 0)
  --seed S                 random seed (default: random)
  -t, --threads N          CPU threads (default: all)
  -c, --ctx N              context length (default: the model's)
  --kv-type f16|f32        KV cache element type (default f16, as llama.cpp's)
  --no-repack              read the weights as the file stores them (default: Q4_0 and the
                           K-quants re-laid in row groups, faster; a K-quant file gives
                           llama.cpp's numbers bit for bit either way, docs/types.md)
  --activation A           override the FFN activation: silu | relu | drelu
  --ignore-eos             keep generating past end-of-sequence tokens
  --json                   print one JSON object instead of streaming text
  --logprobs               with --json: each generated token's log-probability (of the raw
                           logits, as the API's logprobs)
)";

absl::StatusOr<SamplingParams> SamplingFromArgs(const Args& args) {
  SamplingParams p;
  auto set_float = [&](const char* flag, float* dst) -> absl::Status {
    auto v = args.GetDouble(flag, *dst);
    if (!v.ok()) return v.status();
    *dst = static_cast<float>(*v);
    return absl::OkStatus();
  };
  for (auto [flag, dst] : {std::pair{"--temp", &p.temperature},
                           {"--top-p", &p.top_p},
                           {"--min-p", &p.min_p},
                           {"--repeat-penalty", &p.repeat_penalty},
                           {"--frequency-penalty", &p.frequency_penalty},
                           {"--presence-penalty", &p.presence_penalty}}) {
    if (absl::Status s = set_float(flag, dst); !s.ok()) return s;
  }
  auto top_k = args.GetInt("--top-k", p.top_k);
  if (!top_k.ok()) return top_k.status();
  p.top_k = static_cast<int32_t>(*top_k);
  auto seed = args.GetInt("--seed", static_cast<int64_t>(SamplingParams::kRandomSeed));
  if (!seed.ok()) return seed.status();
  p.seed = static_cast<uint64_t>(*seed);
  if (absl::Status s = p.Validate(); !s.ok()) return s;
  return p;
}

}  // namespace

int RunGenerate(int argc, char** argv) {
  auto args =
      Args::Parse(argc, argv,
                  {"--model",
                   "--prompt",
                   "--n-predict",
                   "--temp",
                   "--top-k",
                   "--top-p",
                   "--min-p",
                   "--repeat-penalty",
                   "--frequency-penalty",
                   "--presence-penalty",
                   "--seed",
                   "--threads",
                   "--ctx",
                   "--activation",
                   "--sparse",
                   "--sidecar",
                   "--target-sparsity",
                   "--sparse-method",
                   "--gpu-memory",
                   "--gpu-layers",
                   "--kv-type"},
                  {"--json", "--ignore-eos", "--help", "--oracle", "--logprobs", "--no-repack"},
                  {{"-m", "--model"},
                   {"-p", "--prompt"},
                   {"-n", "--n-predict"},
                   {"-t", "--threads"},
                   {"-c", "--ctx"},
                   {"-h", "--help"}});
  if (!args.ok()) return Fail("generate", args.status(), true);
  if (args->Has("--help")) {
    std::fputs(kUsage, stdout);
    std::fputs(kSparseUsage, stdout);
    std::fputs(kGpuLayersUsage, stdout);
    return 0;
  }
  auto prompt = args->Get("--prompt");
  if (!prompt) return Fail("generate", absl::InvalidArgumentError("--prompt is required"), true);
  auto n_predict = args->GetInt("--n-predict", 128);
  if (!n_predict.ok()) return Fail("generate", n_predict.status(), true);
  if (*n_predict < 0 || *n_predict > (1 << 24)) {
    return Fail("generate", absl::InvalidArgumentError("--n-predict must be in [0, 16777216]"),
                true);
  }
  auto sampling = SamplingFromArgs(*args);
  if (!sampling.ok()) return Fail("generate", sampling.status(), true);
  auto threads = ThreadsFromArgs(*args);
  if (!threads.ok()) return Fail("generate", threads.status(), true);
  auto ctx = args->GetInt("--ctx", 0);
  if (!ctx.ok()) return Fail("generate", ctx.status(), true);

  if (absl::Status s = CheckModelArgs(*args); !s.ok()) return Fail("generate", s, true);
  auto model = LoadModelFromArgs(*args);
  if (!model.ok()) return Fail("generate", model.status());
  ThreadPool pool(*threads);
  EngineOptions engine_options;
  engine_options.n_ctx = *ctx;
  engine_options.repack = !args->Has("--no-repack");
  auto engine = EngineFromArgs(*args, **model, pool, engine_options);
  if (!engine.ok()) {
    return Fail("generate", engine.status(), absl::IsInvalidArgument(engine.status()));
  }
  auto engine_session = SessionFor(**engine, &pool);
  if (!engine_session.ok()) return Fail("generate", engine_session.status());
  Session* session = &(*engine_session)->session();

  const Tokenizer& tok = (*model)->tokenizer();
  const std::vector<int32_t> prompt_ids = tok.Encode(*prompt, tok.add_bos());
  if (static_cast<int64_t>(prompt_ids.size()) >= session->n_ctx()) {
    return Fail("generate", absl::InvalidArgumentError(absl::StrCat(
                                "the prompt has ", prompt_ids.size(),
                                " tokens, more than the context length ", session->n_ctx())));
  }
  GenerateOptions options;
  options.max_tokens = static_cast<int32_t>(
      std::min<int64_t>(*n_predict, session->n_ctx() - static_cast<int64_t>(prompt_ids.size())));
  options.sampling = *sampling;
  options.stop_at_end_of_generation = !args->Has("--ignore-eos");
  options.raw_logits = args->Has("--logprobs");
  const bool json = args->Has("--json");
  std::vector<float> logprobs;
  logprobs.reserve(options.max_tokens);
  const int64_t n_vocab = (*model)->hparams().n_vocab;
  if (!json) {
    std::fwrite(prompt->data(), 1, prompt->size(), stdout);
    std::fflush(stdout);
  }
  auto result = Generate(*session, prompt_ids, options, [&](const GeneratedToken& t) {
    if (t.logits != nullptr) {
      logprobs.push_back(Sampler::Logprob(absl::Span<const float>(t.logits, n_vocab), t.id));
    }
    if (!json && !t.text.empty()) {
      std::fwrite(t.text.data(), 1, t.text.size(), stdout);
      std::fflush(stdout);
    }
    return TokenAction::kContinue;
  });
  if (!result.ok()) return Fail("generate", result.status());
  if (!json && !result->final_text.empty()) {
    std::fwrite(result->final_text.data(), 1, result->final_text.size(), stdout);
  }
  if (json) {
    nlohmann::json out = {
        {"prompt", *prompt},
        {"prompt_tokens", prompt_ids},
        {"tokens", result->tokens},
        {"text", result->text},
        {"stop_reason", StopReasonName(result->stop_reason)},
        {"prompt_tokens_per_s", result->prompt_tokens_per_s()},
        {"decode_tokens_per_s", result->decode_tokens_per_s()},
        {"prompt_seconds", result->prompt_seconds},
        {"decode_seconds", result->decode_seconds},
        {"threads", *threads},
    };
    if (options.raw_logits) out["logprobs"] = logprobs;
    std::cout << out.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  } else {
    std::fprintf(stdout, "\n");
    std::fprintf(stderr,
                 "\nprompt: %lld tokens, %.1f tokens/s | decode: %zu tokens, %.1f tokens/s\n",
                 static_cast<long long>(result->prompt_tokens), result->prompt_tokens_per_s(),
                 result->tokens.size(), result->decode_tokens_per_s());
  }
  return 0;
}

}  // namespace thermocline::cli
