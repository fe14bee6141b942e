#include "engine/model/activation.h"

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace thermocline {

const char* ActivationName(FfnActivation a) {
  switch (a) {
    case FfnActivation::kSilu:
      return "silu";
    case FfnActivation::kRelu:
      return "relu";
    case FfnActivation::kDRelu:
      return "drelu";
    case FfnActivation::kGeluTanh:
      return "gelu";
  }
  return "?";
}

absl::StatusOr<FfnActivation> ParseActivation(const std::string& name) {
  const std::string n = absl::AsciiStrToLower(name);
  if (n == "silu" || n == "swiglu" || n == "swish") return FfnActivation::kSilu;
  if (n == "relu" || n == "reglu") return FfnActivation::kRelu;
  if (n == "drelu") return FfnActivation::kDRelu;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown FFN activation '", name, "' (expected silu, relu or drelu)"));
}

}  // namespace thermocline
