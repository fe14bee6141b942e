// Terminal bar / plain-line progress output with an ETA from the elapsed rate.
#include "offline/util/progress.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>

namespace thermocline::offline {
namespace {

std::string FormatSeconds(double s) {
  if (!std::isfinite(s) || s < 0) return "--:--";
  const long long t = static_cast<long long>(s + 0.5);
  char buf[32];
  if (t >= 3600) {
    std::snprintf(buf, sizeof(buf), "%lld:%02lld:%02lld", t / 3600, (t / 60) % 60, t % 60);
  } else {
    std::snprintf(buf, sizeof(buf), "%02lld:%02lld", t / 60, t % 60);
  }
  return buf;
}

}  // namespace

ProgressReporter::ProgressReporter(std::string stage, FILE* out, ProgressCallback callback)
    : stage_(std::move(stage)),
      out_(out),
      callback_(std::move(callback)),
      tty_(out != nullptr && isatty(fileno(out))),
      start_(std::chrono::steady_clock::now()),
      last_print_(start_) {}

bool ProgressReporter::Update(double fraction, const std::string& detail) {
  fraction = std::clamp(fraction, 0.0, 1.0);
  const bool keep_going = callback_ ? callback_(stage_, fraction) : true;
  if (out_ == nullptr) return keep_going;
  const auto now = std::chrono::steady_clock::now();
  const double elapsed = std::chrono::duration<double>(now - start_).count();
  const double since_print = std::chrono::duration<double>(now - last_print_).count();
  const double eta = fraction > 0 ? elapsed * (1.0 - fraction) / fraction : NAN;
  if (tty_) {
    if (since_print < 0.1 && fraction < 1.0) return keep_going;
    constexpr int kWidth = 30;
    const int filled = static_cast<int>(fraction * kWidth);
    std::string bar(filled, '#');
    bar.resize(kWidth, '.');
    std::fprintf(out_, "\r%-8s [%s] %5.1f%% ETA %s %s\033[K", stage_.c_str(), bar.c_str(),
                 100 * fraction, FormatSeconds(eta).c_str(), detail.c_str());
    std::fflush(out_);
  } else {
    // Plain lines: every 10% or every 10 s, whichever comes first.
    if (fraction - last_fraction_printed_ < 0.1 && since_print < 10.0) return keep_going;
    std::fprintf(out_, "%s: %.0f%% elapsed %s eta %s %s\n", stage_.c_str(), 100 * fraction,
                 FormatSeconds(elapsed).c_str(), FormatSeconds(eta).c_str(), detail.c_str());
    std::fflush(out_);
    last_fraction_printed_ = fraction;
  }
  last_print_ = now;
  return keep_going;
}

void ProgressReporter::Finish(const std::string& detail) {
  if (callback_) callback_(stage_, 1.0);
  if (out_ == nullptr) return;
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  std::fprintf(out_, "%s%s: done in %s %s\n", tty_ ? "\r\033[K" : "", stage_.c_str(),
               FormatSeconds(elapsed).c_str(), detail.c_str());
  std::fflush(out_);
}

}  // namespace thermocline::offline
