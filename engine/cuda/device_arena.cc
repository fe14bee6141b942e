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

absl::StatusOr<DevColumn> UploadColumn(DeviceArena& arena, const gpu::ColumnLayout& c,
                                       std::string_view what) {
  using F = gpu::ColumnLayout::Form;
  DevColumn d;
  d.form = c.form;
  d.in = c.in;
  d.out = c.out;
  d.grid = gpu::ColumnGridOf(c);
  if (c.form == F::kNone) {
    return absl::InvalidArgumentError(absl::StrCat(std::string(what), ": no column layout"));
  }
  if (!gpu::ColumnLayoutConsistent(c)) {
    return absl::InvalidArgumentError(
        absl::StrCat(std::string(what), ": an inconsistent column layout (", c.in, " inputs, ",
                     c.out, " outputs padded to ", c.out_pad, ", ", c.row_bytes, "-byte rows)"));
  }
  if (c.form == F::kRows) {
    absl::StatusOr<DevMatrix> rows = UploadRows(arena, c.rows, {}, what);
    if (!rows.ok()) return rows.status();
    d.rows = *rows;
    return d;
  }
  d.out_pad = c.out_pad;
  d.row_bytes = c.row_bytes;
  d.offset = c.offset;
  absl::StatusOr<void*> values = arena.Upload(c.values, c.in * c.row_bytes, what);
  if (!values.ok()) return values.status();
  d.values = static_cast<const uint8_t*>(*values);
  const uint64_t scale_bytes = static_cast<uint64_t>(c.in / 32) * c.out_pad * sizeof(uint16_t);
  absl::StatusOr<void*> scales = arena.Upload(c.scales, scale_bytes, what);
  if (!scales.ok()) return scales.status();
  d.scales = static_cast<const uint16_t*>(*scales);
  if (c.mins != nullptr) {
    absl::StatusOr<void*> mins = arena.Upload(c.mins, scale_bytes, what);
    if (!mins.ok()) return mins.status();
    d.mins = static_cast<const uint16_t*>(*mins);
  }
  return d;
}

}  // namespace thermocline::cuda
