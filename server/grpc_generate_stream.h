// The gRPC adapter of a generation job: a server-streaming reactor (callback API) that is also the
// job's GenerationSink. Each delta is appended to a pending GenerateResponse; while a write is on
// the wire, later tokens accumulate in it and go out together, so the slot thread never waits on
// the network and two reused messages carry the whole stream (no allocation per token once their
// buffers have grown). The last message carries the stop reason, usage and timings. A client that
// cancels, or whose deadline passes, cancels the job at once (OnCancel): the decode loop stops
// after its current token and the slot is free.
#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <string>

#include "server/grpc_common.h"
#include "server/job.h"
#include "server/scheduler.h"
#include "thermocline/v1/inference.pb.h"

namespace thermocline::server {

class GenerateStream final : public grpc::ServerWriteReactor<thermocline::v1::GenerateResponse> {
 public:
  // `job` is complete but for its sink, which this makes; Start submits it. The stream counts
  // itself in shared->active_streams while it lives, and shared->draining (the server is
  // stopping) tells a shutdown's cancellation from the client's. `call_deadline` is the call's own
  // deadline (Clock::time_point::max() when it has none).
  GenerateStream(grpc::CallbackServerContext* context, std::shared_ptr<Job> job,
                 const Tokenizer* tokenizer, GrpcShared* shared, Clock::time_point call_deadline,
                 bool access_log);
  // Submits the job to `scheduler`; on refusal finishes the call with the mapped status. Call once,
  // from the method handler, before returning this reactor.
  void Start(Scheduler* scheduler);

  void OnWriteDone(bool ok) override;
  void OnCancel() override;
  void OnDone() override;

 private:
  class Sink;
  // GenerationSink calls, forwarded by Sink (from the slot thread, or the cancelling thread).
  bool OnDelta(std::string_view text, absl::Span<const TokenLogprobs> logprobs);
  void OnFinish(StopReason reason, CancelReason cancel, const GenerationStats& stats,
                const absl::Status& error);
  // With mu_ held: moves pending_ to in_flight_ when nothing is on the wire and there is something
  // to send; true when the caller must StartWrite(&in_flight_) (after unlocking).
  bool TakeWriteLocked();
  // Finishes the call once (after the last write).
  void FinishOnce(const grpc::Status& status);
  // Why the call is gone (cancelled, or a write failed): the server is shutting down, the
  // job's deadline has passed (within the clocks' slack), or else the client left.
  CancelReason WhyGone() const;

  grpc::CallbackServerContext* const context_;
  std::shared_ptr<Job> job_;
  const Tokenizer* const tokenizer_;
  GrpcShared* const shared_;
  // The job's deadline is the call's (not the server's request_timeout_s): once it passes the
  // client has given up, and the call ends DEADLINE_EXCEEDED rather than with a last message.
  const bool deadline_is_call_;
  const bool logprobs_;
  const bool access_log_;
  Scheduler* scheduler_ = nullptr;

  std::mutex mu_;
  thermocline::v1::GenerateResponse pending_;    // being filled by the slot
  thermocline::v1::GenerateResponse in_flight_;  // on the wire
  bool has_pending_ = false;
  bool writing_ = false;
  bool job_done_ = false;   // OnFinish came: pending_ holds the last message (if any)
  bool call_gone_ = false;  // cancelled, or a write failed: nothing more goes out
  bool finish_called_ = false;
  grpc::Status final_status_;
  GenerationStats stats_;
};

}  // namespace thermocline::server
