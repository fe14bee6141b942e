// Pieces shared by the subcommands: error reporting and model loading from flags.
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "engine/util/thread_pool.h"
#include "tools/commands.h"

namespace thermocline::cli {

int Fail(const std::string& command, const absl::Status& status, bool usage) {
  std::fprintf(stderr, "thermocline %s: %s\n", command.c_str(),
               std::string(status.message()).c_str());
  return usage ? 2 : 1;
}

absl::Status CheckModelArgs(const Args& args) {
  if (!args.Get("--model")) return absl::InvalidArgumentError("--model FILE is required");
  if (auto act = args.Get("--activation")) return ParseActivation(*act).status();
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<LlamaModel>> LoadModelFromArgs(const Args& args) {
  auto path = args.Get("--model");
  if (!path) return absl::InvalidArgumentError("--model FILE is required");
  ModelOptions options;
  if (auto act = args.Get("--activation")) {
    auto parsed = ParseActivation(*act);
    if (!parsed.ok()) return parsed.status();
    options.activation = *parsed;
  }
  return LlamaModel::Load(*path, options);
}

absl::StatusOr<int> ThreadsFromArgs(const Args& args) {
  auto n = args.GetInt("--threads", ThreadPool::DefaultThreads());
  if (!n.ok()) return n.status();
  if (*n < 1 || *n > 1024) {
    return absl::InvalidArgumentError(absl::StrCat("--threads ", *n, " must be in [1, 1024]"));
  }
  return static_cast<int>(*n);
}

}  // namespace thermocline::cli
