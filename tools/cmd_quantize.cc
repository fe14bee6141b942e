// thermocline quantize IN OUT --type MIX: llama-quantize's file types (quant_mix.h).
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "engine/model/quantize.h"
#include "tools/commands.h"

namespace thermocline::cli {

int RunQuantize(int argc, char** argv) {
  auto args = Args::Parse(argc, argv, {"--type", "--threads"}, {"--help"},
                          {{"-t", "--threads"}, {"-h", "--help"}});
  if (!args.ok()) return Fail("quantize", args.status(), true);
  if (args->Has("--help") || args->positionals().size() != 2) {
    std::fprintf(args->Has("--help") ? stdout : stderr,
                 "usage: thermocline quantize IN.gguf OUT.gguf --type TYPE\n"
                 "  TYPE: %s\n  (llama-quantize's per-tensor mixes; docs/types.md)\n",
                 QuantMixNames().c_str());
    return args->Has("--help") ? 0 : 2;
  }
  const std::string type_name = args->GetOr("--type", "q8_0");
  const QuantMix* mix = FindQuantMix(type_name);
  if (mix == nullptr) {
    return Fail("quantize",
                absl::InvalidArgumentError(
                    absl::StrCat("--type ", type_name, ": expected one of ", QuantMixNames())),
                true);
  }
  auto threads = ThreadsFromArgs(*args);
  if (!threads.ok()) return Fail("quantize", threads.status(), true);
  ThreadPool pool(*threads);
  const std::string& in = args->positionals()[0];
  const std::string& out = args->positionals()[1];
  auto stats = QuantizeModel(in, out, *mix, pool);
  if (!stats.ok()) return Fail("quantize", stats.status());
  std::printf(
      "%s -> %s (%s): %lld tensors converted, %lld kept, %lld in a fallback type; "
      "%.2f MiB -> %.2f MiB\n",
      in.c_str(), out.c_str(), mix->name, static_cast<long long>(stats->tensors_converted),
      static_cast<long long>(stats->tensors_kept), static_cast<long long>(stats->tensors_fallback),
      stats->bytes_in / 1048576.0, stats->bytes_out / 1048576.0);
  return 0;
}

}  // namespace thermocline::cli
