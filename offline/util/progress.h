// Progress of a long offline stage: a bar with ETA on a terminal, plain lines otherwise (the
// daemon's background job relays those), and an optional callback for the daemon itself.
// Not thread-safe: one stage reports from one thread.
#pragma once

#include <chrono>
#include <cstdio>
#include <functional>
#include <string>

namespace thermocline::offline {

// stage: "profile", "train", "solve"; fraction in [0, 1]. Returning false asks the stage to
// stop early (cancellation); the stage then returns a Cancelled status.
using ProgressCallback = std::function<bool(const std::string& stage, double fraction)>;

class ProgressReporter {
 public:
  // out: where bars/lines go (nullptr: silent). The callback, when set, sees every update.
  ProgressReporter(std::string stage, FILE* out, ProgressCallback callback = nullptr);
  // Returns false when the callback asked to cancel.
  bool Update(double fraction, const std::string& detail = "");
  void Finish(const std::string& detail = "");

 private:
  std::string stage_;
  FILE* out_;
  ProgressCallback callback_;
  bool tty_;
  std::chrono::steady_clock::time_point start_;
  std::chrono::steady_clock::time_point last_print_;
  double last_fraction_printed_ = -1.0;
};

}  // namespace thermocline::offline
