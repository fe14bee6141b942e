// Does sparse decode pay on this machine? A SwiGLU FFN skips fewer bytes than a ReLU one, and on
// a CPU whose dense mat-vec streams faster than scattered rows can be read, a sparse plan can
// decode slower than dense (docs/sparse.md, "SwiGLU models"). The profiler measures it once:
// decode tokens/s of dense and of each method the sidecar supports, at the level a load
// without --target-sparsity uses; one engine at a time (dense, each method, dense again). The
// result goes into the sidecar (SidecarSpeed); loading on the same CPU, `--sparse auto` serves
// dense when dense was faster, and `--sparse-method auto` picks the fastest method
// (offline/sparse_source.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model/llama_model.h"
#include "engine/util/thread_pool.h"
#include "offline/sidecar/sidecar.h"
#include "offline/sparse_source.h"
#include "offline/util/progress.h"

namespace thermocline::offline {

// This machine as a speed check names it: the CPU's model name and the kernels' ISA, e.g.
// "AMD EPYC 9B45 (avx512_vnni)". A measurement applies where this string is the same.
std::string HostCpu();

struct SpeedCheckOptions {
  int64_t prompt_tokens = 16;  // prefill before the timed tokens
  int64_t gen_tokens = 32;     // timed single-token decodes per run
  int rounds = 3;              // runs per engine (dense: twice as many); the median is kept
};

struct MethodSpeed {
  MethodChoice method = MethodChoice::kPredicted;
  double sparsity = 0;  // the level measured (the sidecar's calibrated or profiled one)
  double tokens_per_s = 0;
};

struct SpeedCheck {
  std::string cpu;  // HostCpu()
  int threads = 0;
  double dense_tokens_per_s = 0;
  // predicted; gate-first and input-sparse where the profile allows them (SidecarMethods)
  std::vector<MethodSpeed> methods;
};

// Decode of `prompt` (its first prompt_tokens tokens, then greedy tokens) with the dense engine
// and with each method's plan from `sidecar`, on the CPU only. A mixture of experts, or a
// sidecar whose plan cannot be built, is an error; so is a prompt of fewer than 2 tokens.
absl::StatusOr<SpeedCheck> CheckSparseSpeed(const LlamaModel& model, const Sidecar& sidecar,
                                            const std::vector<int32_t>& prompt, ThreadPool& pool,
                                            const SpeedCheckOptions& options,
                                            ProgressReporter* progress = nullptr);

void ApplySpeedCheck(const SpeedCheck& check, Sidecar& sidecar);

// The check's prompt: the corpus's first story (up to 4 KiB of it) when a corpus is given and
// holds two tokens, else a story the model samples with `seed`.
absl::StatusOr<std::vector<int32_t>> SpeedCheckPrompt(const LlamaModel& model, ThreadPool& pool,
                                                      const std::string& corpus_path,
                                                      uint64_t seed);

// The sidecar's speed check when it applies to a load on this machine at these levels: it was
// measured here (HostCpu) and the load uses the levels it measured (no --target-sparsity).
// nullptr otherwise.
const SidecarSpeed* ApplicableSpeed(const Sidecar& sidecar, double target_sparsity);

// "dense 54.8, predicted 41.3 (0.75x), gate-first 46.4 (0.88x), input-sparse 58.0 (1.06x)
// tokens/s on 2 threads of CPU": the methods measured.
std::string DescribeSpeed(const SidecarSpeed& speed);

}  // namespace thermocline::offline
