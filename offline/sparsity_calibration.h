// Sparsity for a perplexity target (SwiGLU): per method (predicted, gate-first, input-sparse),
// the largest target sparsity whose perplexity on a text stays within a relative increase over
// dense. Each trial builds the engine the sidecar's plan gives at that sparsity (every layer's
// thresholds at their own quantiles of the profile, as --target-sparsity sets them at load) and
// measures it as `perplexity` does, every token through the sparse FFN; a bisection over
// [0, max_sparsity] keeps the largest level that met the target. The result goes into the
// sidecar (SidecarCalibration), where loading without --target-sparsity finds it.
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

struct CalibrationOptions {
  double max_ppl_increase = 0.02;  // relative to dense: 0.02 = at most 2% above
  int64_t n_ctx = 256;             // perplexity windows (capped at the model's context)
  int64_t max_windows = 4;         // windows scored per trial (0: every window of the text)
  double max_sparsity = 0.9;       // the highest level tried
  int steps = 6;                   // bisection steps below it: resolution max_sparsity / 2^steps
};

struct CalibrationTrial {
  double sparsity = 0;
  double ppl = 0;
};

struct MethodCalibration {
  MethodChoice method = MethodChoice::kPredicted;
  double sparsity = 0;  // the largest level tried that met the target; 0: none did
  double ppl = 0;       // at `sparsity` (0 when none met the target: not measured)
  bool met = false;
  // When no level met the target: the perplexity with every threshold at 0, which the method
  // loses without dropping anything by magnitude (predicted: the predictors' misses;
  // input-sparse: its transposed copies' requantization).
  double floor_ppl = 0;
  std::vector<CalibrationTrial> trials;  // in the order tried
};

struct SparsityCalibration {
  double max_ppl_increase = 0;
  double dense_ppl = 0;
  int64_t n_ctx = 0;
  int64_t tokens_scored = 0;  // per trial
  // predicted; gate-first and input-sparse where the profile allows them (SidecarMethods)
  std::vector<MethodCalibration> methods;
};

// InvalidArgument for a model whose FFN is not gated by magnitude (the ReLU family fires exact
// zeros and a mixture of experts is routed: nothing to calibrate), for options out of range, and
// for a text too short for two windows at the context.
absl::StatusOr<SparsityCalibration> CalibrateSparsity(const LlamaModel& model,
                                                      const Sidecar& sidecar,
                                                      const std::string& text, ThreadPool& pool,
                                                      const CalibrationOptions& options,
                                                      ProgressReporter* progress = nullptr);

// Text for a calibration without a corpus: stories the model samples itself (temperature 1, from
// BOS, each at most n_ctx - 1 tokens, ended by its end token), joined by blank lines, until
// they hold about `tokens` tokens. The seed differs from the profile's own sampling, so the
// text is not what the profile saw.
absl::StatusOr<std::string> SampleCalibrationText(const LlamaModel& model, ThreadPool& pool,
                                                  int64_t tokens, int64_t n_ctx, uint64_t seed);

struct CalibrationText {
  std::string text;
  bool held_out = false;  // unseen by the profile
};

// The text a calibration measures on: the file at text_path when given (held out); else the
// corpus after the corpus_bytes_read bytes the profile read, when that holds two windows at the
// context (held out), else the whole corpus (not held out); without either (both ""), stories
// the model samples with `seed` (held out). NotFound naming a file that cannot be read.
absl::StatusOr<CalibrationText> ChooseCalibrationText(const LlamaModel& model, ThreadPool& pool,
                                                      const std::string& text_path,
                                                      const std::string& corpus_path,
                                                      size_t corpus_bytes_read,
                                                      const CalibrationOptions& options,
                                                      uint64_t seed);

// Writes the calibration into the sidecar; held_out says the text was unseen by the profile.
void ApplyCalibration(const SparsityCalibration& calibration, bool held_out, Sidecar& sidecar);

}  // namespace thermocline::offline
