// The two GenerationSinks of the HTTP front end. CollectingSink gathers a whole response for a
// non-streamed request. SseSink formats each delta as an SSE event straight into a buffer that
// the connection's thread drains: the slot thread never waits on the network (only when a
// client is so slow that 1 MiB piles up), and the buffer's capacity is reused, so a token costs
// one uncontended lock, no allocation, and at most one thread wake per 5 ms.
#pragma once

#include <condition_variable>
#include <mutex>
#include <string>
#include <vector>

#include "server/job.h"
#include "server/openai_response.h"

namespace thermocline::server {

class CollectingSink : public GenerationSink {
 public:
  bool OnDelta(std::string_view text, absl::Span<const TokenLogprobs> logprobs) override;
  void OnFinish(StopReason reason, CancelReason cancel, const GenerationStats& stats,
                const absl::Status& error) override;
  // Blocks until OnFinish. The accessors below are valid after it.
  void Wait();
  // Wait with a timeout: true once OnFinish has run.
  bool WaitFor(std::chrono::milliseconds timeout);

  const std::string& text() const { return text_; }
  const std::vector<TokenLogprobs>& logprobs() const { return logprobs_; }
  StopReason reason() const { return reason_; }
  CancelReason cancel() const { return cancel_; }
  const GenerationStats& stats() const { return stats_; }
  const absl::Status& error() const { return error_; }

 private:
  std::mutex mu_;
  std::condition_variable done_cv_;
  bool done_ = false;
  std::string text_;
  std::vector<TokenLogprobs> logprobs_;
  StopReason reason_ = StopReason::kError;
  CancelReason cancel_ = CancelReason::kClientGone;
  GenerationStats stats_;
  absl::Status error_;
};

class SseSink : public GenerationSink {
 public:
  // Chat streams start with the role chunk, queued at once.
  explicit SseSink(ResponseMeta meta);

  bool OnDelta(std::string_view text, absl::Span<const TokenLogprobs> logprobs) override;
  void OnFinish(StopReason reason, CancelReason cancel, const GenerationStats& stats,
                const absl::Status& error) override;

  // Connection side. Waits for bytes, swaps them into *out (cleared first) and returns true;
  // false once the stream has ended and everything was taken.
  bool Take(std::string* out);
  // The client is gone: producers never block on this sink again.
  void Abandon();
  // Valid after Take returned false.
  const GenerationStats& stats() const { return stats_; }

 private:
  static constexpr size_t kMaxBuffered = 1 << 20;
  // Waking the connection thread costs the slot a futex wake (an IPI, ~10% of a tiny model's
  // token time in a VM), so wakes are at most this often; tokens coming faster share a write.
  // A deferred wake rides on the next token, which is then less than this far away.
  static constexpr Clock::duration kWakeInterval = std::chrono::milliseconds(5);
  // Appends under the lock, waiting for room; false once the client is gone.
  template <typename F>
  bool Produce(F&& append);

  const ResponseMeta meta_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::string buffer_;
  bool finished_ = false;
  bool abandoned_ = false;
  bool wake_deferred_ = false;
  Clock::time_point last_wake_{};
  GenerationStats stats_;
};

}  // namespace thermocline::server
