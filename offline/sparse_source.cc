// Sparse plans from sidecars, PowerInfer predictors and the oracle; the choice among them.
#include "offline/sparse_source.h"

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "offline/speed_check.h"

namespace thermocline::offline {

namespace {

// |act| quantile at level q in [0, 1] from kQuantileLevels evenly spaced quantiles.
float QuantileAt(const std::vector<float>& quantiles, double q) {
  if (quantiles.empty()) return 0.0f;
  const double pos = std::clamp(q, 0.0, 1.0) * (quantiles.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(pos));
  const size_t hi = std::min(lo + 1, quantiles.size() - 1);
  const double f = pos - lo;
  return static_cast<float>(quantiles[lo] * (1 - f) + quantiles[hi] * f);
}

// Weight bytes one token reads in layer l's FFN by each method, from the profile: predicted
// reads gate and up rows of the predicted share and down rows of the share its threshold keeps
// (predicted_sparsity; < 0: the profile's firing share), plus the predictor; gate-first every
// gate row and up and down rows of the share its threshold keeps.
bool GateFirstReadsLess(const SidecarLayer& s, const LayerWeights& L, double predicted_sparsity,
                        double gate_first_sparsity) {
  const double g = static_cast<double>(L.ffn_gate.row_bytes) * L.ffn_gate.rows;
  const double u = static_cast<double>(L.ffn_up.row_bytes) * L.ffn_up.rows;
  const double d = static_cast<double>(L.ffn_down.row_bytes) * L.ffn_down.rows;
  const Predictor& pr = s.predictor;
  const double predictor = pr.rank > 0 ? 2.0 * pr.rank * (pr.n_embd + pr.n_ff) : 0.0;  // F16
  const double active = pr.rank > 0 ? s.predicted_active : 1.0;
  const double dropped = predicted_sparsity >= 0 ? predicted_sparsity : s.sparsity;
  const double predicted = active * (g + u) + (1.0 - dropped) * d + predictor;
  const double gate_first = g + (1.0 - gate_first_sparsity) * (u + d);
  return gate_first < predicted;
}

}  // namespace

absl::StatusOr<MethodChoice> ParseSparseMethod(const std::string& text, const std::string& what) {
  if (text == "auto") return MethodChoice::kAuto;
  if (text == "predicted") return MethodChoice::kPredicted;
  if (text == "gate-first") return MethodChoice::kGateFirst;
  return absl::InvalidArgumentError(
      absl::StrCat(what, " ", text, ": use auto, predicted or gate-first"));
}

const char* MethodChoiceName(MethodChoice method) {
  switch (method) {
    case MethodChoice::kAuto:
      return "auto";
    case MethodChoice::kPredicted:
      return "predicted";
    case MethodChoice::kGateFirst:
      return "gate-first";
  }
  return "?";
}

bool HasGateFirstStatistics(const SidecarLayer& layer, int64_t n_ff) {
  return layer.gate_score_quantiles.size() == static_cast<size_t>(kQuantileLevels) &&
         static_cast<int64_t>(layer.gate_scale.size()) == n_ff;
}

std::vector<MethodChoice> SidecarMethods(const Sidecar& sidecar, const LlamaModel& model) {
  const LlamaHparams& h = model.hparams();
  std::vector<MethodChoice> methods = {MethodChoice::kPredicted};
  const bool gate_first =
      !GateDecides(h.activation) && !h.is_moe() &&
      std::all_of(sidecar.layers.begin(), sidecar.layers.end(),
                  [&](const SidecarLayer& l) { return HasGateFirstStatistics(l, h.n_ff); });
  if (gate_first) methods.push_back(MethodChoice::kGateFirst);
  return methods;
}

double SidecarLevel(const Sidecar& sidecar, double target_sparsity, MethodChoice method) {
  const SidecarCalibration& c = sidecar.calibration;
  if (target_sparsity > 0) return target_sparsity;
  if (method == MethodChoice::kGateFirst) {
    return c.present && c.gate_first     ? c.gate_first_sparsity
           : sidecar.target_sparsity > 0 ? sidecar.target_sparsity
                                         : 0.5;
  }
  return c.present ? c.predicted_sparsity : sidecar.target_sparsity;
}

absl::StatusOr<SparsePlan> SparsePlanFromSidecar(const Sidecar& sidecar, const LlamaModel& model,
                                                 double target_sparsity, MethodChoice method) {
  if (absl::Status s = CheckSidecarMatches(sidecar, model); !s.ok()) return s;
  const LlamaHparams& h = model.hparams();
  const bool gated_by_magnitude = !GateDecides(h.activation) && !h.is_moe();
  if (method == MethodChoice::kGateFirst && !gated_by_magnitude) {
    return absl::InvalidArgumentError(
        absl::StrCat("gate-first is for SwiGLU models; this one's FFN is ",
                     h.is_moe() ? "a mixture of experts" : ActivationName(h.activation),
                     ", whose gate already decides (use predicted or auto)"));
  }
  // Thresholds at the asked sparsity; else at the one calibrated for a perplexity target
  // (SidecarCalibration); else predicted keeps the sidecar's thresholds and gate-first takes
  // the profile's target sparsity.
  const SidecarCalibration& cal = sidecar.calibration;
  const double predicted_sparsity = target_sparsity > 0 ? target_sparsity
                                    : cal.present       ? cal.predicted_sparsity
                                                        : -1.0;
  const double gate_first_sparsity =
      SidecarLevel(sidecar, target_sparsity, MethodChoice::kGateFirst);
  // auto: the method that decoded fastest in the speed check, when it applies here.
  const SidecarSpeed* speed = h.is_moe() ? nullptr : ApplicableSpeed(sidecar, target_sparsity);
  if (method == MethodChoice::kAuto && gated_by_magnitude && speed != nullptr &&
      std::max(speed->predicted_tokens_per_s, speed->gate_first_tokens_per_s) > 0) {
    method = speed->gate_first_tokens_per_s > speed->predicted_tokens_per_s
                 ? MethodChoice::kGateFirst
                 : MethodChoice::kPredicted;
  }
  SparsePlan result;
  result.source = SparsePlan::Source::kSidecar;
  std::vector<SparseLayerPlan>& plan = result.layers;
  plan.resize(sidecar.layers.size());
  result.attention_gpu.assign(sidecar.layers.size(), 0);
  for (size_t l = 0; l < plan.size(); ++l) {
    const SidecarLayer& s = sidecar.layers[l];
    SparseLayerPlan& p = plan[l];
    if (sidecar.n_expert > 0) {  // experts as units: routing counts and the device experts
      p.route_count = s.expert_route_count;
      for (size_t e = 0; e < s.expert_gpu.size(); ++e) {
        if (s.expert_gpu[e]) p.device_experts.push_back(static_cast<int32_t>(e));
      }
      continue;
    }
    const Predictor& pr = s.predictor;
    if (pr.rank > 0) {
      // The sidecar holds fc1/fc2 as F16; in memory they are F16-rounded floats: exact.
      p.rank = pr.rank;
      p.fc1 = MakeWeight(GgmlType::kF16, pr.fc1.data(), pr.rank, pr.n_embd);
      p.fc2 = MakeWeight(GgmlType::kF16, pr.fc2.data(), pr.n_ff, pr.rank);
      p.b1 = pr.b1;
      p.b2 = pr.b2;
      p.threshold = pr.threshold;
    }
    p.magnitude_threshold = s.magnitude_threshold;
    if (static_cast<int64_t>(s.fire_count.size()) == model.hparams().n_ff) {
      p.fire_count = s.fire_count;  // lays the rows out hottest first
    }
    if (predicted_sparsity >= 0 && model.hparams().activation == FfnActivation::kSilu) {
      p.magnitude_threshold = QuantileAt(s.act_abs_quantiles, predicted_sparsity);
    }
    const bool has_gate = HasGateFirstStatistics(s, h.n_ff);
    if (method == MethodChoice::kGateFirst && !has_gate) {
      return absl::FailedPreconditionError(
          absl::StrCat("layer ", l,
                       " has no gate-first calibration (gate_scale, gate_score_quantiles): the "
                       "sidecar predates it; profile the model again (thermocline profile)"));
    }
    const bool gate_first =
        gated_by_magnitude && has_gate &&
        (method == MethodChoice::kGateFirst ||
         (method == MethodChoice::kAuto &&
          GateFirstReadsLess(s, model.layers()[l], predicted_sparsity, gate_first_sparsity)));
    if (gate_first) {  // no predictor: the gate decides, nothing else drops
      p.method = SparseMethod::kGateFirst;
      p.gate_threshold = QuantileAt(s.gate_score_quantiles, gate_first_sparsity);
      p.gate_scale = s.gate_scale;
      p.magnitude_threshold = 0;
      p.rank = 0;
      p.fc1 = {};
      p.fc2 = {};
      p.b1.clear();
      p.b2.clear();
    }
    result.attention_gpu[l] = s.attention_gpu ? 1 : 0;
    if (!s.neuron_order.empty()) {
      if (s.n_gpu < 0 || s.n_gpu > static_cast<int64_t>(s.neuron_order.size())) {
        return absl::InvalidArgumentError(absl::StrCat("sidecar layer ", l, ": n_gpu ", s.n_gpu));
      }
      p.device_neurons.assign(s.neuron_order.begin(), s.neuron_order.begin() + s.n_gpu);
    }
  }
  if (gated_by_magnitude) {
    const bool any_gate_first = std::any_of(
        plan.begin(), plan.end(), [](auto& p) { return p.method == SparseMethod::kGateFirst; });
    const bool any_predicted = std::any_of(
        plan.begin(), plan.end(), [](auto& p) { return p.method == SparseMethod::kPredicted; });
    // calibrated_ppl: the perplexity the calibration measured at that level; 0 when no level
    // met the target.
    auto level = [&](const char* name, double s, bool calibrated, double calibrated_ppl) {
      std::string from = " (the profile's target)";
      if (target_sparsity > 0) {
        from = " (asked)";
      } else if (calibrated) {
        from = absl::StrFormat(", calibrated for at most +%.2f%% perplexity%s",
                               100 * cal.max_ppl_increase,
                               calibrated_ppl > 0 ? "" : " (no level met it)");
      }
      return absl::StrFormat("%s at sparsity %.3f%s", name, s, from);
    };
    std::vector<std::string> parts;
    if (any_predicted) {
      parts.push_back(predicted_sparsity >= 0
                          ? level("predicted", predicted_sparsity, cal.present, cal.predicted_ppl)
                          : absl::StrFormat("predicted at the profile's thresholds (sparsity %.3f)",
                                            sidecar.target_sparsity));
    }
    if (any_gate_first) {
      parts.push_back(level("gate-first", gate_first_sparsity, cal.present && cal.gate_first,
                            cal.gate_first_ppl));
    }
    result.thresholds = absl::StrJoin(parts, "; ");
  }
  // The speed check's figures for this plan: one method, at the level it was measured at.
  if (speed != nullptr) {
    const bool all_gate_first = std::all_of(
        plan.begin(), plan.end(), [](auto& p) { return p.method == SparseMethod::kGateFirst; });
    const bool all_predicted = std::all_of(
        plan.begin(), plan.end(), [](auto& p) { return p.method == SparseMethod::kPredicted; });
    const double level =
        SidecarLevel(sidecar, target_sparsity,
                     all_gate_first ? MethodChoice::kGateFirst : MethodChoice::kPredicted);
    const double measured_level =
        all_gate_first ? speed->gate_first_sparsity : speed->predicted_sparsity;
    const double measured =
        all_gate_first ? speed->gate_first_tokens_per_s : speed->predicted_tokens_per_s;
    const bool same_level = !gated_by_magnitude || std::fabs(level - measured_level) < 1e-6;
    if ((all_gate_first || all_predicted) && same_level && measured > 0) {
      result.checked_dense_tokens_per_s = speed->dense_tokens_per_s;
      result.checked_tokens_per_s = measured;
      result.speed = DescribeSpeed(*speed);
    }
  }
  result.output_gpu = sidecar.placement.present && sidecar.placement.output_gpu;
  result.placement = SummarizePlacement(sidecar);
  result.profile = SummarizeProfile(sidecar);
  return result;
}

absl::StatusOr<SparsePlan> LoadSparsePlan(const std::string& path, const LlamaModel& model,
                                          double target_sparsity, MethodChoice method) {
  absl::StatusOr<Sidecar> sidecar = LoadSidecarFor(path, model);
  if (!sidecar.ok()) return sidecar.status();
  absl::StatusOr<SparsePlan> plan = SparsePlanFromSidecar(*sidecar, model, target_sparsity, method);
  if (!plan.ok()) return plan.status();
  plan->sidecar_path = path;
  return plan;
}

PlacementSummary SummarizePlacement(const Sidecar& sidecar) {
  PlacementSummary p;
  for (const SidecarLayer& l : sidecar.layers) {
    p.gpu_neurons += l.n_gpu;
    for (int32_t on : l.expert_gpu) p.gpu_experts += on;
  }
  p.cpu_neurons = sidecar.n_layer * sidecar.n_ff - p.gpu_neurons;
  const SidecarPlacement& s = sidecar.placement;
  p.solved = s.present;
  if (s.present) {
    p.gpu_memory = s.gpu_bytes;
    p.objective = s.objective;
    p.hardware = s.hardware;
    p.modelled_tokens_per_s = s.tokens_per_s;
  }
  return p;
}

ProfileSummary SummarizeProfile(const Sidecar& sidecar) {
  ProfileSummary p;
  for (const SidecarLayer& l : sidecar.layers) {
    p.sparsity += l.sparsity;
    p.recall += l.recall;
  }
  const double n = std::max<double>(1, static_cast<double>(sidecar.layers.size()));
  p.sparsity /= n;
  p.recall /= n;
  p.layers = static_cast<int64_t>(sidecar.layers.size());
  p.tokens = sidecar.tokens;
  p.corpus = sidecar.corpus_kind;
  return p;
}

absl::StatusOr<SparseMode> ParseSparseMode(const std::string& text, const std::string& what) {
  if (text == "off") return SparseMode::kOff;
  if (text == "on") return SparseMode::kOn;
  if (text == "auto") return SparseMode::kAuto;
  return absl::InvalidArgumentError(absl::StrCat(what, " ", text, ": use off, on or auto"));
}

namespace {
// The oracle computes exact sets from dense gate/up: it replaces a method, so predicted.
MethodChoice MethodOf(const SparseRequest& request) {
  return request.oracle ? MethodChoice::kPredicted : request.method;
}
}  // namespace

absl::StatusOr<ResolvedSparse> ResolveSparsePlan(const LlamaModel& model,
                                                 const SparseRequest& request) {
  ResolvedSparse out;
  if (request.mode == SparseMode::kOff) return out;
  if (request.target_sparsity < 0 || request.target_sparsity >= 1) {
    return absl::InvalidArgumentError("the target sparsity must be in [0, 1)");
  }
  auto with_oracle = [&](SparsePlan plan) {
    plan.oracle = plan.oracle || request.oracle;
    // Auto on the CPU: a plan the speed check measured slower than dense here is not served.
    if (request.mode == SparseMode::kAuto && request.check_speed && !plan.oracle &&
        plan.checked_tokens_per_s > 0 &&
        plan.checked_tokens_per_s < plan.checked_dense_tokens_per_s) {
      out.warning = absl::StrCat(
          "sparse decode is slower than dense on this machine (the "
          "sidecar's speed check: ",
          plan.speed,
          "); serving dense (sparse \"on\", or naming the sidecar, serves "
          "it sparse)");
      return std::move(out);
    }
    out.plan = std::move(plan);
    return std::move(out);
  };
  if (!request.sidecar.empty()) {
    absl::StatusOr<SparsePlan> plan =
        LoadSparsePlan(request.sidecar, model, request.target_sparsity, MethodOf(request));
    if (!plan.ok()) {
      return absl::Status(plan.status().code(),
                          absl::StrCat("sidecar ", request.sidecar, ": ", plan.status().message()));
    }
    return with_oracle(*std::move(plan));
  }
  if (!request.model_path.empty()) {
    const std::string beside = request.model_path + ".thermo.gguf";
    std::error_code ec;
    if (std::filesystem::exists(beside, ec)) {
      absl::StatusOr<SparsePlan> plan =
          LoadSparsePlan(beside, model, request.target_sparsity, MethodOf(request));
      if (plan.ok()) return with_oracle(*std::move(plan));
      if (request.mode == SparseMode::kOn) {
        return absl::Status(plan.status().code(),
                            absl::StrCat("sidecar ", beside, ": ", plan.status().message()));
      }
      out.warning =
          absl::StrCat("ignoring ", beside, " (", plan.status().message(), "); serving dense");
      return out;
    }
  }
  if (model.carries_predictors()) {
    absl::StatusOr<std::vector<SparseLayerPlan>> layers = SparsePlanFromModel(model);
    if (!layers.ok()) return layers.status();
    SparsePlan plan;
    plan.source = SparsePlan::Source::kModelPredictors;
    plan.layers = *std::move(layers);
    return with_oracle(std::move(plan));
  }
  if (request.mode == SparseMode::kOn && request.oracle) {
    SparsePlan plan;
    plan.source = SparsePlan::Source::kOracle;
    plan.oracle = true;
    plan.layers.resize(model.hparams().n_layer);
    return with_oracle(std::move(plan));
  }
  if (request.mode == SparseMode::kOn) {
    return absl::InvalidArgumentError(
        "sparse on needs a sidecar: --sidecar FILE (config key `sidecar`), or MODEL.thermo.gguf "
        "beside the model (thermocline profile makes one)");
  }
  return out;
}

}  // namespace thermocline::offline
