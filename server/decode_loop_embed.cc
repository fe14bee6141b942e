// The decode loop's embedding jobs (ApiKind::kEmbedding): each input evaluated on the slot's
// session of the model through the engine's Embed (engine/runtime/embed.h), its vector handed
// to the sink. Cancellation and the deadline are checked between prefill chunks and inputs.
#include "absl/strings/str_cat.h"
#include "engine/runtime/embed.h"
#include "server/decode_loop.h"
#include "server/model_registry.h"

namespace thermocline::server {

StopReason DecodeLoop::Embed(Job& job, GenerationStats* stats, absl::Status* error) {
  const GenerationRequest& r = job.request;
  auto prepared = Prepare(job.model.shared());
  if (!prepared.ok()) {
    *error = prepared.status();
    return StopReason::kError;
  }
  PerModel& m = **prepared;  // this slot's alone while the job runs
  {
    // Embed starts from an empty KV cache and leaves the inputs in it: no prompt prefix to reuse.
    std::lock_guard<std::mutex> lock(models_mu_);
    m.tokens.clear();
  }
  Session& session = m.session->session();
  const auto keep_going = [&job] {
    if (job.cancelled()) return false;
    if (Clock::now() < job.deadline) return true;
    job.Cancel(CancelReason::kDeadline);
    return false;
  };
  const Clock::time_point start = Clock::now();
  for (size_t i = 0; i < r.inputs.size(); ++i) {
    absl::StatusOr<std::vector<float>> v =
        thermocline::Embed(session, r.inputs[i], r.embed, keep_going);
    if (!v.ok()) {
      if (v.status().code() == absl::StatusCode::kCancelled) return StopReason::kCancelled;
      *error =
          absl::Status(v.status().code(), absl::StrCat("input ", i, ": ", v.status().message()));
      return StopReason::kError;
    }
    const int64_t n = static_cast<int64_t>(r.inputs[i].size());
    stats->prompt_tokens += n;
    metrics_->AddPromptTokens(n, /*cached=*/0, /*computed=*/n);
    job.sink->OnEmbedding(i, *std::move(v));
  }
  stats->prompt_seconds = std::chrono::duration<double>(Clock::now() - start).count();
  return StopReason::kEndOfGeneration;
}

}  // namespace thermocline::server
