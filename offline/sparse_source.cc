// Sparse plans from sidecars, PowerInfer predictors and the oracle; the choice among them.
#include "offline/sparse_source.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "engine/ops/ggml_types.h"
#include "engine/sparse/sparse_ffn.h"
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

double Bytes(const WeightView& w) { return static_cast<double>(w.row_bytes) * w.rows; }
// Bytes of w's column-sparse layout on this CPU, which an input-sparse layer reads.
double ColumnBytes(const WeightView& w) { return ColumnWeight::BytesFor(w, BestIsa()); }

// The sparsity each method's thresholds sit at.
struct AutoLevels {
  double predicted = -1;  // < 0: the profile's firing share
  double gate_first = 0;
  double input_sparse = 0;
};

// The method by which one token reads the fewest weight bytes of layer l's q/k/v and FFN, from
// the profile: predicted reads all of q/k/v, gate and up rows of the predicted share and down
// rows of the share its threshold keeps, plus the predictor; gate-first all of q/k/v, every gate
// row and up and down rows of the share its threshold keeps; input-sparse the share its
// thresholds keep of the columns of all six, in their column-sparse layouts (ColumnWeight). Ties
// keep the earlier of predicted, gate-first, input-sparse.
MethodChoice FewestBytesMethod(const SidecarLayer& s, const LayerWeights& L,
                               const AutoLevels& levels, bool gate_first, bool input_sparse) {
  const double g = Bytes(L.ffn_gate), u = Bytes(L.ffn_up), d = Bytes(L.ffn_down);
  const double qkv = Bytes(L.wq) + Bytes(L.wk) + Bytes(L.wv);
  const Predictor& pr = s.predictor;
  const double predictor = pr.rank > 0 ? 2.0 * pr.rank * (pr.n_embd + pr.n_ff) : 0.0;  // F16
  const double active = pr.rank > 0 ? s.predicted_active : 1.0;
  const double dropped = levels.predicted >= 0 ? levels.predicted : s.sparsity;
  MethodChoice best = MethodChoice::kPredicted;
  double best_bytes = qkv + active * (g + u) + (1.0 - dropped) * d + predictor;
  auto consider = [&](MethodChoice method, double bytes) {
    if (bytes < best_bytes) {
      best = method;
      best_bytes = bytes;
    }
  };
  if (gate_first) {
    consider(MethodChoice::kGateFirst, qkv + g + (1.0 - levels.gate_first) * (u + d));
  }
  if (input_sparse) {
    double all = 0;
    for (const WeightView* w : {&L.wq, &L.wk, &L.wv, &L.ffn_gate, &L.ffn_up, &L.ffn_down}) {
      all += ColumnBytes(*w);
    }
    consider(MethodChoice::kInputSparse, (1.0 - levels.input_sparse) * all);
  }
  return best;
}

}  // namespace

absl::StatusOr<MethodChoice> ParseSparseMethod(const std::string& text, const std::string& what) {
  if (text == "auto") return MethodChoice::kAuto;
  if (text == "predicted") return MethodChoice::kPredicted;
  if (text == "gate-first") return MethodChoice::kGateFirst;
  if (text == "input-sparse") return MethodChoice::kInputSparse;
  return absl::InvalidArgumentError(
      absl::StrCat(what, " ", text, ": use auto, predicted, gate-first or input-sparse"));
}

const char* MethodChoiceName(MethodChoice method) {
  switch (method) {
    case MethodChoice::kAuto:
      return "auto";
    case MethodChoice::kPredicted:
      return "predicted";
    case MethodChoice::kGateFirst:
      return "gate-first";
    case MethodChoice::kInputSparse:
      return "input-sparse";
  }
  return "?";
}

bool HasGateFirstStatistics(const SidecarLayer& layer, int64_t n_ff) {
  return layer.gate_score_quantiles.size() == static_cast<size_t>(kQuantileLevels) &&
         static_cast<int64_t>(layer.gate_scale.size()) == n_ff;
}

bool HasInputSparseStatistics(const SidecarLayer& layer) {
  const size_t n = static_cast<size_t>(kQuantileLevels);
  return layer.attn_in_quantiles.size() == n && layer.ffn_in_quantiles.size() == n &&
         layer.act_abs_quantiles.size() == n;
}

