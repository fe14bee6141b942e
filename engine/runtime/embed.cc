#include "engine/runtime/embed.h"

#include <algorithm>
#include <cmath>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace thermocline {

const char* PoolingName(Pooling pooling) { return pooling == Pooling::kLast ? "last" : "mean"; }

std::optional<Pooling> ParsePooling(std::string_view name) {
  if (name == "mean") return Pooling::kMean;
  if (name == "last") return Pooling::kLast;
  return std::nullopt;
}

absl::StatusOr<std::vector<float>> Embed(Session& session, absl::Span<const int32_t> tokens,
                                         const EmbedOptions& options, const KeepGoing& keep_going) {
  const int64_t n = static_cast<int64_t>(tokens.size());
  if (n == 0) return absl::InvalidArgumentError("an embedding needs at least one token");
  if (n > session.n_ctx()) {
    return absl::OutOfRangeError(absl::StrCat("the input has ", n,
                                              " tokens but the context length is ", session.n_ctx(),
                                              "; shorten it"));
  }
  const int64_t d = session.model().hparams().n_embd;
  const int64_t batch = session.max_batch();
  session.Reset();
  std::vector<float> hidden(static_cast<size_t>(std::min(batch, n) * d));
  std::vector<double> sum(static_cast<size_t>(d), 0.0);
  for (int64_t i = 0; i < n; i += batch) {
    if (keep_going && !keep_going()) return absl::CancelledError("the embedding was cancelled");
    const int64_t m = std::min(batch, n - i);
    if (absl::Status s = session.EvalHidden(tokens.subspan(i, m), hidden.data()); !s.ok()) {
      return s;
    }
    if (options.pooling == Pooling::kMean) {
      for (int64_t t = 0; t < m; ++t) {
        const float* row = hidden.data() + t * d;
        for (int64_t c = 0; c < d; ++c) sum[c] += row[c];
      }
    } else if (i + m == n) {
      const float* row = hidden.data() + (m - 1) * d;
      for (int64_t c = 0; c < d; ++c) sum[c] = row[c];
    }
  }
  if (options.pooling == Pooling::kMean) {
    for (double& v : sum) v /= static_cast<double>(n);
  }
  double scale = 1.0;
  if (options.normalize) {
    double norm2 = 0;
    for (double v : sum) norm2 += v * v;
    if (norm2 > 0) scale = 1.0 / std::sqrt(norm2);
  }
  std::vector<float> out(static_cast<size_t>(d));
  for (int64_t c = 0; c < d; ++c) out[c] = static_cast<float>(sum[c] * scale);
  return out;
}

}  // namespace thermocline
