// Byte counts as people write them: 1000000, 512M, 4G, 1.5GiB (binary multiples).
#pragma once

#include <cstdint>
#include <string_view>

#include "absl/status/statusor.h"

namespace thermocline {

// InvalidArgument (naming the text) when it is not a byte count.
absl::StatusOr<int64_t> ParseByteSize(std::string_view text);

}  // namespace thermocline
