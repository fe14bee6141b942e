// Starts `thermocline serve` as a child process on an ephemeral loopback port with a config
// written for the test, waits until /health says ok, and stops it (SIGTERM) at the end. Also
// the strict SSE parser the stream tests use.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "http_client.h"
#include "test_util.h"

namespace thermocline::testing {

inline std::string StoriesModel() { return TestModelPath("stories260K.gguf"); }
inline bool HaveStoriesModel() { return std::filesystem::exists(StoriesModel()); }
constexpr char kModelName[] = "stories";

class DaemonProcess {
 public:
  // `toml` is appended to a config that serves the stories model as "stories" on port 0.
  // `max_file_bytes` > 0 limits the size of every file the daemon writes (RLIMIT_FSIZE): a full
  // disk, as the daemon sees it.
  explicit DaemonProcess(const std::string& toml = "", bool wait_ready = true,
                         long max_file_bytes = 0) {
    static int counter = 0;
    const std::string base = (TempDir() / ("daemon" + std::to_string(counter++))).string();
    config_path_ = base + ".toml";
    log_path_ = base + ".log";
    // Each daemon gets its own registry unless the test names a state directory. Its jobs skip
    // the speed check, so that a registered model is served sparse whatever this machine's
    // speed (registry_test checks the speed check itself).
    const std::string registry =
        toml.find("[registry]") == std::string::npos
            ? "[registry]\nstate_dir = \"" + base + ".state\"\nspeed_check = false\n\n"
            : "";
    std::ofstream(config_path_) << "[[models]]\npath = \"" << StoriesModel() << "\"\nname = \""
                                << kModelName << "\"\n\n"
                                << registry << toml << "\n";
    int out[2];
    REQUIRE(::pipe(out) == 0);
    pid_ = ::fork();
    REQUIRE(pid_ >= 0);
    if (pid_ == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive a crashed test
      ::dup2(out[1], 1);
      const int log = ::open(log_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      ::dup2(log, 2);
      ::close(out[0]);
      if (max_file_bytes > 0) {
        ::signal(SIGXFSZ, SIG_IGN);  // a write past the limit fails with EFBIG instead
        const rlimit limit{static_cast<rlim_t>(max_file_bytes),
                           static_cast<rlim_t>(max_file_bytes)};
        ::setrlimit(RLIMIT_FSIZE, &limit);
      }
      const std::string bin = ThermoclineBinary();
      // One thread per slot: the tiny test model is fastest so, and CI runs tests in parallel.
      // gRPC on a free port too: a fixed one would collide between tests running in parallel.
      ::execl(bin.c_str(), bin.c_str(), "serve", "--config", config_path_.c_str(), "--port", "0",
              "--grpc-port", "0", "--threads", "1", static_cast<char*>(nullptr));
      ::_exit(127);
    }
    ::close(out[1]);
    stdout_fd_ = out[0];
    port_ = ReadPort();
    if (wait_ready) WaitReady();
  }

  ~DaemonProcess() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    if (stdout_fd_ >= 0) ::close(stdout_fd_);
  }

  int port() const { return port_; }
  pid_t pid() const { return pid_; }
  int grpc_port() const { return grpc_port_; }
  const std::string& log_path() const { return log_path_; }
  std::string Log() const {
    std::ifstream in(log_path_);
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }

  // Sends `sig` and returns the exit status (-1 when killed by a signal or timed out).
  int Stop(int sig = SIGTERM, double timeout_s = 20) {
    Signal(sig);
    return Wait(timeout_s);
  }
  void Signal(int sig) { ::kill(pid_, sig); }
  int Wait(double timeout_s = 20) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
    int status = 0;
    while (std::chrono::steady_clock::now() < end) {
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return -1;
  }

  void WaitReady() {
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (std::chrono::steady_clock::now() < end) {
      try {
        if (Http(port_, "GET", "/health").status == 200) return;
      } catch (const std::exception&) {
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    FAIL("the daemon did not become healthy; log:\n" << Log());
  }

 private:
  int ReadPort() {
    std::string text;
    const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    // Both lines: "listening on http://HOST:PORT", then "grpc listening on HOST:PORT".
    const std::string grpc_marker = "grpc listening on 127.0.0.1:";
    auto complete = [&] {
      const size_t g = text.find(grpc_marker);
      return g != std::string::npos && text.find('\n', g) != std::string::npos;
    };
    while (!complete() && std::chrono::steady_clock::now() < end) {
      pollfd p{stdout_fd_, POLLIN, 0};
      if (::poll(&p, 1, 100) <= 0) continue;
      char buf[256];
      const ssize_t n = ::read(stdout_fd_, buf, sizeof(buf));
      if (n <= 0) break;
      text.append(buf, static_cast<size_t>(n));
    }
    const std::string marker = "listening on http://127.0.0.1:";
    const size_t pos = text.find(marker);
    INFO("stdout: " << text << "\nlog:\n" << Log());
    REQUIRE(pos != std::string::npos);
    REQUIRE(complete());
    grpc_port_ = std::stoi(text.substr(text.find(grpc_marker) + grpc_marker.size()));
    return std::stoi(text.substr(pos + marker.size()));
  }

  pid_t pid_ = -1;
  int stdout_fd_ = -1;
  int port_ = 0;
  int grpc_port_ = 0;
  std::string config_path_, log_path_;
};

// Parses an SSE body strictly: only `data: <payload>\n\n` events, nothing else. Throws
// std::runtime_error otherwise (no Catch2 macros: threads may call it).
inline std::vector<std::string> ParseSseOrThrow(const std::string& body) {
  std::vector<std::string> events;
  size_t pos = 0;
  while (pos < body.size()) {
    const size_t end = body.find("\n\n", pos);
    if (body.compare(pos, 6, "data: ") != 0 || end == std::string::npos ||
        body.find('\n', pos) != end) {
      throw std::runtime_error("bad SSE framing at byte " + std::to_string(pos) + " of: " + body);
    }
    events.push_back(body.substr(pos + 6, end - pos - 6));
    pos = end + 2;
  }
  return events;
}

inline std::vector<std::string> ParseSse(const std::string& body) {
  std::vector<std::string> events;
  std::string error;
  try {
    events = ParseSseOrThrow(body);
  } catch (const std::runtime_error& e) {
    error = e.what();
  }
  INFO(error);
  REQUIRE(error.empty());
  return events;
}

inline nlohmann::json Json(const std::string& text) {
  INFO("not JSON: " << text);
  nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  REQUIRE(!j.is_discarded());
  return j;
}

inline std::string Post(const nlohmann::json& body) { return body.dump(); }

// Reads a metric's value from /metrics text (the first line starting with `series`).
inline double MetricValue(const std::string& metrics, const std::string& series) {
  size_t pos = 0;
  while ((pos = metrics.find(series + " ", pos)) != std::string::npos) {
    if (pos == 0 || metrics[pos - 1] == '\n') {
      return std::stod(metrics.substr(pos + series.size() + 1));
    }
    pos += series.size();
  }
  return -1;
}

}  // namespace thermocline::testing

#define REQUIRE_STORIES_MODEL()                                                     \
  do {                                                                              \
    if (!thermocline::testing::HaveStoriesModel()) {                                \
      THERMOCLINE_SKIP("no test model at " + thermocline::testing::StoriesModel()); \
    }                                                                               \
  } while (0)
