#include "server/daemon.h"

#include <pthread.h>
#include <signal.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <memory>
#include <mutex>
#include <thread>

#include "engine/gguf/mapping_guard.h"
#include "server/grpc_front_end.h"
#include "server/http_server.h"
#include "server/metrics.h"
#include "server/model_manager.h"
#include "server/model_registry.h"
#include "server/registry_store.h"
#include "server/scheduler.h"
#include "spdlog/spdlog.h"

namespace thermocline::server {
namespace {

// A one-shot event with a timed wait.
class Event {
 public:
  void Set() {
    std::lock_guard<std::mutex> lock(mu_);
    set_ = true;
    cv_.notify_all();
  }
  bool WaitFor(std::chrono::milliseconds d) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, d, [&] { return set_; });
  }
  bool is_set() {
    std::lock_guard<std::mutex> lock(mu_);
    return set_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool set_ = false;
};

}  // namespace

absl::Status RunDaemon(const ServerConfig& config) {
  // Signals are taken by one thread with sigtimedwait; every other thread (created below)
  // inherits the blocked mask. SIGPIPE is ignored: a vanished client is a failed write.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  signal(SIGPIPE, SIG_IGN);
  // A model file truncated while it is served must not take the daemon down (SIGBUS on its
  // mapping): the faulting request fails and the model is unloaded instead.
  InstallMappingFaultHandler();

  Metrics metrics;
  RegistryOptions registry_options;
  registry_options.memory_budget = config.model_memory_budget;
  registry_options.max_batch = config.max_batch;
  registry_options.build_threads = config.threads_per_slot;
  registry_options.max_context = config.max_context;
  if (config.load_delay_ms > 0) {
    registry_options.before_load = [&config](const ModelConfig& m) {
      if (config.load_delay_model.empty() || config.load_delay_model == m.name) {
        std::this_thread::sleep_for(std::chrono::milliseconds(config.load_delay_ms));
      }
    };
  }
  ModelRegistry registry(config.models, registry_options);
  Scheduler scheduler(config, &metrics);
  // Unloaded models leave the idle slots at once (their memory is freed unless a request holds
  // them); busy slots let go after their job.
  registry.set_unload_listener([&scheduler] { scheduler.ReleaseUnloaded(); });
  HttpFrontEnd http(config, &registry, &metrics);
  // Registered models (state directory): restored before the front end listens. Without a
  // usable state directory the daemon still serves its configured models.
  std::unique_ptr<ModelManager> manager;
  if (config.state_dir.empty()) {
    spdlog::warn(
        "no state directory (neither HOME nor XDG_STATE_HOME is set): the admin API is "
        "off; set --state-dir");
  } else if (auto store = RegistryStore::Open(config.state_dir); !store.ok()) {
    spdlog::warn("the admin API is off: {}", std::string(store.status().message()));
  } else {
    manager = std::make_unique<ModelManager>(config, &registry, std::move(*store));
    if (absl::Status s = manager->Start(); !s.ok()) {
      spdlog::warn("the admin API is off: {}", std::string(s.message()));
      manager.reset();
    }
  }
  if (manager != nullptr) http.SetAdmin(manager.get());
  auto port = http.Bind();
  if (!port.ok()) return port.status();
  std::printf("thermocline: listening on http://%s:%d\n", config.host.c_str(), *port);
  std::fflush(stdout);
  spdlog::info("listening on http://{}:{} ({} slot(s) x {} thread(s), queue {})", config.host,
               *port, config.slots, config.threads_per_slot, config.queue);
  std::unique_ptr<GrpcFrontEnd> grpc;
  if (config.grpc_port >= 0) {
    grpc = std::make_unique<GrpcFrontEnd>(config, &registry, manager.get(), &metrics);
    auto grpc_port = grpc->Start();
    if (!grpc_port.ok()) return grpc_port.status();
    std::printf("thermocline: grpc listening on %s:%d\n", config.host.c_str(), *grpc_port);
    std::fflush(stdout);
    spdlog::info("grpc listening on {}:{}", config.host, *grpc_port);
  }

  Event stop, listen_done;
  absl::Status failure;
  std::mutex failure_mu;
  auto fail = [&](absl::Status s) {
    {
      std::lock_guard<std::mutex> lock(failure_mu);
      if (failure.ok()) failure = std::move(s);
    }
    stop.Set();
  };

  std::thread loader([&] {
    absl::Status s = registry.LoadAll();
    if (s.ok()) s = scheduler.Start(registry);
    if (!s.ok()) {
      spdlog::error("{}", std::string(s.message()));
      return fail(s);
    }
    http.SetScheduler(&scheduler);
    if (grpc) grpc->SetScheduler(&scheduler);
    spdlog::info("ready");
  });

  std::thread signal_thread([&] {
    const timespec poll = {0, 100 * 1000 * 1000};
    while (!stop.is_set() && !listen_done.is_set()) {
      const int sig = sigtimedwait(&signals, nullptr, &poll);
      if (sig == SIGINT || sig == SIGTERM) {
        spdlog::info("{}: stopping (in-flight requests get {} s to finish)",
                     sig == SIGINT ? "SIGINT" : "SIGTERM", config.shutdown_timeout_s);
        stop.Set();
      }
    }
  });

  // Stops the front end once asked; after the grace period cancels whatever still runs.
  std::thread stopper([&] {
    while (!stop.WaitFor(std::chrono::milliseconds(200))) {
      if (listen_done.is_set()) return;
    }
    http.SetDraining();
    if (grpc) grpc->SetDraining();
    // stop() is a no-op until the listener runs (a model can fail before): repeat it.
    const auto grace_end =
        std::chrono::steady_clock::now() + std::chrono::seconds(config.shutdown_timeout_s);
    do {
      http.Stop();
      if (listen_done.WaitFor(std::chrono::milliseconds(100))) return;
    } while (std::chrono::steady_clock::now() < grace_end);
    spdlog::warn("grace period over: cancelling the requests still running");
    do {
      scheduler.CancelAll(CancelReason::kShutdown);
    } while (!listen_done.WaitFor(std::chrono::milliseconds(500)));
  });

  // gRPC calls in flight get the same grace period, then are cancelled.
  std::thread grpc_stopper([&] {
    if (!grpc) return;
    while (!stop.WaitFor(std::chrono::milliseconds(200))) {
    }
    grpc->Shutdown(std::chrono::steady_clock::now() +
                   std::chrono::seconds(config.shutdown_timeout_s));
  });

  http.Listen();
  listen_done.Set();
  stop.Set();
  stopper.join();
  grpc_stopper.join();
  signal_thread.join();
  loader.join();
  if (manager != nullptr) manager->Stop();  // running jobs stay resumable
  registry.StopIdleUnloader();              // its unload listener calls the scheduler
  scheduler.Shutdown();
  spdlog::info("stopped");
  std::lock_guard<std::mutex> lock(failure_mu);
  return failure;
}

}  // namespace thermocline::server
