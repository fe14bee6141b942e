// Helpers shared by the tests: where the test models are, a skip that ctest reports as skipped.
#pragma once

#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

namespace thermocline::testing {

// THERMOCLINE_TEST_MODELS, else ../shared/models beside the source tree.
inline std::string TestModelsDir() {
  if (const char* env = std::getenv("THERMOCLINE_TEST_MODELS"); env != nullptr && *env != '\0') {
    return env;
  }
  return std::string(THERMOCLINE_SOURCE_DIR) + "/../shared/models";
}

inline std::string TestModelPath(const std::string& name) { return TestModelsDir() + "/" + name; }

// A scratch directory unique to this test process, removed by the OS's tmp cleaning.
inline std::filesystem::path TempDir() {
  static const std::filesystem::path dir = [] {
    std::filesystem::path p =
        std::filesystem::temp_directory_path() / ("thermocline-test-" + std::to_string(::getpid()));
    std::filesystem::create_directories(p);
    return p;
  }();
  return dir;
}

inline std::string ThermoclineBinary() { return THERMOCLINE_BINARY; }

}  // namespace thermocline::testing

// Marks the running test as skipped: ctest matches "SKIPPED:" (SKIP_REGULAR_EXPRESSION) and
// reports the test as skipped, not passed.
#define THERMOCLINE_SKIP(reason)                               \
  do {                                                         \
    std::printf("SKIPPED: %s\n", std::string(reason).c_str()); \
    std::fflush(stdout);                                       \
    return;                                                    \
  } while (0)
