// Plain SVG figures (no plotting dependency): line plots with linear or log axes, and grouped
// bar charts. Enough for the profiler's power-law, rank and placement figures.
#pragma once

#include <string>
#include <vector>

namespace thermocline::offline {

struct PlotSeries {
  std::string label;
  std::vector<double> x, y;
  bool markers = false;  // draw points as well as the line
};

struct PlotOptions {
  std::string title;
  std::string x_label;
  std::string y_label;
  bool log_x = false;
  bool log_y = false;
  int width = 760;
  int height = 480;
};

// Points with non-finite coordinates, or non-positive ones on a log axis, are left out.
std::string LinePlotSvg(const std::vector<PlotSeries>& series, const PlotOptions& options);

// values[s][c]: bar of series s in category c; y axis linear from 0.
std::string GroupedBarSvg(const std::vector<std::string>& categories,
                          const std::vector<std::string>& series_labels,
                          const std::vector<std::vector<double>>& values,
                          const PlotOptions& options);

}  // namespace thermocline::offline
