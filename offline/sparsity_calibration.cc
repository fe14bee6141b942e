#include "offline/sparsity_calibration.h"

#include <algorithm>
#include <fstream>
#include <optional>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/model/activation.h"
#include "engine/runtime/engine.h"
#include "engine/runtime/generate.h"
#include "engine/runtime/perplexity.h"

namespace thermocline::offline {
namespace {

class Trials {
 public:
  Trials(const LlamaModel& model, const std::string& text, ThreadPool& pool,
         const CalibrationOptions& options, int total, ProgressReporter* progress)
      : model_(model),
        text_(text),
        pool_(pool),
        options_(options),
        total_(total),
        progress_(progress) {}

  // Perplexity with `plan` (std::nullopt: dense), every token through the FFN it gives.
  absl::StatusOr<PerplexityResult> Run(std::optional<SparsePlan> plan, const std::string& what) {
    EngineOptions eo;
    eo.n_ctx = options_.n_ctx;
    eo.max_batch = options_.n_ctx;
    eo.dense_prefill = false;
    auto engine = Engine::Create(model_, std::move(plan), eo, pool_);
    if (!engine.ok()) return engine.status();
    auto session = (*engine)->NewSession(&pool_);
    if (!session.ok()) return session.status();
    auto r = ComputePerplexity((*session)->session(), text_, options_.n_ctx, nullptr,
                               options_.max_windows);
    if (!r.ok()) return r.status();
    ++done_;
    if (progress_ != nullptr && !progress_->Update(static_cast<double>(done_) / total_,
                                                   absl::StrFormat("%s: ppl %.4f", what, r->ppl))) {
      return absl::CancelledError("calibration cancelled");
    }
    return r;
  }

