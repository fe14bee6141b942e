// DeviceArena: the only way engine/cuda/ allocates device memory. Every allocation is reserved
// against a MemoryBudget first (engine/gpu/gpu_memory.h), so passing the cap fails with a clear
// error before cudaMalloc is called. An arena frees everything it allocated when destroyed.
// Allocation happens at load time only, never per token. Not thread-safe.
#pragma once

#include <cstdint>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/cuda/cuda_kernels.h"
#include "engine/gpu/gpu_memory.h"
#include "engine/ops/matmul.h"

namespace thermocline::cuda {

class DeviceArena {
 public:
  explicit DeviceArena(gpu::MemoryBudget* budget) : budget_(budget) {}
  ~DeviceArena();
  DeviceArena(const DeviceArena&) = delete;
  DeviceArena& operator=(const DeviceArena&) = delete;

  // bytes of device memory (256-byte aligned) for `what`, or ResourceExhaustedError (cap) /
  // InternalError (cudaMalloc failed, e.g. the device itself is full).
  absl::StatusOr<void*> Allocate(uint64_t bytes, std::string_view what);
  template <class T>
  absl::StatusOr<T*> AllocateArray(int64_t n, std::string_view what) {
    absl::StatusOr<void*> p = Allocate(static_cast<uint64_t>(n) * sizeof(T), what);
    if (!p.ok()) return p.status();
    return static_cast<T*>(*p);
  }
  // Allocates bytes and copies them from the host, on the stream that will read them (see
  // set_stream), and waits for the copy: the host buffer may go at once.
  absl::StatusOr<void*> Upload(const void* host, uint64_t bytes, std::string_view what);
  // The stream uploads are ordered on; nullptr (the default): the legacy default stream, which
  // a non-blocking stream's kernels are not ordered after.
  void set_stream(cudaStream_t stream) { stream_ = stream; }

  uint64_t bytes() const { return bytes_; }

 private:
  gpu::MemoryBudget* budget_;
  cudaStream_t stream_ = nullptr;
  std::vector<std::pair<void*, uint64_t>> blocks_;
  uint64_t bytes_ = 0;
};

// Rows table[k] of w (all rows when table is empty) gathered into a compact device copy: compact
// row k is row table[k]. InvalidArgumentError for a type without kernels or an entry out of range.
absl::StatusOr<DevMatrix> UploadRows(DeviceArena& arena, const WeightView& w,
                                     absl::Span<const int32_t> table, std::string_view what);

// A column layout's arrays copied to the device, with its grid. InvalidArgumentError for an
// empty layout or a kRows type without kernels.
absl::StatusOr<DevColumn> UploadColumn(DeviceArena& arena, const gpu::ColumnLayout& c,
                                       std::string_view what);

}  // namespace thermocline::cuda
