#include "engine/runtime/perplexity.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace thermocline {

absl::StatusOr<PerplexityResult> ComputePerplexity(
    Session& session, const std::string& text, int64_t n_ctx,
    const std::function<void(int64_t, double)>& on_chunk, int64_t max_windows) {
  if (n_ctx < 4) return absl::InvalidArgumentError("perplexity needs a context of at least 4");
  if (n_ctx > session.n_ctx()) {
    return absl::InvalidArgumentError(
        absl::StrCat("perplexity context ", n_ctx, " exceeds the session's ", session.n_ctx()));
  }
  const Tokenizer& tok = session.model().tokenizer();
  std::vector<int32_t> tokens = tok.Encode(text, tok.add_bos());
  if (static_cast<int64_t>(tokens.size()) < 2 * n_ctx) {
    return absl::InvalidArgumentError(absl::StrCat("the text has ", tokens.size(),
                                                   " tokens; perplexity at context ", n_ctx,
                                                   " needs at least ", 2 * n_ctx));
  }
  const int64_t n_vocab = session.model().hparams().n_vocab;
  int64_t n_chunk = static_cast<int64_t>(tokens.size()) / n_ctx;
  if (max_windows > 0) n_chunk = std::min(n_chunk, max_windows);
  const int64_t first = n_ctx / 2;
  std::vector<float> logits(n_ctx * n_vocab);
  std::vector<int32_t> window(n_ctx);

  PerplexityResult result;
  result.n_ctx = n_ctx;
  double nll = 0.0;
  const auto start = std::chrono::steady_clock::now();
  for (int64_t c = 0; c < n_chunk; ++c) {
    std::copy_n(tokens.begin() + c * n_ctx, n_ctx, window.begin());
    if (tok.add_bos() && tok.bos_id() >= 0) window[0] = tok.bos_id();
    session.Reset();
    if (absl::Status s = session.Eval(window, logits.data()); !s.ok()) return s;
    // Position j predicts token j + 1 of the window; j runs over the second half.
    for (int64_t j = first; j < n_ctx - 1; ++j) {
      const float* row = logits.data() + j * n_vocab;
      float max = row[0];
      for (int64_t v = 1; v < n_vocab; ++v) max = std::max(max, row[v]);
      double sum = 0.0;
      for (int64_t v = 0; v < n_vocab; ++v) sum += std::exp(static_cast<double>(row[v]) - max);
      const int32_t target = tokens[c * n_ctx + j + 1];
      nll += std::log(sum) - (static_cast<double>(row[target]) - max);
      ++result.tokens_scored;
    }
    const double ppl = std::exp(nll / static_cast<double>(result.tokens_scored));
    result.chunk_ppl.push_back(ppl);
    if (on_chunk) on_chunk(c, ppl);
  }
  result.ppl = result.chunk_ppl.back();
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  session.Reset();
  return result;
}

}  // namespace thermocline
