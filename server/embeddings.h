// Embedding requests, shared by OpenAI's /v1/embeddings and Ollama's /api/embed and
// /api/embeddings: the front-end-neutral EmbeddingSpec, the OpenAI wire format of its request
// and response, the job it becomes (ApiKind::kEmbedding, run on a slot through the scheduler like
// generation: server/decode_loop_embed.cc) and the sink that collects its vectors.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/runtime/embed.h"
#include "nlohmann/json.hpp"
#include "server/front_end_ops.h"
#include "server/job.h"

namespace thermocline::server {

// At most this many inputs per request (OpenAI's limit).
constexpr size_t kMaxEmbeddingInputs = 2048;

struct EmbeddingSpec {
  std::string model;
  // The inputs: texts, or token id arrays (OpenAI's `input` of integers); one of the two.
  std::vector<std::string> texts;
  std::vector<std::vector<int64_t>> ids;
  Pooling pooling = Pooling::kMean;
  bool normalize = true;
  // An input longer than the context: keep its first n_ctx tokens (Ollama's `truncate`) or
  // refuse it (400 exceed_context_size_error).
  bool truncate = false;
  std::optional<int64_t> dimensions;  // accepted only when it equals the model's width
  std::string input_field = "input";  // the wire name of the inputs, for errors
};

// OpenAI's /v1/embeddings body: `model`, `input` (a string, an array of strings, an array of
// token ids or an array of such arrays), `encoding_format` ("float" or "base64", into *base64),
// `dimensions`, `user` (ignored, as OpenAI's); `pooling` ("mean", "last") is our extension.
absl::StatusOr<EmbeddingSpec> EmbeddingSpecFromOpenAi(const nlohmann::json& body, bool* base64);
// The `pooling` field of a body, when present.
absl::Status ParsePoolingField(const nlohmann::json& body, Pooling* pooling);

// Resolves the model, tokenizes and checks the inputs and returns the job (the caller sets its
// sink and submits it). Errors as PrepareJob's.
absl::StatusOr<std::shared_ptr<Job>> PrepareEmbeddingJob(const EmbeddingSpec& spec,
                                                         const SubmitContext& context);

// Collects an embedding job's vectors.
class EmbeddingSink : public GenerationSink {
 public:
  explicit EmbeddingSink(size_t inputs) : vectors_(inputs) {}
  bool OnDelta(std::string_view, absl::Span<const TokenLogprobs>) override { return true; }
  void OnEmbedding(size_t index, std::vector<float> vector) override;
  void OnFinish(StopReason reason, CancelReason cancel, const GenerationStats& stats,
                const absl::Status& error) override;
  // True once OnFinish has run; the accessors are valid then.
  bool WaitFor(std::chrono::milliseconds timeout);

  const std::vector<std::vector<float>>& vectors() const { return vectors_; }
  StopReason reason() const { return reason_; }
  CancelReason cancel() const { return cancel_; }
  const GenerationStats& stats() const { return stats_; }
  const absl::Status& error() const { return error_; }

 private:
  std::mutex mu_;
  std::condition_variable done_cv_;
  bool done_ = false;
  std::vector<std::vector<float>> vectors_;
  StopReason reason_ = StopReason::kError;
  CancelReason cancel_ = CancelReason::kClientGone;
  GenerationStats stats_;
  absl::Status error_;
};

// The error a finished embedding job's client gets, or OK when it has its vectors.
absl::Status EmbeddingOutcome(const EmbeddingSink& sink);

// Appends `v` as a JSON array of numbers, each the shortest text that reads back as the same
// float.
void AppendFloatArray(const std::vector<float>& v, std::string* out);
// The little-endian float32 bytes of `v`, base64 (RFC 4648, padded): OpenAI's base64 format.
std::string Base64Floats(const std::vector<float>& v);

// The /v1/embeddings response: {"object":"list","data":[{"object":"embedding","index",
// "embedding"}],"model","usage":{"prompt_tokens","total_tokens"}}.
std::string OpenAiEmbeddingBody(const std::string& model, const EmbeddingSink& sink, bool base64);

}  // namespace thermocline::server
