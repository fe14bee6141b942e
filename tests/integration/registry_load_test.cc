// The registry's loads against each other, in process: a model whose load is held (the
// RegistryOptions::before_load seam stands for a slow or stuck file) blocks no other model's
// load, no delete, unload or model list; a model deleted or unloaded while it loads drops what
// the load made and gives its memory back; two requests for a loading model share one load; under
// a budget, a load waits for the room a load in flight takes instead of overrunning it.
#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <future>
#include <mutex>
#include <string>

#include "daemon_fixture.h"
#include "server/model_registry.h"

namespace thermocline::testing {
namespace {

using server::ModelLease;
using server::ModelRegistry;
using server::ModelState;
using server::RegistryOptions;
using server::ServedModel;
using std::chrono::seconds;

// What "promptly" means here: every operation below takes milliseconds on its own (the test
// model is 1 MB); 2 s leaves room for a loaded machine, and is far below the held load.
constexpr auto kPromptly = seconds(2);
// How long a held load waits for its release at most: a failing test ends instead of hanging.
constexpr auto kHoldAtMost = seconds(30);

// Holds the loads of one model name at before_load until Release(); counts how many began.
class LoadGate {
 public:
  explicit LoadGate(std::string name) : name_(std::move(name)), released_(release_.get_future()) {}
  ~LoadGate() { Release(); }

  void Install(RegistryOptions* options) {
    options->before_load = [this](const server::ModelConfig& m) {
      if (m.name != name_) return;
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (++entered_ == 1) entered_promise_.set_value();
      }
      released_.wait_for(kHoldAtMost);
    };
  }
  // True once a held load has begun (its file is not opened yet).
  bool WaitEntered() { return entered_future_.wait_for(kHoldAtMost) == std::future_status::ready; }
  void Release() {
    std::call_once(release_once_, [&] { release_.set_value(); });
  }
  int entered() {
    std::lock_guard<std::mutex> lock(mu_);
    return entered_;
  }