 private:
  const LlamaModel& model_;
  const std::string& text_;
  ThreadPool& pool_;
  const CalibrationOptions& options_;
  const int total_;
  ProgressReporter* progress_;
  int done_ = 0;
};

// Levels are float-exact: the sidecar stores them as F32 and the load recomputes the same
// thresholds from them.
double Level(double s) { return static_cast<double>(static_cast<float>(s)); }

}  // namespace

absl::StatusOr<SparsityCalibration> CalibrateSparsity(const LlamaModel& model,
                                                      const Sidecar& sidecar,
                                                      const std::string& text, ThreadPool& pool,
                                                      const CalibrationOptions& options,
                                                      ProgressReporter* progress) {
  const LlamaHparams& h = model.hparams();
  if (h.is_moe() || GateDecides(h.activation)) {
    return absl::InvalidArgumentError(
        absl::StrCat("a perplexity target calibrates SwiGLU thresholds; this model's FFN is ",
                     h.is_moe() ? "a mixture of experts" : ActivationName(h.activation),
                     ", which has none (its sparsity is what it fires)"));
  }
  if (!(options.max_ppl_increase > 0 && options.max_ppl_increase < 10) ||
      !(options.max_sparsity > 0 && options.max_sparsity < 1) || options.steps < 1 ||
      options.steps > 20 || options.n_ctx < 4 || options.max_windows < 0) {
    return absl::InvalidArgumentError(
        "calibration: the perplexity increase must be in (0, 10), the highest sparsity in "
        "(0, 1), steps in [1, 20], the context at least 4");
  }
  CalibrationOptions o = options;
  o.n_ctx = std::min(o.n_ctx, h.n_ctx_train);
  const std::vector<MethodChoice> methods = SidecarMethods(sidecar, model);
  Trials trials(model, text, pool, o, 1 + static_cast<int>(methods.size()) * (2 + o.steps),
                progress);

  SparsityCalibration result;
  result.max_ppl_increase = o.max_ppl_increase;
  result.n_ctx = o.n_ctx;
  auto dense = trials.Run(std::nullopt, "dense");
  if (!dense.ok()) return dense.status();
  result.dense_ppl = dense->ppl;
  result.tokens_scored = dense->tokens_scored;
  const double limit = dense->ppl * (1 + o.max_ppl_increase);

  for (MethodChoice method : methods) {
    MethodCalibration& m = result.methods.emplace_back();
    m.method = method;
    const char* name = MethodChoiceName(method);
    auto measure = [&](double s) -> absl::StatusOr<double> {
      auto plan = SparsePlanFromSidecar(sidecar, model, s, method);
      if (!plan.ok()) return plan.status();
      auto r = trials.Run(*std::move(plan), absl::StrFormat("%s at %.3f", name, s));
      if (!r.ok()) return r.status();
      m.trials.push_back({s, r->ppl});
      return r->ppl;
    };
    // The highest level first; then bisection between the best that met the target and the
    // lowest that did not.
    double lo = 0, hi = Level(o.max_sparsity);
    auto top = measure(hi);
    if (!top.ok()) return top.status();
    if (*top <= limit) {
      m.sparsity = hi;
      m.ppl = *top;
      m.met = true;
      continue;
    }
    for (int step = 0; step < o.steps; ++step) {
      const double mid = Level((lo + hi) / 2);
      auto ppl = measure(mid);
      if (!ppl.ok()) return ppl.status();
      if (*ppl <= limit) {
        lo = mid;
        m.sparsity = mid;
        m.ppl = *ppl;
        m.met = true;
      } else {
        hi = mid;
      }
    }
    if (!m.met) {
      auto plan = SparsePlanFromSidecar(sidecar, model, hi, method);
      if (!plan.ok()) return plan.status();
      for (SparseLayerPlan& p : plan->layers) {
        p.magnitude_threshold = 0;
        p.gate_threshold = 0;
        p.attn_in_threshold = 0;
        p.ffn_in_threshold = 0;
      }
      auto r = trials.Run(*std::move(plan), absl::StrFormat("%s, thresholds 0", name));
      if (!r.ok()) return r.status();
      m.floor_ppl = r->ppl;
    }
  }
  if (progress != nullptr) {
    std::string summary = absl::StrFormat("dense %.4f", result.dense_ppl);
    for (const MethodCalibration& m : result.methods) {
      absl::StrAppend(&summary, absl::StrFormat(", %s %.3f (%.4f)", MethodChoiceName(m.method),
                                                m.sparsity, m.ppl));
    }
    progress->Finish(summary);
  }
  return result;
}

absl::StatusOr<std::string> SampleCalibrationText(const LlamaModel& model, ThreadPool& pool,
                                                  int64_t tokens, int64_t n_ctx, uint64_t seed) {
  n_ctx = std::min(n_ctx, model.hparams().n_ctx_train);
  if (tokens <= 0 || n_ctx < 2) {
    return absl::InvalidArgumentError("sampling a calibration text needs tokens and a context");
  }
  EngineOptions eo;
  eo.n_ctx = n_ctx;
  eo.max_batch = std::min<int64_t>(n_ctx, 64);
  auto engine = Engine::Create(model, std::nullopt, eo, pool);
  if (!engine.ok()) return engine.status();
  auto session = (*engine)->NewSession(&pool);
  if (!session.ok()) return session.status();
  const Tokenizer& tok = model.tokenizer();
  const int32_t bos = tok.bos_id() >= 0 ? tok.bos_id() : 0;
  std::string text;
  int64_t sampled = 0;
  for (uint64_t round = 0; sampled < tokens; ++round) {
    GenerateOptions go;
    go.max_tokens = static_cast<int32_t>(n_ctx - 1);
    go.sampling.temperature = 1.0f;
    go.sampling.top_k = 0;
    go.sampling.top_p = 1.0f;
    go.sampling.min_p = 0.0f;
    go.sampling.seed = seed + round;
    Session& s = (*session)->session();
    s.Reset();
    std::string story;
    int64_t n = 0;
    auto r = Generate(s, {&bos, 1}, go, [&](const GeneratedToken& t) {
      story.append(t.text);
      ++n;
      return TokenAction::kContinue;
    });
    if (!r.ok()) return r.status();
    if (n == 0) return absl::InternalError("sampling a calibration text produced no tokens");
    if (!text.empty()) text.append("\n\n");
    text.append(story);
    sampled += n;
  }
  return text;
}

absl::StatusOr<CalibrationText> ChooseCalibrationText(const LlamaModel& model, ThreadPool& pool,
                                                      const std::string& text_path,
                                                      const std::string& corpus_path,
                                                      size_t corpus_bytes_read,
                                                      const CalibrationOptions& options,
                                                      uint64_t seed) {
  CalibrationText chosen;
  const int64_t n_ctx = std::min(options.n_ctx, model.hparams().n_ctx_train);
  if (text_path.empty() && corpus_path.empty()) {
    const int64_t windows = options.max_windows > 0 ? options.max_windows : 4;
    auto text = SampleCalibrationText(model, pool, (windows + 1) * n_ctx, n_ctx, seed);
    if (!text.ok()) return text.status();
    chosen.text = *std::move(text);
    chosen.held_out = true;
    return chosen;
  }
  const std::string& path = text_path.empty() ? corpus_path : text_path;
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read ", path));
  std::stringstream all;
  all << in.rdbuf();
  chosen.text = all.str();
  chosen.held_out = !text_path.empty();
  if (text_path.empty() && corpus_bytes_read < chosen.text.size()) {
    std::string rest = chosen.text.substr(corpus_bytes_read);
    const Tokenizer& tok = model.tokenizer();
    if (static_cast<int64_t>(tok.Encode(rest, tok.add_bos()).size()) >= 2 * n_ctx) {
      chosen.text = std::move(rest);
      chosen.held_out = true;
    }
  }
  return chosen;
}

void ApplyCalibration(const SparsityCalibration& c, bool held_out, Sidecar& sidecar) {
  SidecarCalibration& s = sidecar.calibration;
  s = SidecarCalibration{};
  s.present = true;
  s.max_ppl_increase = c.max_ppl_increase;
  s.held_out = held_out;
  s.n_ctx = c.n_ctx;
  s.tokens_scored = c.tokens_scored;
  s.dense_ppl = c.dense_ppl;
  for (const MethodCalibration& m : c.methods) {
    if (m.method == MethodChoice::kGateFirst) {
      s.gate_first = true;
      s.gate_first_sparsity = m.sparsity;
      s.gate_first_ppl = m.ppl;
    } else if (m.method == MethodChoice::kInputSparse) {
      s.input_sparse = true;
      s.input_sparse_sparsity = m.sparsity;
      s.input_sparse_ppl = m.ppl;
    } else {
      s.predicted_sparsity = m.sparsity;
      s.predicted_ppl = m.ppl;
    }
  }
}

}  // namespace thermocline::offline
