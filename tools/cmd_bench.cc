// thermocline bench: prefill and decode tokens/s (median of several runs), the weight-read
// bandwidth decode achieves, and the memory read bandwidth measured on the same run.
#include <cstdio>
#include <iostream>

#include "engine/ops/kernels.h"
#include "engine/runtime/bench.h"
#include "nlohmann/json.hpp"
#include "tools/commands.h"

namespace thermocline::cli {

int RunBench(int argc, char** argv) {
  auto args = Args::Parse(argc, argv,
                          {"--model", "--prompt-tokens", "--gen-tokens", "--threads",
                           "--repetitions", "--activation"},
                          {"--json", "--help"},
                          {{"-m", "--model"}, {"-t", "--threads"}, {"-h", "--help"}});
  if (!args.ok()) return Fail("bench", args.status(), true);
  if (args->Has("--help")) {
    std::puts("usage: thermocline bench -m MODEL [--prompt-tokens 64] [--gen-tokens 64] "
              "[--threads N] [--repetitions 5] [--json]");
    return 0;
  }
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
  ThreadPool pool(*threads);
  auto r = BenchModel(**model, pool, o);
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
    std::printf("threads %d, %s | prompt %lld tokens: %.1f tokens/s | decode %lld tokens: "
                "%.1f tokens/s\nweights %.1f MiB per token: %.2f GB/s read by decode, "
                "memory reads %.2f GB/s (%.0f%%)\n",
                *threads, IsaName(BestIsa()), static_cast<long long>(o.prompt_tokens),
                r->prompt_tokens_per_s, static_cast<long long>(o.gen_tokens),
                r->decode_tokens_per_s, r->weight_bytes / 1048576.0, r->decode_weight_gbps,
                mem_gbps, 100 * ratio);
  }
  return 0;
}

}  // namespace thermocline::cli
