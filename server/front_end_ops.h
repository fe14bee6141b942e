// The front-end-neutral steps of a call, shared by the HTTP and the gRPC front ends so that a
// request means the same on both: resolve a model by name (the first served model when none is
// named, for the tokenizer calls), tokenize and detokenize, and turn a validated GenerationSpec
// into a Job ready for the scheduler.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "server/config.h"
#include "server/job.h"
#include "server/model_registry.h"
#include "server/request_builder.h"
#include "server/scheduler.h"

namespace thermocline::server {

// `name`, or the first served model when `name` is empty; loads a model that is not in memory (on
// the calling thread). The lease keeps it in memory while the caller uses it. NotFound,
// Unavailable as ModelRegistry::FindOrLoad.
absl::StatusOr<ModelLease> ResolveModel(ModelRegistry& registry, std::string_view name);

// InvalidRequest when a text to tokenize is longer than server.max_tokenize_bytes: tokenizing
// costs tens of bytes of memory per byte of text, so a call's work is bounded.
absl::Status CheckTokenizeSize(size_t bytes, const ServerConfig& config);

// Token ids of `text`; with `add_special`, BOS first when the model wants one.
std::vector<int32_t> TokenizeText(const LoadedModel& model, std::string_view text,
                                  bool add_special);
// The text of `ids`; InvalidRequest("tokens") for an id outside the vocabulary.
absl::StatusOr<std::string> DetokenizeIds(const LoadedModel& model, absl::Span<const int64_t> ids);

// What a front end knows when a generation call arrives.
struct SubmitContext {
  ModelRegistry* registry = nullptr;
  const ServerConfig* config = nullptr;
  Scheduler* scheduler = nullptr;  // null while the models load
  bool draining = false;           // the server is shutting down
  // The caller's own deadline (a gRPC call's); the job's is the earlier of it and the server's
  // scheduler.request_timeout_s.
  Clock::time_point call_deadline = Clock::time_point::max();
};

// Resolves the model, refuses while the server starts or stops (Unavailable "model_loading",
// "shutting_down"), validates and translates `spec` (BuildRequest) and returns the job with its
// model, request, arrival and deadline. The caller sets job->sink and submits it.
absl::StatusOr<std::shared_ptr<Job>> PrepareJob(const GenerationSpec& spec,
                                                const SubmitContext& context);

}  // namespace thermocline::server
