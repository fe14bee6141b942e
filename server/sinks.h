// The two GenerationSinks of the HTTP front end. CollectingSink gathers a whole response for a
// non-streamed request. SseSink formats each delta as an SSE event straight into a buffer that
// the connection's thread drains: the slot thread never waits on the network (only when a
// client is so slow that 1 MiB piles up), and the buffer's capacity is reused, so a token costs
// one uncontended lock, no allocation, and at most one thread wake per 5 ms. With tools, the
// text goes through a ToolCallParser and calls are streamed as delta.tool_calls.
#pragma once

#include <condition_variable>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "server/job.h"
#include "server/openai_response.h"
#include "server/tool_calls.h"

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

  // Writes the parser's findings as chunks into the buffer (under the lock).
  class ToolEvents : public ToolCallEvents {
   public:
    explicit ToolEvents(const ResponseMeta& meta) : meta_(meta) {}
    void Content(std::string_view text) override;
    void CallStart(int index, std::string_view id, std::string_view name) override;
    void Arguments(int index, std::string_view piece) override;
    std::string* out = nullptr;
    absl::Span<const TokenLogprobs> logprobs;  // go with the next content chunk

   private:
    const ResponseMeta& meta_;
  };

  const ResponseMeta meta_;
  std::optional<ToolCallParser> tools_;  // chat with tools: calls are parsed out of the text
  ToolEvents tool_events_{meta_};
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
