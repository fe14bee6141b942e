// DeviceArena: budget first, then cudaMalloc.
#include "engine/cuda/device_arena.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/cuda/cuda_common.h"

namespace thermocline::cuda {

DeviceArena::~DeviceArena() {
  for (const auto& [ptr, bytes] : blocks_) {
    cudaFree(ptr);
    budget_->Release(bytes);
  }
}

absl::StatusOr<void*> DeviceArena::Allocate(uint64_t bytes, std::string_view what) {
  const uint64_t size = bytes == 0 ? 1 : bytes;  // a valid, distinct pointer even for 0
  TC_RETURN_IF_ERROR(budget_->Reserve(size, what));
  void* ptr = nullptr;
  if (cudaError_t e = cudaMalloc(&ptr, size); e != cudaSuccess) {
    budget_->Release(size);
    return CudaStatus(e, absl::StrCat("cudaMalloc of ", size, " bytes for ", std::string(what)));
  }
  blocks_.emplace_back(ptr, size);
  bytes_ += gpu::MemoryBudget::Rounded(size);
  return ptr;
}

absl::StatusOr<void*> DeviceArena::Upload(const void* host, uint64_t bytes, std::string_view what) {
  absl::StatusOr<void*> p = Allocate(bytes, what);
  if (!p.ok()) return p.status();
  if (bytes > 0 && stream_ != nullptr) {
    TC_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(*p, host, bytes, cudaMemcpyHostToDevice, stream_),
                            absl::StrCat("upload of ", std::string(what)));
    TC_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_),
                            absl::StrCat("upload of ", std::string(what)));
  } else if (bytes > 0) {
    TC_CUDA_RETURN_IF_ERROR(cudaMemcpy(*p, host, bytes, cudaMemcpyHostToDevice),
                            absl::StrCat("upload of ", std::string(what)));
  }
  return p;
}

absl::StatusOr<DevMatrix> UploadRows(DeviceArena& arena, const WeightView& w,
                                     absl::Span<const int32_t> table, std::string_view what) {
  absl::StatusOr<KType> t = KernelType(w);
  if (!t.ok()) return t.status();
  // The device copy is contiguous even when the view is strided (e.g. interleaved gate/up).
  const size_t row_bytes = RowBytes(w.type, w.cols);
  DevMatrix m{*t, table.empty() ? w.rows : static_cast<int64_t>(table.size()), w.cols, nullptr,
              row_bytes};
  std::vector<uint8_t> gathered;
  const void* src = w.data;
  if (!table.empty() || w.row_bytes != row_bytes) {
    gathered.resize(m.rows * row_bytes);
    for (int64_t k = 0; k < m.rows; ++k) {
      const int64_t r = table.empty() ? k : table[k];
      if (r < 0 || r >= w.rows) {
        return absl::InvalidArgumentError(
            absl::StrCat("table entry ", r, " is not a row of ", std::string(what)));
      }
      std::copy_n(w.row(r), row_bytes, gathered.data() + k * row_bytes);
    }
    src = gathered.data();
  }
  absl::StatusOr<void*> p = arena.Upload(src, m.rows * row_bytes, what);
  if (!p.ok()) return p.status();
  m.data = static_cast<const uint8_t*>(*p);
  return m;
}

}  // namespace thermocline::cuda
