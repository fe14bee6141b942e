// Prometheus metrics of the daemon, rendered in the text exposition format at GET /metrics.
// Updates are lock-free atomics except the labelled request counter (one map insert per new
// label set, under a mutex, once per request, never per token). All methods are thread-safe.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <tuple>

namespace thermocline::server {

// Cumulative histogram over fixed upper bounds (seconds).
class Histogram {
 public:
  static constexpr size_t kBuckets = 14;
  explicit Histogram(const std::array<double, kBuckets>& bounds) : bounds_(bounds) {}
  void Observe(double seconds);
  void Render(const std::string& name, const std::string& help, std::string* out) const;

 private:
  std::array<double, kBuckets> bounds_;
  std::array<std::atomic<uint64_t>, kBuckets + 1> counts_{};  // last: +Inf
  std::atomic<uint64_t> sum_ns_{0};
};

enum class CancelReason { kClientGone, kDeadline, kShutdown };
const char* CancelReasonName(CancelReason r);

class Metrics {
 public:
  Metrics();

  // A finished call of a front end ("http" or "grpc"): its route pattern or gRPC method, and its
  // status (HTTP status code, or gRPC status code name).
  void CountRequest(std::string_view frontend, std::string_view endpoint, std::string_view status);
  // A generation's prompt: `total` tokens, `cached` of them found in the slot's KV cache (the
  // prefix cache), `computed` of them prefilled (total - cached, fewer when cancelled).
  void AddPromptTokens(int64_t total, int64_t cached, int64_t computed) {
    prompt_tokens_ += total;
    prompt_cached_ += cached;
    prompt_computed_ += computed;
  }
  void AddGeneratedToken() { generated_tokens_.fetch_add(1, std::memory_order_relaxed); }
  void ObserveTimeToFirstToken(double s) { ttft_.Observe(s); }
  void ObserveInterToken(double s) { inter_token_.Observe(s); }
  void ObserveRequestDuration(double s) { duration_.Observe(s); }
  void ObserveQueueWait(double s) { queue_wait_.Observe(s); }
  void CountCancellation(CancelReason r) { cancellations_[static_cast<int>(r)]++; }
  void CountRejection() { rejected_queue_full_++; }
  void SetQueueDepth(int64_t n) { queue_depth_ = n; }
  void AddBusySlots(int64_t d) { busy_slots_ += d; }
  void SetSlots(int64_t n) { slots_ = n; }

  int64_t cancellations(CancelReason r) const { return cancellations_[static_cast<int>(r)]; }
  std::string Render() const;

 private:
  mutable std::mutex mu_;
  // (frontend, endpoint, status)
  std::map<std::tuple<std::string, std::string, std::string>, uint64_t> requests_;
  std::atomic<int64_t> prompt_tokens_{0};
  std::atomic<int64_t> prompt_cached_{0};
  std::atomic<int64_t> prompt_computed_{0};
  std::atomic<int64_t> generated_tokens_{0};
  Histogram ttft_, inter_token_, duration_, queue_wait_;
  std::array<std::atomic<int64_t>, 3> cancellations_{};
  std::atomic<int64_t> rejected_queue_full_{0};
  std::atomic<int64_t> queue_depth_{0};
  std::atomic<int64_t> busy_slots_{0};
  std::atomic<int64_t> slots_{0};
};

}  // namespace thermocline::server
