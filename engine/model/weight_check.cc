#include "engine/model/weight_check.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/ops/kernels.h"

namespace thermocline {

absl::Status CheckWeightsFinite(const GgufFile& file) {
  std::vector<float> row;
  for (const GgufTensorInfo& t : file.tensors()) {
    const TypeKernels* k = KernelsFor(t.type);
    if (k == nullptr || k->to_float == nullptr || t.dims.empty() || t.dims[0] <= 0 ||
        t.data == nullptr) {
      continue;
    }
    const int64_t n = t.dims[0];
    if (n % TypeInfo(t.type).block_size != 0) continue;  // the loader's to refuse
    const int64_t rows = t.n_elements / n;
    const size_t row_bytes = RowBytes(t.type, n);
    if (rows <= 0 || static_cast<uint64_t>(rows) * row_bytes > t.size_bytes) continue;
    row.resize(static_cast<size_t>(n));
    const int64_t checked = rows <= kFullCheckRows ? rows : kSampledRows;
    for (int64_t i = 0; i < checked; ++i) {
      // Evenly spread, the first and the last row included.
      const int64_t r = checked == rows ? i : i * (rows - 1) / (checked - 1);
      k->to_float(t.data + static_cast<size_t>(r) * row_bytes, row.data(), n);
      const auto bad =
          std::find_if(row.begin(), row.end(), [](float v) { return !std::isfinite(v); });
      if (bad != row.end()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "tensor '", t.name, "' holds ", std::isnan(*bad) ? "NaN" : "an infinite value",
            " (row ", r, ", column ", bad - row.begin(),
            "): the file is damaged or was converted wrongly; convert or download it again"));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace thermocline
