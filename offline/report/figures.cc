// The profiler's and solver's figures as SVG files.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>

#include "absl/strings/str_cat.h"
#include "offline/pipeline.h"
#include "offline/report/svg_plot.h"

namespace thermocline::offline {
namespace {

absl::Status WriteText(const std::string& dir, const std::string& name, const std::string& text) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create '", dir, "': ", ec.message()));
  const std::string path = (std::filesystem::path(dir) / name).string();
  std::ofstream out(path, std::ios::binary);
  out << text;
  if (!out) return absl::InternalError(absl::StrCat("cannot write '", path, "'"));
  return absl::OkStatus();
}

}  // namespace

absl::Status WriteProfilePlots(const PipelineResult& r, const std::string& dir) {
  const Sidecar& s = r.sidecar;
  // A mixture of experts has routing counts (REPORT.json) and no neuron profile to plot.
  if (s.n_expert > 0) return absl::OkStatus();
  std::vector<PlotSeries> freq, recall, active;
  for (size_t l = 0; l < s.layers.size(); ++l) {
    PlotSeries f;
    f.label = absl::StrCat("layer ", l);
    std::vector<int32_t> counts = s.layers[l].fire_count;
    std::sort(counts.begin(), counts.end(), std::greater<>());
    for (size_t i = 0; i < counts.size(); ++i) {
      f.x.push_back(static_cast<double>(i + 1));
      f.y.push_back(static_cast<double>(counts[i]) / std::max<int64_t>(1, s.tokens));
    }
    freq.push_back(std::move(f));
    std::vector<RankTrial> trials = r.predictors.layers[l].trials;
    std::sort(trials.begin(), trials.end(),
              [](const RankTrial& a, const RankTrial& b) { return a.rank < b.rank; });
    PlotSeries rc, ac;
    rc.label = ac.label = absl::StrCat("layer ", l);
    rc.markers = ac.markers = true;
    for (const RankTrial& t : trials) {
      rc.x.push_back(static_cast<double>(t.rank));
      rc.y.push_back(t.recall_at_zero);
      ac.x.push_back(static_cast<double>(t.rank));
      ac.y.push_back(t.test.predicted_active);
    }
    recall.push_back(std::move(rc));
    active.push_back(std::move(ac));
  }
  PlotOptions o;
  o.log_x = o.log_y = true;
  o.title = "Firing frequency of FFN neurons, sorted (" + s.model_name + ")";
  o.x_label = "neuron rank (most frequent first)";
  o.y_label = "firing frequency per token";
  if (absl::Status st = WriteText(dir, "firing_frequency.svg", LinePlotSvg(freq, o)); !st.ok()) {
    return st;
  }
  PlotOptions ro;
  ro.log_x = true;
  ro.title = "Predictor recall at logit 0 vs rank (held-out)";
  ro.x_label = "predictor rank";
  ro.y_label = "recall";
  if (absl::Status st = WriteText(dir, "recall_vs_rank.svg", LinePlotSvg(recall, ro)); !st.ok()) {
    return st;
  }
  PlotOptions ao = ro;
  ao.title = absl::StrCat("Predicted active fraction at recall ", s.target_recall, " vs rank");
  ao.y_label = "neurons computed per token (fraction)";
  return WriteText(dir, "active_vs_rank.svg", LinePlotSvg(active, ao));
}

absl::Status WritePlacementPlot(const PlacementRun& run, const std::string& dir) {
  const PlacementProblem& p = run.problem;
  const Placement& x = run.chosen.placement;
  std::vector<std::string> cats;
  std::vector<std::vector<double>> v(3);
  for (size_t l = 0; l < p.layers.size(); ++l) {
    cats.push_back(std::to_string(l));
    const LayerCosts& L = p.layers[l];
    double mass = 0, total = 0;
    for (size_t b = 0; b < L.buckets.size(); ++b) {
      total += L.bucket_freq[b];
      if (x.gpu_bucket[l][b]) mass += L.bucket_freq[b];
    }
    v[0].push_back(100.0 * x.GpuNeurons(p, l) / std::max<int64_t>(1, L.n_ff));
    v[1].push_back(total > 0 ? 100.0 * mass / total : 0);
    v[2].push_back(x.attention_gpu[l] ? 100.0 : 0.0);
  }
  PlotOptions o;
  o.title =
      absl::StrCat("GPU placement (", ObjectiveName(run.objective), ", ", run.hardware.name, ")");
  o.x_label = "layer";
  o.y_label = "% on the GPU";
  return WriteText(dir, "placement.svg",
                   GroupedBarSvg(cats, {"FFN neurons", "firing mass", "attention"}, v, o));
}

}  // namespace thermocline::offline
