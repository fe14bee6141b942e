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
  // IN OUT [TYPE]: the type also as llama-quantize takes it, a third argument.
  const size_t n_pos = args->positionals().size();
  if (args->Has("--help") || n_pos < 2 || n_pos > 3 || (n_pos == 3 && args->Has("--type"))) {
    std::fprintf(args->Has("--help") ? stdout : stderr,
                 "usage: thermocline quantize IN.gguf OUT.gguf --type TYPE  (or IN OUT TYPE)\n"
                 "  TYPE: %s (any case; default q8_0)\n"
                 "  (llama-quantize's per-tensor mixes; docs/types.md)\n",
                 QuantMixNames().c_str());
    return args->Has("--help") ? 0 : 2;
  }
  const std::string type_name = n_pos == 3 ? args->positionals()[2] : args->GetOr("--type", "q8_0");
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
