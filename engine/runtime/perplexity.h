// Perplexity as llama.cpp's perplexity tool computes it: the text is tokenized (with BOS),
// cut into non-overlapping windows of n_ctx tokens, each window evaluated from an empty cache
// with its first token replaced by BOS, and the second half of each window scored.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/model/session.h"

namespace thermocline {

struct PerplexityResult {
  double ppl = 0;
  std::vector<double> chunk_ppl;  // running perplexity after each window, as llama.cpp prints
  int64_t tokens_scored = 0;
  int64_t n_ctx = 0;
  double seconds = 0;
};

// Needs at least 2 * n_ctx tokens of text (as llama.cpp). session's context must be >= n_ctx.
// on_chunk (optional) sees (window index, running ppl) after each window. max_windows > 0
// scores only the first max_windows windows.
absl::StatusOr<PerplexityResult> ComputePerplexity(
    Session& session, const std::string& text, int64_t n_ctx,
    const std::function<void(int64_t, double)>& on_chunk = nullptr, int64_t max_windows = 0);

}  // namespace thermocline
