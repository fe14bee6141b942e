// thermocline quantize IN OUT --type f16|q8_0|q4_0
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
    std::fputs("usage: thermocline quantize IN.gguf OUT.gguf --type f32|f16|bf16|q8_0|q4_0\n",
               args->Has("--help") ? stdout : stderr);
    return args->Has("--help") ? 0 : 2;
  }
  const std::string type_name = args->GetOr("--type", "q8_0");
  const GgmlTypeInfo* type = FindGgmlTypeByName(type_name);
  if (type == nullptr || !type->computable) {
    return Fail("quantize",
                absl::InvalidArgumentError(
                    absl::StrCat("--type ", type_name, ": expected f32, f16, bf16, q8_0 or q4_0")),
                true);
  }
  auto threads = ThreadsFromArgs(*args);
  if (!threads.ok()) return Fail("quantize", threads.status(), true);
  ThreadPool pool(*threads);
  const std::string& in = args->positionals()[0];
  const std::string& out = args->positionals()[1];
  auto stats = QuantizeModel(in, out, type->type, pool);
  if (!stats.ok()) return Fail("quantize", stats.status());
  std::printf(
      "%s -> %s (%s): %lld tensors converted, %lld kept, %lld as f16 fallback; "
      "%.2f MiB -> %.2f MiB\n",
      in.c_str(), out.c_str(), std::string(type->name).c_str(),
      static_cast<long long>(stats->tensors_converted), static_cast<long long>(stats->tensors_kept),
      static_cast<long long>(stats->tensors_fallback), stats->bytes_in / 1048576.0,
      stats->bytes_out / 1048576.0);
  return 0;
}

}  // namespace thermocline::cli
