// A model file that shrinks under its mapping (engine/gguf/mapping_guard.h), a FIFO in a model's
// place, and the finite-weights check at load (engine/model/weight_check.h).
#include "engine/gguf/mapping_guard.h"

#include <sys/stat.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <tuple>
#include <vector>

#include "engine/gguf/gguf.h"
#include "engine/model/weight_check.h"
#include "engine/ops/kernels.h"
#include "test_util.h"

namespace thermocline {
namespace {

namespace fs = std::filesystem;

// A GGUF with one F32 tensor "w" of `rows` rows of 256 values, all `fill`.
std::string WriteModel(const std::string& name, int64_t rows, float fill) {
  GgufWriter w;
  w.SetString("general.architecture", "llama");
  std::vector<float> values(static_cast<size_t>(rows) * 256, fill);
  std::vector<uint8_t> bytes(values.size() * 4);
  std::memcpy(bytes.data(), values.data(), bytes.size());
  REQUIRE(w.AddTensorCopy("w", GgmlType::kF32, {256, rows}, std::move(bytes)).ok());
  const std::string path = (testing::TempDir() / name).string();
  REQUIRE(w.Write(path).ok());
  return path;
}

TEST_CASE("a mapping truncated under its reader faults into zeros, not SIGBUS", "[gguf]") {
  InstallMappingFaultHandler();
  const std::string path = WriteModel("shrinking.gguf", 512, 1.5f);  // 512 KiB of weights
  auto file = GgufFile::Open(path);
  REQUIRE(file.ok());
  const GgufTensorInfo* t = (*file)->FindTensor("w");
  REQUIRE(t != nullptr);
  const auto* values = reinterpret_cast<const volatile float*>(t->data);
  const int64_t n = t->n_elements;
  CHECK(values[n - 1] == 1.5f);
  CHECK_FALSE((*file)->faulted());
  fs::resize_file(path, 4096);
  // Past the new end: without the handler this read ends the process.
  CHECK(values[n - 1] == 0.0f);
  CHECK((*file)->faulted());
  CHECK(values[n / 2] == 0.0f);
  // The stamp tells the change apart.
  auto now = GgufFileStamp::Of(path);
  REQUIRE(now.ok());
  CHECK_FALSE(*now == (*file)->stamp());
  CHECK(now->size == 4096);
}

TEST_CASE("a FIFO is refused without being opened", "[gguf]") {
  const std::string fifo = (testing::TempDir() / "fifo.gguf").string();
  REQUIRE(::mkfifo(fifo.c_str(), 0644) == 0);
  const auto start = std::chrono::steady_clock::now();
  auto file = GgufFile::Open(fifo);  // an open() without O_NONBLOCK would wait for a writer
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(1));
  REQUIRE_FALSE(file.ok());
  CHECK(file.status().message().find("not a regular file") != std::string_view::npos);
}

TEST_CASE("non-finite weights are found by the sample and named", "[gguf][model]") {
  {
    auto file = GgufFile::Open(WriteModel("finite.gguf", 1000, 0.25f));
    REQUIRE(file.ok());
    CHECK(CheckWeightsFinite(**file).ok());
  }
  // NaN in the last row (always sampled), Inf in a small tensor (read whole).
  for (const auto& [rows, row, bad] :
       {std::tuple<int64_t, int64_t, float>{1000, 999, std::numeric_limits<float>::quiet_NaN()},
        {40, 17, std::numeric_limits<float>::infinity()}}) {
    const std::string path = WriteModel("bad.gguf", rows, 0.25f);
    {
      auto clean = GgufFile::Open(path);
      REQUIRE(clean.ok());
      const GgufTensorInfo* t = (*clean)->FindTensor("w");
      const uint64_t offset = (*clean)->data_offset() + t->offset + (row * 256 + 3) * 4;
      std::FILE* f = std::fopen(path.c_str(), "r+b");
      REQUIRE(f != nullptr);
      std::fseek(f, static_cast<long>(offset), SEEK_SET);
      std::fwrite(&bad, 4, 1, f);
      std::fclose(f);
    }
    auto file = GgufFile::Open(path);
    REQUIRE(file.ok());
    const absl::Status s = CheckWeightsFinite(**file);
    INFO(s.message());
    CHECK(absl::IsInvalidArgument(s));
    CHECK(s.message().find("tensor 'w'") != std::string_view::npos);
    CHECK(s.message().find("row " + std::to_string(row)) != std::string_view::npos);
  }
}

}  // namespace
}  // namespace thermocline
