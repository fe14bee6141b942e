#include "tools/args.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "engine/util/byte_size.h"

namespace thermocline::cli {

absl::StatusOr<Args> Args::Parse(int argc, char** argv, const std::set<std::string>& value_flags,
                                 const std::set<std::string>& switches,
                                 const std::map<std::string, std::string>& aliases) {
  Args args;
  for (int i = 0; i < argc; ++i) {
    std::string a = argv[i];
    if (a.size() < 2 || a[0] != '-' || a == "--") {
      args.positionals_.push_back(a);
      continue;
    }
    std::optional<std::string> inline_value;
    if (size_t eq = a.find('='); eq != std::string::npos && a.rfind("--", 0) == 0) {
      inline_value = a.substr(eq + 1);
      a = a.substr(0, eq);
    }
    if (auto it = aliases.find(a); it != aliases.end()) a = it->second;
    if (value_flags.count(a)) {
      if (inline_value) {
        args.values_[a] = *inline_value;
      } else if (i + 1 < argc) {
        args.values_[a] = argv[++i];
      } else {
        return absl::InvalidArgumentError(absl::StrCat(a, " needs a value"));
      }
    } else if (switches.count(a) && !inline_value) {
      args.switches_.insert(a);
    } else {
      return absl::InvalidArgumentError(absl::StrCat("unknown option ", a));
    }
  }
  return args;
}

std::optional<std::string> Args::Get(const std::string& flag) const {
  auto it = values_.find(flag);
  if (it == values_.end()) return std::nullopt;
  return it->second;
}

std::string Args::GetOr(const std::string& flag, const std::string& fallback) const {
  return Get(flag).value_or(fallback);
}

absl::StatusOr<int64_t> Args::GetInt(const std::string& flag, int64_t fallback) const {
  auto v = Get(flag);
  if (!v) return fallback;
  int64_t out;
  if (!absl::SimpleAtoi(*v, &out)) {
    return absl::InvalidArgumentError(absl::StrCat(flag, ": '", *v, "' is not an integer"));
  }
  return out;
}

absl::StatusOr<double> Args::GetDouble(const std::string& flag, double fallback) const {
  auto v = Get(flag);
  if (!v) return fallback;
  double out;
  if (!absl::SimpleAtod(*v, &out)) {
    return absl::InvalidArgumentError(absl::StrCat(flag, ": '", *v, "' is not a number"));
  }
  // "nan" and "inf" parse, but no option means them, and NaN slips through range checks.
  if (!std::isfinite(out)) {
    return absl::InvalidArgumentError(absl::StrCat(flag, ": '", *v, "' is not a finite number"));
  }
  return out;
}

absl::StatusOr<int64_t> Args::GetBytes(const std::string& flag, int64_t fallback) const {
  auto v = Get(flag);
  if (!v) return fallback;
  absl::StatusOr<int64_t> bytes = ParseByteSize(*v);
  if (!bytes.ok())
    return absl::InvalidArgumentError(absl::StrCat(flag, ": ", bytes.status().message()));
  return bytes;
}

}  // namespace thermocline::cli
