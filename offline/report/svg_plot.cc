// SVG drawing: an axis frame with ticks, polylines or bars, and a legend.
#include "offline/report/svg_plot.h"

#include <algorithm>
#include <cmath>
#include <sstream>

namespace thermocline::offline {
namespace {

constexpr const char* kPalette[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                                    "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};
constexpr int kLeft = 70, kRight = 150, kTop = 40, kBottom = 55;

std::string Escape(const std::string& s) {
  std::string out;
  for (char ch : s) {
    switch (ch) {
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '&':
        out += "&amp;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += ch;
    }
  }
  return out;
}

std::string Num(double v) {
  std::ostringstream o;
  o.precision(4);
  o << v;
  return o.str();
}

// One axis: maps data to pixels, linear or log10, and proposes tick values.
struct Axis {
  double lo = 0, hi = 1;
  bool log = false;
  void Fit(double mn, double mx) {
    if (!(mn <= mx)) mn = mx = log ? 1 : 0;
    if (log) {
      lo = std::pow(10, std::floor(std::log10(mn)));
      hi = std::pow(10, std::ceil(std::log10(mx)));
      if (hi <= lo) hi = lo * 10;
    } else {
      if (mx == mn) mx = mn + 1;
      const double step = NiceStep((mx - mn) / 5);
      lo = std::floor(mn / step) * step;
      hi = std::ceil(mx / step) * step;
    }
  }
  static double NiceStep(double raw) {
    const double p = std::pow(10, std::floor(std::log10(raw)));
    const double f = raw / p;
    return (f <= 1 ? 1 : f <= 2 ? 2 : f <= 5 ? 5 : 10) * p;
  }
  double Frac(double v) const {
    return log ? (std::log10(v) - std::log10(lo)) / (std::log10(hi) - std::log10(lo))
               : (v - lo) / (hi - lo);
  }
  std::vector<double> Ticks() const {
    std::vector<double> t;
    if (log) {
      for (double v = lo; v <= hi * 1.0001; v *= 10) t.push_back(v);
    } else {
      const double step = NiceStep((hi - lo) / 5);
      for (double v = lo; v <= hi + step * 1e-6; v += step)
        t.push_back(std::abs(v) < step * 1e-9 ? 0 : v);
    }
    return t;
  }
};

void Frame(std::ostringstream& o, const PlotOptions& opt, const Axis& ax, const Axis& ay,
           bool x_ticks) {
  const int w = opt.width, h = opt.height;
  const int pw = w - kLeft - kRight, ph = h - kTop - kBottom;
  o << "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" << w << "\" height=\"" << h
    << "\" viewBox=\"0 0 " << w << " " << h << "\" font-family=\"sans-serif\" font-size=\"12\">\n"
    << "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
    << "<text x=\"" << w / 2 << "\" y=\"22\" text-anchor=\"middle\" font-size=\"15\">"
    << Escape(opt.title) << "</text>\n"
    << "<rect x=\"" << kLeft << "\" y=\"" << kTop << "\" width=\"" << pw << "\" height=\"" << ph
    << "\" fill=\"none\" stroke=\"black\"/>\n";
  for (double v : ay.Ticks()) {
    const double py = kTop + ph * (1 - ay.Frac(v));
    o << "<line x1=\"" << kLeft << "\" x2=\"" << kLeft + pw << "\" y1=\"" << py << "\" y2=\"" << py
      << "\" stroke=\"#ddd\"/><text x=\"" << kLeft - 6 << "\" y=\"" << py + 4
      << "\" text-anchor=\"end\">" << Num(v) << "</text>\n";
  }
  if (x_ticks) {
    for (double v : ax.Ticks()) {
      const double px = kLeft + pw * ax.Frac(v);
      o << "<line x1=\"" << px << "\" x2=\"" << px << "\" y1=\"" << kTop << "\" y2=\"" << kTop + ph
        << "\" stroke=\"#eee\"/><text x=\"" << px << "\" y=\"" << kTop + ph + 16
        << "\" text-anchor=\"middle\">" << Num(v) << "</text>\n";
    }
  }
  o << "<text x=\"" << kLeft + pw / 2 << "\" y=\"" << h - 12 << "\" text-anchor=\"middle\">"
    << Escape(opt.x_label) << "</text>\n"
    << "<text transform=\"translate(16," << kTop + ph / 2 << ") rotate(-90)\" "
    << "text-anchor=\"middle\">" << Escape(opt.y_label) << "</text>\n";
}

void Legend(std::ostringstream& o, const PlotOptions& opt, const std::vector<std::string>& labels) {
  const int x = opt.width - kRight + 12;
  for (size_t i = 0; i < labels.size(); ++i) {
    const int y = kTop + 10 + static_cast<int>(i) * 18;
    o << "<rect x=\"" << x << "\" y=\"" << y - 9 << "\" width=\"12\" height=\"10\" fill=\""
      << kPalette[i % 10] << "\"/><text x=\"" << x + 18 << "\" y=\"" << y << "\">"
      << Escape(labels[i]) << "</text>\n";
  }
}

}  // namespace

std::string LinePlotSvg(const std::vector<PlotSeries>& series, const PlotOptions& opt) {
  auto usable = [&](double x, double y) {
    return std::isfinite(x) && std::isfinite(y) && (!opt.log_x || x > 0) && (!opt.log_y || y > 0);
  };
  double x0 = INFINITY, x1 = -INFINITY, y0 = INFINITY, y1 = -INFINITY;
  for (const PlotSeries& s : series) {
    for (size_t i = 0; i < s.x.size() && i < s.y.size(); ++i) {
      if (!usable(s.x[i], s.y[i])) continue;
      x0 = std::min(x0, s.x[i]), x1 = std::max(x1, s.x[i]);
      y0 = std::min(y0, s.y[i]), y1 = std::max(y1, s.y[i]);
    }
  }
  Axis ax, ay;
  ax.log = opt.log_x;
  ay.log = opt.log_y;
  ax.Fit(x0, x1);
  ay.Fit(y0, y1);
  std::ostringstream o;
  Frame(o, opt, ax, ay, true);
  const int pw = opt.width - kLeft - kRight, ph = opt.height - kTop - kBottom;
  std::vector<std::string> labels;
  for (size_t k = 0; k < series.size(); ++k) {
    const PlotSeries& s = series[k];
    labels.push_back(s.label);
    std::ostringstream pts;
    for (size_t i = 0; i < s.x.size() && i < s.y.size(); ++i) {
      if (!usable(s.x[i], s.y[i])) continue;
      const double px = kLeft + pw * ax.Frac(s.x[i]), py = kTop + ph * (1 - ay.Frac(s.y[i]));
      pts << px << "," << py << " ";
      if (s.markers) {
        o << "<circle cx=\"" << px << "\" cy=\"" << py << "\" r=\"3\" fill=\"" << kPalette[k % 10]
          << "\"/>\n";
      }
    }
    o << "<polyline fill=\"none\" stroke-width=\"1.5\" stroke=\"" << kPalette[k % 10]
      << "\" points=\"" << pts.str() << "\"/>\n";
  }
  Legend(o, opt, labels);
  o << "</svg>\n";
  return o.str();
}

std::string GroupedBarSvg(const std::vector<std::string>& categories,
                          const std::vector<std::string>& series_labels,
                          const std::vector<std::vector<double>>& values, const PlotOptions& opt) {
  double mx = 0;
  for (const auto& row : values) {
    for (double v : row) {
      if (std::isfinite(v)) mx = std::max(mx, v);
    }
  }
  Axis ax, ay;
  ay.Fit(0, mx > 0 ? mx : 1);
  std::ostringstream o;
  Frame(o, opt, ax, ay, false);
  const int pw = opt.width - kLeft - kRight, ph = opt.height - kTop - kBottom;
  const size_t nc = std::max<size_t>(1, categories.size()), ns = std::max<size_t>(1, values.size());
  const double group = static_cast<double>(pw) / nc;
  const double bar = group * 0.8 / ns;
  for (size_t c = 0; c < categories.size(); ++c) {
    const double gx = kLeft + group * c + group * 0.1;
    for (size_t s = 0; s < values.size(); ++s) {
      const double v = c < values[s].size() && std::isfinite(values[s][c]) ? values[s][c] : 0;
      const double top = kTop + ph * (1 - ay.Frac(v));
      o << "<rect x=\"" << gx + bar * s << "\" y=\"" << top << "\" width=\"" << bar * 0.95
        << "\" height=\"" << kTop + ph - top << "\" fill=\"" << kPalette[s % 10] << "\"/>\n";
    }
    if (categories.size() <= 40 || c % ((categories.size() + 39) / 40) == 0) {
      o << "<text x=\"" << gx + group * 0.4 << "\" y=\"" << kTop + ph + 16
        << "\" text-anchor=\"middle\">" << Escape(categories[c]) << "</text>\n";
    }
  }
  Legend(o, opt, series_labels);
  o << "</svg>\n";
  return o.str();
}

}  // namespace thermocline::offline
