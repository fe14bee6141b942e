// Helpers shared by the tests: where the test models are, a skip that ctest reports as skipped.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <catch2/catch.hpp>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
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

// A fresh scratch copy of a test model, `stem`.gguf in TempDir(), and a symbolic link to it,
// `stem`-link.gguf: for checks that write where the input is, never on the shared file.
struct ScratchCopy {
  std::filesystem::path file, link;
};
inline ScratchCopy ScratchModelCopy(const std::string& model, const std::string& stem) {
  ScratchCopy c{TempDir() / (stem + ".gguf"), TempDir() / (stem + "-link.gguf")};
  std::filesystem::remove(c.file);
  std::filesystem::remove(c.link);
  std::filesystem::copy_file(TestModelPath(model), c.file);
  std::filesystem::create_symlink(c.file, c.link);
  return c;
}

// The binary under test; THERMOCLINE_TEST_BINARY runs the daemon tests against another build
// (e.g. an older one, to see a regression test fail without its fix).
inline std::string ThermoclineBinary() {
  if (const char* env = std::getenv("THERMOCLINE_TEST_BINARY"); env != nullptr && *env != '\0') {
    return env;
  }
  return THERMOCLINE_BINARY;
}

// Output and exit code of a command (stdout and stderr merged).
struct CliResult {
  int exit_code;
  std::string out;
};

// A shell command line, run to its end.
inline CliResult RunShell(const std::string& command) {
  const std::string cmd = command + " 2>&1";
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

// The `thermocline` binary run with `args`.
inline CliResult RunThermocline(const std::string& args) {
  return RunShell(ThermoclineBinary() + " " + args);
}

// `thermocline profile` of `model` on the kit's corpus into `sidecar`, short (512 tokens, one
// epoch): enough for the SwiGLU methods' statistics (quantiles, gate scales) that the CLI tests
// plan from.
inline CliResult ProfileSwiglu(const std::string& model, const std::string& sidecar) {
  return RunThermocline("profile -m " + model + " --corpus " +
                        TestModelPath("tinystories-profile.txt") +
                        " --tokens 512 --samples 256 --epochs 1 --threads 2 -o " + sidecar);
}

// Rss in bytes of the mapping of /proc/self/smaps that contains `p`; -1 when none does.
inline int64_t MappingRss(const void* p) {
  const auto addr = reinterpret_cast<uintptr_t>(p);
  std::ifstream smaps("/proc/self/smaps");
  std::string line;
  bool inside = false;
  while (std::getline(smaps, line)) {
    unsigned long long begin = 0, end = 0;
    char dash = 0;
    std::istringstream head(line);
    if (line.find(':') > line.find(' ') && (head >> std::hex >> begin >> dash >> end) &&
        dash == '-') {
      inside = addr >= begin && addr < end;
      continue;
    }
    if (inside && line.rfind("Rss:", 0) == 0) {
      std::istringstream rss(line.substr(4));
      int64_t kb = 0;
      rss >> kb;
      return kb * 1024;
    }
  }
  return -1;
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
