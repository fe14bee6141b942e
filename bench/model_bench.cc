#include "bench/model_bench.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "engine/model/session.h"

namespace thermocline {
namespace {

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n == 0 ? 0 : (n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]));
}

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

absl::StatusOr<BenchResult> BenchModel(const Engine& engine, ThreadPool& pool,
                                       const BenchOptions& options) {
  const LlamaModel& model = engine.model();
  const LlamaHparams& h = model.hparams();
  if (options.prompt_tokens < 1 || options.gen_tokens < 1 || options.repetitions < 1) {
    return absl::InvalidArgumentError(
        "bench: prompt and generated tokens and repetitions must be positive");
  }
  if (options.prompt_tokens + options.gen_tokens + 1 > engine.n_ctx()) {
    return absl::InvalidArgumentError(
        absl::StrCat("bench: ", options.prompt_tokens + options.gen_tokens + 1,
                     " tokens exceed the context ", engine.n_ctx()));
  }
  auto session = engine.NewSession(&pool);
  if (!session.ok()) return session.status();
  Session& s = (*session)->session();

  // A fixed pseudo-random prompt of ordinary token ids.
  std::vector<int32_t> prompt(options.prompt_tokens);
  uint32_t x = 12345;
  for (int32_t& t : prompt) {
    x = x * 1664525u + 1013904223u;
    t = static_cast<int32_t>(3 +
                             (x >> 8) % static_cast<uint32_t>(std::max<int64_t>(1, h.n_vocab - 3)));
  }
  BenchResult r;
  r.weight_bytes = model.weight_bytes();
  for (int rep = 0; rep <= options.repetitions; ++rep) {  // rep 0 warms up
    s.Reset();
    double t0 = Now();
    if (absl::Status st = s.Eval(prompt); !st.ok()) return st;
    const double prompt_s = Now() - t0;
    t0 = Now();
    for (int64_t i = 0; i < options.gen_tokens; ++i) {
      const float* logits = s.logits();
      const int32_t next =
          static_cast<int32_t>(std::max_element(logits, logits + h.n_vocab) - logits);
      if (absl::Status st = s.Eval({&next, 1}); !st.ok()) return st;
    }
    const double decode_s = Now() - t0;
    if (rep == 0) continue;
    r.prompt_runs.push_back(options.prompt_tokens / prompt_s);
    r.decode_runs.push_back(options.gen_tokens / decode_s);
  }
  r.prompt_tokens_per_s = Median(r.prompt_runs);
  r.decode_tokens_per_s = Median(r.decode_runs);
  r.decode_weight_gbps = r.weight_bytes * r.decode_tokens_per_s / 1e9;
  return r;
}

}  // namespace thermocline