std::vector<MethodChoice> SidecarMethods(const Sidecar& sidecar, const LlamaModel& model) {
  const LlamaHparams& h = model.hparams();
  std::vector<MethodChoice> methods = {MethodChoice::kPredicted};
  if (GateDecides(h.activation) || h.is_moe() || sidecar.layers.empty()) return methods;
  auto every_layer = [&](auto has) {
    return std::all_of(sidecar.layers.begin(), sidecar.layers.end(), has);
  };
  if (every_layer([&](const SidecarLayer& l) { return HasGateFirstStatistics(l, h.n_ff); })) {
    methods.push_back(MethodChoice::kGateFirst);
  }
  if (every_layer([](const SidecarLayer& l) { return HasInputSparseStatistics(l); })) {
    methods.push_back(MethodChoice::kInputSparse);
  }
  return methods;
}

double SidecarLevel(const Sidecar& sidecar, double target_sparsity, MethodChoice method) {
  const SidecarCalibration& c = sidecar.calibration;
  if (target_sparsity > 0) return target_sparsity;
  const double profiled = sidecar.target_sparsity > 0 ? sidecar.target_sparsity : 0.5;
  if (method == MethodChoice::kGateFirst) {
    return c.present && c.gate_first ? c.gate_first_sparsity : profiled;
  }
  if (method == MethodChoice::kInputSparse) {
    return c.present && c.input_sparse ? c.input_sparse_sparsity : profiled;
  }
  return c.present ? c.predicted_sparsity : sidecar.target_sparsity;
}

