#include "server/grpc_health_service.h"

namespace thermocline::server {
namespace {

namespace health = grpc::health::v1;
using ServingStatus = health::HealthCheckResponse::ServingStatus;

bool KnownService(const std::string& service) {
  return service.empty() || service == "thermocline.v1.Inference" ||
         service == "thermocline.v1.Admin" || service == "grpc.health.v1.Health";
}

}  // namespace

// One Watch call: at most one write in flight; a newer status waits for it.
class HealthService::Watcher final : public grpc::ServerWriteReactor<health::HealthCheckResponse> {
 public:
  Watcher(HealthService* service, std::string name) : service_(service), name_(std::move(name)) {}

  // Sends `now` unless it is the status last sent; ends the call after NOT_SERVING once the
  // server is stopping.
  void Update(ServingStatus now) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (finished_ || cancelled_) return;
      wanted_ = now;
      if (writing_ || (sent_any_ && sent_ == wanted_)) return;
      writing_ = true;
      sent_ = wanted_;
      sent_any_ = true;
      message_.set_status(sent_);
    }
    StartWrite(&message_);  // outside the lock: its completion may run on this thread
  }

  void OnWriteDone(bool ok) override {
    grpc::Status status = grpc::Status::OK;
    bool finish = false;
    ServingStatus wanted;
    {
      std::lock_guard<std::mutex> lock(mu_);
      writing_ = false;
      if (finished_) return;
      const bool stopped =
          service_->shared_->draining.load() && sent_ != health::HealthCheckResponse::SERVING;
      if (!ok || cancelled_ || stopped) {
        finish = finished_ = true;
        if (cancelled_ || !ok) status = grpc::Status::CANCELLED;
      }
      wanted = wanted_;
    }
    if (finish) return Finish(status);
    Update(wanted);
  }

  // A write in flight finishes the call when it completes (Finish once, never beside a write).
  void OnCancel() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      cancelled_ = true;
      if (finished_ || writing_) return;
      finished_ = true;
    }
    Finish(grpc::Status::CANCELLED);
  }

  void OnDone() override {
    service_->Remove(this);
    delete this;
  }

  const std::string& name() const { return name_; }

 private:
  HealthService* const service_;
  const std::string name_;
  std::mutex mu_;
  health::HealthCheckResponse message_;
  ServingStatus wanted_ = health::HealthCheckResponse::UNKNOWN;
  ServingStatus sent_ = health::HealthCheckResponse::UNKNOWN;
  bool sent_any_ = false;
  bool writing_ = false;
  bool cancelled_ = false;
  bool finished_ = false;  // Finish was called (once)
};

ServingStatus HealthService::StatusOf(const std::string& service) const {
  if (!KnownService(service)) return health::HealthCheckResponse::SERVICE_UNKNOWN;
  return shared_->serving() ? health::HealthCheckResponse::SERVING
                            : health::HealthCheckResponse::NOT_SERVING;
}

grpc::ServerUnaryReactor* HealthService::Check(grpc::CallbackServerContext* context,
                                               const health::HealthCheckRequest* request,
                                               health::HealthCheckResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  const std::string& service = request->service();
  if (!KnownService(service)) {
    reactor->Finish(grpc::Status(grpc::StatusCode::NOT_FOUND,
                                 "unknown service '" + service +
                                     "': ask for \"\" (the server) or thermocline.v1.Inference"));
    return reactor;
  }
  response->set_status(StatusOf(service));
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerWriteReactor<health::HealthCheckResponse>* HealthService::Watch(
    grpc::CallbackServerContext* context, const health::HealthCheckRequest* request) {
  auto* w = new Watcher(this, request->service());
  {
    std::lock_guard<std::mutex> lock(mu_);
    watchers_.insert(w);
  }
  w->Update(StatusOf(w->name()));
  return w;
}

void HealthService::Notify() {
  std::lock_guard<std::mutex> lock(mu_);
  for (Watcher* w : watchers_) w->Update(StatusOf(w->name()));
}

void HealthService::Remove(Watcher* w) {
  std::lock_guard<std::mutex> lock(mu_);
  watchers_.erase(w);
}

}  // namespace thermocline::server
