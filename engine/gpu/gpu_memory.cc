// MemoryBudget: the cap's bookkeeping.
#include "engine/gpu/gpu_memory.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace thermocline::gpu {

uint64_t MemoryBudget::Rounded(uint64_t bytes) {
  if (bytes > kUnlimited - kGranularity) return kUnlimited;
  return (bytes + kGranularity - 1) / kGranularity * kGranularity;
}

absl::Status MemoryBudget::Reserve(uint64_t bytes, std::string_view what) {
  const uint64_t need = Rounded(bytes);
  std::lock_guard<std::mutex> lock(mu_);
  if (need > cap_ - used_) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "GPU memory cap exceeded: ", std::string(what), " needs ", need, " bytes but only ",
        cap_ - used_, " of the cap's ", cap_, " bytes are left (", used_,
        " in use); raise --gpu-memory or place fewer neurons/layers on the GPU"));
  }
  used_ += need;
  peak_ = std::max(peak_, used_);
  return absl::OkStatus();
}

void MemoryBudget::Release(uint64_t bytes) {
  const uint64_t n = Rounded(bytes);
  std::lock_guard<std::mutex> lock(mu_);
  used_ -= std::min(used_, n);
}

uint64_t MemoryBudget::used() const {
  std::lock_guard<std::mutex> lock(mu_);
  return used_;
}

uint64_t MemoryBudget::peak() const {
  std::lock_guard<std::mutex> lock(mu_);
  return peak_;
}

uint64_t MemoryBudget::available() const {
  std::lock_guard<std::mutex> lock(mu_);
  return cap_ - used_;
}

}  // namespace thermocline::gpu
