// Helpers shared by the tests: where the test models are, a skip that ctest reports as skipped.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <system_error>

namespace thermocline::testing {

// THERMOCLINE_TEST_MODELS, else ../shared/models beside the source tree.
inline std::string TestModelsDir() {
  if (const char* env = std::getenv("THERMOCLINE_TEST_MODELS"); env != nullptr && *env != '\0') {
    return env;
  }
  return std::string(THERMOCLINE_SOURCE_DIR) + "/../shared/models";
}

inline std::string TestModelPath(const std::string& name) { return TestModelsDir() + "/" + name; }

// A scratch directory of this test process, made new (mkdtemp) and removed when it exits. Named
// after the pid, a directory left by an earlier process with the same pid handed its registry to
// this one's daemons, whose model list was then not empty.
inline std::filesystem::path TempDir() {
  struct Dir {
    std::filesystem::path path;
    Dir() {
      std::string name =
          (std::filesystem::temp_directory_path() / "thermocline-test-XXXXXX").string();
      if (::mkdtemp(name.data()) == nullptr) {
        std::perror("thermocline tests: mkdtemp");
        std::abort();
      }
      path = name;
    }
    ~Dir() {
      std::error_code ignored;
      std::filesystem::remove_all(path, ignored);
    }
  };
  static const Dir dir;
  return dir.path;
}

// The binary under test; THERMOCLINE_TEST_BINARY runs the daemon tests against another build
// (e.g. an older one, to see a regression test fail without its fix).
inline std::string ThermoclineBinary() {
  if (const char* env = std::getenv("THERMOCLINE_TEST_BINARY"); env != nullptr && *env != '\0') {
    return env;
  }
  return THERMOCLINE_BINARY;
}

// Output and exit code of the `thermocline` binary run with `args` (stdout and stderr merged).
struct CliResult {
  int exit_code;
  std::string out;
};

inline CliResult RunThermocline(const std::string& args) {
  const std::string cmd = ThermoclineBinary() + " " + args + " 2>&1";
  FILE* pipe = popen(cmd.c_str(), "r");
  REQUIRE(pipe != nullptr);
  CliResult r;
  std::array<char, 4096> buf;
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), pipe)) > 0) r.out.append(buf.data(), n);
  const int status = pclose(pipe);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

}  // namespace thermocline::testing

// Marks the running test as skipped: ctest matches "SKIPPED:" (SKIP_REGULAR_EXPRESSION) and
// reports the test as skipped, not passed.
#define THERMOCLINE_SKIP(reason)                               \
  do {                                                         \
    std::printf("SKIPPED: %s\n", std::string(reason).c_str()); \
    std::fflush(stdout);                                       \
    return;                                                    \
  } while (0)
