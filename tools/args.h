// A small command-line parser for the subcommands: --flag value, --flag=value, -f value,
// boolean switches, positionals; unknown flags and bad numbers are errors that name the flag.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace thermocline::cli {

class Args {
 public:
  // value_flags take a value; switches don't. Aliases map short names ("-m") to long ("--model").
  static absl::StatusOr<Args> Parse(int argc, char** argv, const std::set<std::string>& value_flags,
                                    const std::set<std::string>& switches,
                                    const std::map<std::string, std::string>& aliases = {});

  bool Has(const std::string& flag) const { return values_.count(flag) || switches_.count(flag); }
  std::optional<std::string> Get(const std::string& flag) const;
  std::string GetOr(const std::string& flag, const std::string& fallback) const;
  absl::StatusOr<int64_t> GetInt(const std::string& flag, int64_t fallback) const;
  absl::StatusOr<double> GetDouble(const std::string& flag, double fallback) const;
  // Byte counts with optional suffix: 512M, 8G, 8GiB, 1000000.
  absl::StatusOr<int64_t> GetBytes(const std::string& flag, int64_t fallback) const;
  const std::vector<std::string>& positionals() const { return positionals_; }
  // A copy with value flag `flag` set to `value`.
  Args With(const std::string& flag, const std::string& value) const {
    Args a = *this;
    a.values_[flag] = value;
    return a;
  }

 private:
  std::map<std::string, std::string> values_;
  std::set<std::string> switches_;
  std::vector<std::string> positionals_;
};

}  // namespace thermocline::cli
