// Token sampling: penalties, then greedy or temperature with top-k / top-p / min-p, seeded.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace thermocline {

struct SamplingParams {
  float temperature = 0.8f;        // <= 0: greedy
  int32_t top_k = 40;              // <= 0: off
  float top_p = 0.95f;             // >= 1: off
  float min_p = 0.05f;             // <= 0: off
  float repeat_penalty = 1.0f;     // llama.cpp semantics: divide positive logits, multiply negative
  float frequency_penalty = 0.0f;  // OpenAI semantics: minus penalty * count
  float presence_penalty = 0.0f;   // OpenAI semantics: minus penalty if present
  int32_t penalty_last_n = 64;     // window of recent tokens the penalties see; -1 all
  uint64_t seed = 0xFFFFFFFFull;   // kRandomSeed: from the clock
  static constexpr uint64_t kRandomSeed = 0xFFFFFFFFull;

  static SamplingParams Greedy();
  absl::Status Validate() const;  // ranges: temperature >= 0, top_p in (0,1], min_p in [0,1] ...
};

// Holds the candidates buffer sized once for the vocabulary; Sample() does not allocate.
// Not thread-safe: one per session.
class Sampler {
 public:
  Sampler(const SamplingParams& params, int32_t vocab_size);

  // Picks the next token from logits (vocab_size floats; modified in place by penalties).
  // `history` is the sequence so far (prompt and generated) the penalties look at.
  int32_t Sample(float* logits, absl::Span<const int32_t> history);

  // log-softmax of the raw logits at `id` and the top-n alternatives, for logprobs.
  struct TokenLogprob {
    int32_t id;
    float logprob;
  };
  static float Logprob(absl::Span<const float> logits, int32_t id);
  static void TopLogprobs(absl::Span<const float> logits, int n, std::vector<TokenLogprob>* out);

  const SamplingParams& params() const { return params_; }

 private:
  SamplingParams params_;
  std::mt19937_64 rng_;
  struct Candidate {
    int32_t id;
    float logit;
  };
  std::vector<Candidate> candidates_;
  std::vector<float> probs_;
  std::vector<int32_t> counts_;
};

}  // namespace thermocline
