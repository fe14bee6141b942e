// Ollama's wire format (https://github.com/ollama/ollama/blob/main/docs/api.md) over the same
// native request model as the OpenAI routes: /api/chat and /api/generate bodies become a
// GenerationSpec (and /api/embed, /api/embeddings an EmbeddingSpec), so a request means the
// same on every front end. Also the NDJSON stream sink, the response objects (durations in
// nanoseconds, RFC 3339 timestamps) and the model descriptions of /api/tags, /api/show and
// /api/ps. The HTTP handlers are server/http_ollama.cc.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "nlohmann/json.hpp"
#include "server/embeddings.h"
#include "server/job.h"
#include "server/model_registry.h"
#include "server/request_builder.h"

namespace thermocline::server {

// What /api/version says: the Ollama API version these routes follow.
constexpr char kOllamaApiVersion[] = "0.6.4";

// keep_alive: a Go duration string ("5m", "1h30m", "250ms", "0"), a number of seconds (also as
// a string: "3600"); negative: never unload. InvalidRequest("keep_alive") otherwise.
absl::StatusOr<std::chrono::milliseconds> ParseKeepAlive(const nlohmann::json& value);

// A parsed /api/chat or /api/generate request.
struct OllamaGeneration {
  GenerationSpec spec;  // spec.model: the registry name (":latest" removed)
  std::string model;    // the name as the client sent it, echoed in responses
  bool chat = false;
  bool empty = false;  // no prompt / messages: a load (or, with keep_alive 0, unload) request
  std::optional<std::chrono::milliseconds> keep_alive;
  // options.num_ctx: refused when larger than the model's context (CheckNumCtx).
  std::optional<int64_t> num_ctx;
};

// `chat`: /api/chat (messages), else /api/generate (prompt, system, raw). Fields Ollama defines
// that are not supported here (images, tools, format until constrained output is connected,
// suffix, template, context, think) are a 400 naming them; options are in docs/api.md.
absl::StatusOr<OllamaGeneration> OllamaGenerationRequest(const nlohmann::json& body, bool chat,
                                                         const ModelRegistry& registry);

// A parsed /api/embed (`legacy` false: input, truncate, dimensions) or /api/embeddings
// (`legacy`: prompt, the vector not normalised, as Ollama's) request.
struct OllamaEmbedding {
  EmbeddingSpec spec;
  std::string model;
  bool empty = false;  // no input: a load (or unload) request
  std::optional<std::chrono::milliseconds> keep_alive;
  std::optional<int64_t> num_ctx;
};

// InvalidRequest("options.num_ctx") when `num_ctx` is larger than the model's context (each
// slot's KV cache is sized when the model loads; a smaller one is served within it).
absl::Status CheckNumCtx(const std::optional<int64_t>& num_ctx, const LoadedModel& model);
absl::StatusOr<OllamaEmbedding> OllamaEmbeddingRequest(const nlohmann::json& body, bool legacy,
                                                       const ModelRegistry& registry);

// The registry name an Ollama model name means: the name itself when registered, else without
// a ":latest" tag. NotFound when neither is served.
absl::StatusOr<std::string> OllamaModelName(const ModelRegistry& registry, std::string_view name);
// How Ollama lists a registry name: with ":latest" unless it has a tag.
std::string OllamaTaggedName(const std::string& name);

// "2024-06-04T14:38:31.837530123Z".
std::string OllamaTimestamp(std::chrono::system_clock::time_point t);
// "stop" or "length".
const char* OllamaDoneReason(StopReason reason);

// The timings of a finished job and its request.
struct OllamaTimings {
  Clock::time_point start;  // the request's arrival at the handler
  double load_seconds = 0;  // loading the model for it (0 when it was in memory)
};
// The final object's fields after "done":true: done_reason, the durations and counts.
void AppendOllamaFinal(const OllamaTimings& timings, StopReason reason,
                       const GenerationStats& stats, std::string* out);
// One object of a generation: {"model","created_at","response"|"message":...,"done":false}
// without the closing brace when `open`.
void AppendOllamaChunk(const std::string& model, bool chat, std::string_view text, bool open,
                       std::string* out);
// {"error": message}.
std::string OllamaErrorJson(std::string_view message);

// A generation streamed as NDJSON: one object per delta, then the final one (or an error
// object). The slot thread appends into a buffer the connection's thread drains, as SseSink.
class OllamaStreamSink : public GenerationSink {
 public:
  OllamaStreamSink(std::string model, bool chat, OllamaTimings timings)
      : model_(std::move(model)), chat_(chat), timings_(timings) {}
  bool OnDelta(std::string_view text, absl::Span<const TokenLogprobs> logprobs) override;
  void OnFinish(StopReason reason, CancelReason cancel, const GenerationStats& stats,
                const absl::Status& error) override;
  // Waits for bytes and swaps them into *out; false once the stream has ended and all is taken.
  bool Take(std::string* out);
  // The client is gone: producers never wait on this sink again.
  void Abandon();
  const GenerationStats& stats() const { return stats_; }

 private:
  static constexpr size_t kMaxBuffered = 1 << 20;
  const std::string model_;
  const bool chat_;
  const OllamaTimings timings_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::string buffer_;
  bool finished_ = false;
  bool abandoned_ = false;
  GenerationStats stats_;
};

// A served model as /api/tags lists it: name, model, modified_at, size, digest, details.
// Reads the GGUF header when the model is not loaded.
nlohmann::ordered_json OllamaModelEntry(const ServedModel& m);
// /api/show: modelfile, parameters, template, details, model_info (the GGUF's scalar metadata
// and general.parameter_count; arrays null unless `verbose`), capabilities, modified_at.
absl::StatusOr<nlohmann::ordered_json> OllamaShow(const ServedModel& m, bool verbose);
// /api/ps's entry of a loaded model: the tags entry with expires_at, size_vram, context_length.
nlohmann::ordered_json OllamaRunningEntry(const ServedModel& m, const LoadedModel& l,
                                          const ModelRegistry& registry);

}  // namespace thermocline::server
