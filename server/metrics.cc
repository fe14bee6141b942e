#include "server/metrics.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace thermocline::server {
namespace {

constexpr std::array<double, Histogram::kBuckets> kLatencyBounds = {
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30};
constexpr std::array<double, Histogram::kBuckets> kDurationBounds = {
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300};

void Header(std::string* out, const std::string& name, const char* help, const char* type) {
  absl::StrAppend(out, "# HELP ", name, " ", help, "\n# TYPE ", name, " ", type, "\n");
}

void Scalar(std::string* out, const std::string& name, const char* help, const char* type,
            int64_t v) {
  Header(out, name, help, type);
  absl::StrAppend(out, name, " ", v, "\n");
}

}  // namespace

void Histogram::Observe(double seconds) {
  if (!(seconds >= 0)) seconds = 0;
  size_t i = 0;
  while (i < kBuckets && seconds > bounds_[i]) ++i;
  counts_[i].fetch_add(1, std::memory_order_relaxed);
  sum_ns_.fetch_add(static_cast<uint64_t>(std::llround(seconds * 1e9)), std::memory_order_relaxed);
}

void Histogram::Render(const std::string& name, const std::string& help, std::string* out) const {
  Header(out, name, help.c_str(), "histogram");
  uint64_t cumulative = 0;
  for (size_t i = 0; i <= kBuckets; ++i) {
    cumulative += counts_[i].load(std::memory_order_relaxed);
    const std::string le = i < kBuckets ? absl::StrFormat("%g", bounds_[i]) : "+Inf";
    absl::StrAppend(out, name, "_bucket{le=\"", le, "\"} ", cumulative, "\n");
  }
  absl::StrAppendFormat(out, "%s_sum %.9f\n%s_count %d\n", name,
                        sum_ns_.load(std::memory_order_relaxed) * 1e-9, name, cumulative);
}

const char* CancelReasonName(CancelReason r) {
  switch (r) {
    case CancelReason::kClientGone:
      return "client_disconnected";
    case CancelReason::kDeadline:
      return "deadline";
    case CancelReason::kShutdown:
      return "shutdown";
  }
  return "?";
}

Metrics::Metrics()
    : ttft_(kLatencyBounds),
      inter_token_(kLatencyBounds),
      duration_(kDurationBounds),
      queue_wait_(kDurationBounds) {}

void Metrics::CountRequest(std::string_view frontend, std::string_view endpoint,
                           std::string_view status) {
  std::lock_guard<std::mutex> lock(mu_);
  ++requests_[{std::string(frontend), std::string(endpoint), std::string(status)}];
}

std::string Metrics::Render() const {
  std::string out;
  Header(&out, "thermocline_requests_total",
         "Requests by front end (http, grpc), endpoint (route or gRPC method) and status.",
         "counter");
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [key, n] : requests_) {
      const auto& [frontend, endpoint, status] = key;
      absl::StrAppend(&out, "thermocline_requests_total{frontend=\"", frontend, "\",endpoint=\"",
                      endpoint, "\",status=\"", status, "\"} ", n, "\n");
    }
  }
  Scalar(&out, "thermocline_prompt_tokens_total",
         "Prompt tokens of generations (cached and computed).", "counter", prompt_tokens_);
  Scalar(&out, "thermocline_prompt_tokens_cached_total",
         "Prompt tokens found in a slot's KV cache (the prefix cache), not computed again.",
         "counter", prompt_cached_);
  Scalar(&out, "thermocline_prompt_tokens_computed_total", "Prompt tokens prefilled (computed).",
         "counter", prompt_computed_);
  Scalar(&out, "thermocline_generated_tokens_total", "Tokens generated.", "counter",
         generated_tokens_);
  ttft_.Render("thermocline_time_to_first_token_seconds",
               "From request arrival to the first generated token.", &out);
  inter_token_.Render("thermocline_inter_token_latency_seconds",
                      "Time between consecutive generated tokens of a request.", &out);
  duration_.Render("thermocline_request_duration_seconds", "From arrival to the end of generation.",
                   &out);
  queue_wait_.Render("thermocline_queue_wait_seconds", "Time spent waiting for a slot.", &out);
  Header(&out, "thermocline_cancellations_total", "Generations stopped early, by reason.",
         "counter");
  for (CancelReason r :
       {CancelReason::kClientGone, CancelReason::kDeadline, CancelReason::kShutdown}) {
    absl::StrAppend(&out, "thermocline_cancellations_total{reason=\"", CancelReasonName(r), "\"} ",
                    cancellations(r), "\n");
  }
  Scalar(&out, "thermocline_rejected_requests_total",
         "Requests refused with 503 because the queue was full.", "counter", rejected_queue_full_);
  Scalar(&out, "thermocline_queue_depth", "Requests waiting for a slot.", "gauge", queue_depth_);
  Scalar(&out, "thermocline_slots_busy", "Slots generating now.", "gauge", busy_slots_);
  Scalar(&out, "thermocline_slots", "Decode slots.", "gauge", slots_);
  return out;
}

}  // namespace thermocline::server