 private:
  const std::string name_;
  std::promise<void> release_;
  std::shared_future<void> released_;
  std::once_flag release_once_;
  std::mutex mu_;
  int entered_ = 0;
  std::promise<void> entered_promise_;
  std::future<void> entered_future_ = entered_promise_.get_future();
};

server::ModelConfig Registered(const std::string& name) {
  server::ModelConfig c;
  c.name = name;
  c.path = StoriesModel();
  c.sparse = "off";
  return c;
}

// A registry with no configured models (so lazy loads are on) and the given registered ones.
void Start(ModelRegistry& registry, std::initializer_list<const char*> names) {
  REQUIRE(registry.LoadAll().ok());
  for (const char* name : names) REQUIRE(registry.Add(Registered(name)).ok());
}

template <typename T>
bool Prompt(std::future<T>& f) {
  return f.wait_for(kPromptly) == std::future_status::ready;
}

int64_t StoriesBytes() { return static_cast<int64_t>(std::filesystem::file_size(StoriesModel())); }

TEST_CASE("registry: a held load blocks no other model's load, delete or unload",
          "[registry][load]") {
  REQUIRE_STORIES_MODEL();
  LoadGate gate("slow");
  RegistryOptions options;
  gate.Install(&options);
  ModelRegistry registry({}, options);
  Start(registry, {"slow", "fast", "gone", "idle"});
  REQUIRE(registry.FindOrLoad("gone").ok());
  REQUIRE(registry.FindOrLoad("idle").ok());

  auto slow = std::async(std::launch::async, [&] { return registry.FindOrLoad("slow"); });
  REQUIRE(gate.WaitEntered());
  CHECK(registry.Lookup("slow")->state.load() == ModelState::kLoading);

  auto fast = std::async(std::launch::async, [&] { return registry.FindOrLoad("fast").ok(); });
  CHECK(Prompt(fast));
  auto removed = std::async(std::launch::async, [&] { return registry.Remove("gone").ok(); });
  CHECK(Prompt(removed));
  auto unloaded = std::async(std::launch::async,
                             [&] { return registry.Unload(registry.Lookup("idle"), "test"); });
  CHECK(Prompt(unloaded));
  auto listed = std::async(std::launch::async, [&] {
    registry.CheckFiles();
    return registry.models().size();
  });
  CHECK(Prompt(listed));
  // A sidecar switch of another model (dense again) too.
  auto switched =
      std::async(std::launch::async, [&] { return registry.UseSidecar("fast", "").ok(); });
  CHECK(Prompt(switched));
  CHECK(!Prompt(slow));  // still held: the checks above ran beside it

  gate.Release();
  REQUIRE(slow.wait_for(kHoldAtMost) == std::future_status::ready);
  CHECK(slow.get().ok());
  CHECK(fast.get());
  CHECK(removed.get());
  CHECK(unloaded.get());
  CHECK(listed.get() == 3);  // slow, fast, idle
  CHECK(switched.get());
  CHECK(registry.Lookup("gone") == nullptr);
  CHECK(registry.Lookup("idle")->loaded() == nullptr);
  CHECK(gate.entered() == 1);
}

TEST_CASE("registry: two requests for a loading model share its one load", "[registry][load]") {
  REQUIRE_STORIES_MODEL();
  LoadGate gate("m");
  RegistryOptions options;
  gate.Install(&options);
  ModelRegistry registry({}, options);
  Start(registry, {"m"});
  auto first = std::async(std::launch::async, [&] { return registry.FindOrLoad("m"); });
  REQUIRE(gate.WaitEntered());
  auto second = std::async(std::launch::async, [&] { return registry.FindOrLoad("m"); });
  CHECK(!Prompt(second));  // waits for the load in flight
  gate.Release();
  REQUIRE(first.wait_for(kHoldAtMost) == std::future_status::ready);
  REQUIRE(second.wait_for(kHoldAtMost) == std::future_status::ready);
  absl::StatusOr<ModelLease> a = first.get();
  absl::StatusOr<ModelLease> b = second.get();
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  CHECK(a->get() == b->get());  // one instance
  CHECK(gate.entered() == 1);   // loaded once
  CHECK(registry.resident().models.load() == 1);
}

TEST_CASE("registry: a model deleted while it loads is dropped, its memory given back",
          "[registry][load]") {
  REQUIRE_STORIES_MODEL();
  LoadGate gate("m");
  RegistryOptions options;
  options.memory_budget = StoriesBytes() * 3 / 2;  // one model fits, two do not
  gate.Install(&options);
  ModelRegistry registry({}, options);
  Start(registry, {"m"});
  auto load = std::async(std::launch::async, [&] { return registry.FindOrLoad("m"); });
  REQUIRE(gate.WaitEntered());
  auto removed = std::async(std::launch::async, [&] { return registry.Remove("m").ok(); });
  CHECK(Prompt(removed));
  gate.Release();
  REQUIRE(load.wait_for(kHoldAtMost) == std::future_status::ready);
  const absl::StatusOr<ModelLease> lease = load.get();
  INFO(lease.status().ToString());
  CHECK(absl::IsNotFound(lease.status()));
  CHECK(removed.get());
  CHECK(registry.resident().models.load() == 0);
  CHECK(registry.resident().bytes.load() == 0);
  CHECK(registry.Lookup("m") == nullptr);
  // Its reservation went with it: the next model has the budget to itself (a reservation left
  // behind would have it wait for a load that never ends).
  REQUIRE(registry.Add(Registered("next")).ok());
  auto next = std::async(std::launch::async, [&] { return registry.FindOrLoad("next").ok(); });
  REQUIRE(Prompt(next));
  CHECK(next.get());
  CHECK(registry.resident().models.load() == 1);
}

TEST_CASE("registry: a model unloaded while it loads is dropped and loads again later",
          "[registry][load]") {
  REQUIRE_STORIES_MODEL();
  LoadGate gate("m");
  RegistryOptions options;
  gate.Install(&options);
  ModelRegistry registry({}, options);
  Start(registry, {"m"});
  ServedModel* m = registry.Lookup("m");
  auto load = std::async(std::launch::async, [&] { return registry.FindOrLoad("m"); });
  REQUIRE(gate.WaitEntered());
  CHECK(registry.Unload(m, "test"));  // Ollama's keep_alive 0, while it loads
  gate.Release();
  REQUIRE(load.wait_for(kHoldAtMost) == std::future_status::ready);
  CHECK(absl::IsUnavailable(load.get().status()));
  CHECK(m->loaded() == nullptr);
  CHECK(m->state.load() == ModelState::kUnloaded);
  CHECK(registry.resident().models.load() == 0);
  CHECK(registry.resident().bytes.load() == 0);
  CHECK(registry.FindOrLoad("m").ok());  // its next request loads it
  CHECK(gate.entered() == 2);
}

TEST_CASE("registry: under a budget, a load waits for the room a load in flight takes",
          "[registry][load][budget]") {
  REQUIRE_STORIES_MODEL();
  LoadGate gate("a");
  RegistryOptions options;
  options.memory_budget = StoriesBytes() * 3 / 2;  // one model fits, two do not
  gate.Install(&options);
  ModelRegistry registry({}, options);
  Start(registry, {"a", "b"});
  auto a = std::async(std::launch::async, [&] { return registry.FindOrLoad("a"); });
  REQUIRE(gate.WaitEntered());
  auto b = std::async(std::launch::async, [&] { return registry.FindOrLoad("b"); });
  CHECK(!Prompt(b));  // a's load holds the room b needs
  gate.Release();
  REQUIRE(a.wait_for(kHoldAtMost) == std::future_status::ready);
  REQUIRE(b.wait_for(kHoldAtMost) == std::future_status::ready);
  const absl::StatusOr<ModelLease> la = a.get();
  const absl::StatusOr<ModelLease> lb = b.get();
  REQUIRE(la.ok());
  REQUIRE(lb.ok());
  // b made its room by unloading a (whose memory stays until its lease ends), once a had
  // loaded: the budget never had both loaded.
  CHECK(registry.Lookup("a")->loaded() == nullptr);
  CHECK(registry.Lookup("b")->loaded() != nullptr);
  CHECK(registry.resident().unloads.load() == 1);
}

}  // namespace
}  // namespace thermocline::testing