absl::StatusOr<SparsePlan> SparsePlanFromSidecar(const Sidecar& sidecar, const LlamaModel& model,
                                                 double target_sparsity, MethodChoice method) {
  if (!(target_sparsity >= 0 && target_sparsity < 1)) {  // NaN too
    return absl::InvalidArgumentError(
        absl::StrCat("the target sparsity must be in [0, 1), got ", target_sparsity));
  }
  if (absl::Status s = CheckSidecarMatches(sidecar, model); !s.ok()) return s;
  const LlamaHparams& h = model.hparams();
  const bool gated_by_magnitude = !GateDecides(h.activation) && !h.is_moe();
  if ((method == MethodChoice::kGateFirst || method == MethodChoice::kInputSparse) &&
      !gated_by_magnitude) {
    return absl::InvalidArgumentError(
        absl::StrCat(MethodChoiceName(method), " is for SwiGLU models; this one's FFN is ",
                     h.is_moe() ? "a mixture of experts" : ActivationName(h.activation),
                     h.is_moe() ? ", whose router already decides (use predicted or auto)"
                                : ", whose gate already decides (use predicted or auto)"));
  }
  // Thresholds at the asked sparsity; else at the one calibrated for a perplexity target
  // (SidecarCalibration); else predicted keeps the sidecar's thresholds and gate-first and
  // input-sparse take the profile's target sparsity.
  const SidecarCalibration& cal = sidecar.calibration;
  AutoLevels levels;
  levels.predicted = target_sparsity > 0 ? target_sparsity
                     : cal.present       ? cal.predicted_sparsity
                                         : -1.0;
  levels.gate_first = SidecarLevel(sidecar, target_sparsity, MethodChoice::kGateFirst);
  levels.input_sparse = SidecarLevel(sidecar, target_sparsity, MethodChoice::kInputSparse);
  // auto: the method that decoded fastest in the speed check, when it applies here (a method
  // not measured has 0 tokens/s; ties keep the earlier of predicted, gate-first, input-sparse).
  const SidecarSpeed* speed = h.is_moe() ? nullptr : ApplicableSpeed(sidecar, target_sparsity);
  if (method == MethodChoice::kAuto && gated_by_magnitude && speed != nullptr) {
    double fastest = 0;
    for (auto [m, tps] : {std::pair{MethodChoice::kPredicted, speed->predicted_tokens_per_s},
                          {MethodChoice::kGateFirst, speed->gate_first_tokens_per_s},
                          {MethodChoice::kInputSparse, speed->input_sparse_tokens_per_s}}) {
      if (tps > fastest) {
        fastest = tps;
        method = m;
      }
    }
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
    if (levels.predicted >= 0 && model.hparams().activation == FfnActivation::kSilu) {
      p.magnitude_threshold = QuantileAt(s.act_abs_quantiles, levels.predicted);
    }
    const bool has_gate = HasGateFirstStatistics(s, h.n_ff);
    if (method == MethodChoice::kGateFirst && !has_gate) {
      return absl::FailedPreconditionError(
          absl::StrCat("layer ", l,
                       " has no gate-first calibration (gate_scale, gate_score_quantiles): the "
                       "sidecar predates it; profile the model again (thermocline profile)"));
    }
    const bool has_input = HasInputSparseStatistics(s);
    if (method == MethodChoice::kInputSparse && !has_input) {
      return absl::FailedPreconditionError(absl::StrCat(
          "layer ", l,
          " has no input-sparse calibration (attn_in_quantiles, ffn_in_quantiles): the sidecar "
          "predates it; profile the model again (thermocline profile)"));
    }
    MethodChoice layer_method = method;
    if (method == MethodChoice::kAuto) {
      // Input-sparse only where the speed check measured it fastest (above): a column of
      // its transposed copies costs more per byte than the row dots of the others (docs/
      // sparse.md), so its fewer bytes alone do not make it faster.
      layer_method = gated_by_magnitude ? FewestBytesMethod(s, model.layers()[l], levels, has_gate,
                                                            /*input_sparse=*/false)
                                        : MethodChoice::kPredicted;
    }
    if (layer_method == MethodChoice::kGateFirst || layer_method == MethodChoice::kInputSparse) {
      p.rank = 0;  // no predictor: the gate, or the inputs' magnitudes, decide
      p.fc1 = {};
      p.fc2 = {};
      p.b1.clear();
      p.b2.clear();
    }
    if (layer_method == MethodChoice::kGateFirst) {  // nothing else drops
      p.method = SparseMethod::kGateFirst;
      p.gate_threshold = QuantileAt(s.gate_score_quantiles, levels.gate_first);
      p.gate_scale = s.gate_scale;
      p.magnitude_threshold = 0;
    } else if (layer_method == MethodChoice::kInputSparse) {
      // Each projection's input at the same level of its own distribution.
      p.method = SparseMethod::kInputSparse;
      p.attn_in_threshold = QuantileAt(s.attn_in_quantiles, levels.input_sparse);
      p.ffn_in_threshold = QuantileAt(s.ffn_in_quantiles, levels.input_sparse);
      p.magnitude_threshold = QuantileAt(s.act_abs_quantiles, levels.input_sparse);
    }
    result.attention_gpu[l] = s.attention_gpu ? 1 : 0;
    // An input-sparse layer has no device part (engine/sparse/sparse_ffn.h): the placement's
    // neurons stay on the host with the rest.
    if (!s.neuron_order.empty() && p.method != SparseMethod::kInputSparse) {
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
    const bool any_input_sparse = std::any_of(
        plan.begin(), plan.end(), [](auto& p) { return p.method == SparseMethod::kInputSparse; });
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
      parts.push_back(levels.predicted >= 0
                          ? level("predicted", levels.predicted, cal.present, cal.predicted_ppl)
                          : absl::StrFormat("predicted at the profile's thresholds (sparsity %.3f)",
                                            sidecar.target_sparsity));
    }
    if (any_gate_first) {
      parts.push_back(level("gate-first", levels.gate_first, cal.present && cal.gate_first,
                            cal.gate_first_ppl));
    }
    if (any_input_sparse) {
      parts.push_back(level("input-sparse", levels.input_sparse, cal.present && cal.input_sparse,
                            cal.input_sparse_ppl));
    }
    result.thresholds = absl::StrJoin(parts, "; ");
  }
  // The speed check's figures for this plan: one method, at the level it was measured at.
  if (speed != nullptr) {
    auto all = [&](SparseMethod m) {
      return std::all_of(plan.begin(), plan.end(), [m](auto& p) { return p.method == m; });
    };
    std::optional<MethodChoice> only;
    double measured_level = 0, measured = 0;
    if (all(SparseMethod::kPredicted)) {
      only = MethodChoice::kPredicted;
      measured_level = speed->predicted_sparsity;
      measured = speed->predicted_tokens_per_s;
    } else if (all(SparseMethod::kGateFirst)) {
      only = MethodChoice::kGateFirst;
      measured_level = speed->gate_first_sparsity;
      measured = speed->gate_first_tokens_per_s;
    } else if (all(SparseMethod::kInputSparse)) {
      only = MethodChoice::kInputSparse;
      measured_level = speed->input_sparse_sparsity;
      measured = speed->input_sparse_tokens_per_s;
    }
    const bool same_level =
        only.has_value() &&
        (!gated_by_magnitude ||
         std::fabs(SidecarLevel(sidecar, target_sparsity, *only) - measured_level) < 1e-6);
    if (same_level && measured > 0) {
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
  if (!(request.target_sparsity >= 0 && request.target_sparsity < 1)) {  // NaN too
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
