#include "engine/util/byte_size.h"

#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace thermocline {

absl::StatusOr<int64_t> ParseByteSize(std::string_view text) {
  const std::string original(text);
  std::string s = absl::AsciiStrToLower(original);
  for (const char* suffix : {"ib", "b"}) {
    if (s.size() > 2 && absl::EndsWith(s, suffix)) s.resize(s.size() - std::string(suffix).size());
  }
  double mult = 1;
  if (!s.empty()) {
    switch (s.back()) {
      case 'k':
        mult = 1024.0;
        break;
      case 'm':
        mult = 1024.0 * 1024;
        break;
      case 'g':
        mult = 1024.0 * 1024 * 1024;
        break;
      case 't':
        mult = 1024.0 * 1024 * 1024 * 1024;
        break;
      default:
        break;
    }
    if (mult != 1) s.pop_back();
  }
  double n;
  if (!absl::SimpleAtod(s, &n) || n < 0 || n * mult > 9.0e18) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", original, "' is not a byte count (e.g. 4G, 512M, 1000000)"));
  }
  return static_cast<int64_t>(n * mult);
}

}  // namespace thermocline
