#include "server/sinks.h"

#include "server/errors.h"

namespace thermocline::server {

bool CollectingSink::OnDelta(std::string_view text, absl::Span<const TokenLogprobs> logprobs) {
  text_.append(text);
  logprobs_.insert(logprobs_.end(), logprobs.begin(), logprobs.end());
  return true;
}

void CollectingSink::OnFinish(StopReason reason, CancelReason cancel, const GenerationStats& stats,
                              const absl::Status& error) {
  std::lock_guard<std::mutex> lock(mu_);
  reason_ = reason;
  cancel_ = cancel;
  stats_ = stats;
  error_ = error;
  done_ = true;
  done_cv_.notify_all();
}

void CollectingSink::Wait() {
  std::unique_lock<std::mutex> lock(mu_);
  done_cv_.wait(lock, [&] { return done_; });
}

bool CollectingSink::WaitFor(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  return done_cv_.wait_for(lock, timeout, [&] { return done_; });
}

void SseSink::ToolEvents::Content(std::string_view text) {
  AppendDeltaEvent(meta_, text, logprobs, out);
  logprobs = {};
}

void SseSink::ToolEvents::CallStart(int index, std::string_view id, std::string_view name) {
  AppendToolCallStartEvent(meta_, index, id, name, out);
}

void SseSink::ToolEvents::Arguments(int index, std::string_view piece) {
  AppendToolCallArgumentsEvent(meta_, index, piece, out);
}

SseSink::SseSink(ResponseMeta meta) : meta_(std::move(meta)) {
  buffer_.reserve(4096);
  if (meta_.parse_tool_calls) tools_.emplace(meta_.tool_format, meta_.parallel_tool_calls);
  if (meta_.kind == ApiKind::kChat) AppendRoleEvent(meta_, &buffer_);
}

template <typename F>
bool SseSink::Produce(F&& append) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return buffer_.size() < kMaxBuffered || abandoned_; });
  if (abandoned_) return false;
  const bool consumer_waiting = buffer_.empty() || wake_deferred_;
  append(&buffer_);
  if (consumer_waiting) {
    const Clock::time_point now = Clock::now();
    if (now - last_wake_ >= kWakeInterval) {
      last_wake_ = now;
      wake_deferred_ = false;
      cv_.notify_all();
    } else {
      wake_deferred_ = true;
    }
  }
  return true;
}

bool SseSink::OnDelta(std::string_view text, absl::Span<const TokenLogprobs> logprobs) {
  if (!tools_) return Produce([&](std::string* b) { AppendDeltaEvent(meta_, text, logprobs, b); });
  return Produce([&](std::string* b) {
    tool_events_.out = b;
    tool_events_.logprobs = logprobs;
    tools_->Push(text, tool_events_);
    if (!tool_events_.logprobs.empty()) AppendDeltaEvent(meta_, "", tool_events_.logprobs, b);
    tool_events_.logprobs = {};
  });
}

void SseSink::OnFinish(StopReason reason, CancelReason cancel, const GenerationStats& stats,
                       const absl::Status& error) {
  Produce([&](std::string* b) {
    if (reason == StopReason::kError) {
      AppendErrorEvent(ToApiError(error), b);
    } else if (reason == StopReason::kCancelled && cancel == CancelReason::kShutdown) {
      AppendErrorEvent(
          ToApiError(Unavailable("shutting_down", "the server shut down before the end")), b);
    } else if (reason != StopReason::kCancelled || cancel == CancelReason::kDeadline) {
      int calls = 0;
      if (tools_) {
        tool_events_.out = b;
        tools_->Finish(tool_events_);
        calls = tools_->calls();
      }
      AppendFinishEvent(meta_, FinishReasonText(reason, calls), b);
      if (meta_.include_usage) AppendUsageEvent(meta_, stats, b);
      AppendDoneEvent(b);
    }
  });
  std::lock_guard<std::mutex> lock(mu_);
  stats_ = stats;
  finished_ = true;
  cv_.notify_all();
}

bool SseSink::Take(std::string* out) {
  out->clear();
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return !buffer_.empty() || finished_; });
  if (buffer_.empty()) return false;
  out->swap(buffer_);
  wake_deferred_ = false;
  cv_.notify_all();  // a producer may be waiting for room
  return true;
}

void SseSink::Abandon() {
  std::lock_guard<std::mutex> lock(mu_);
  abandoned_ = true;
  buffer_.clear();
  cv_.notify_all();
}

}  // namespace thermocline::server
