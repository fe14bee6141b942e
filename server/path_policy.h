// Which files the admin API may hand to a model job: only those under the configured roots
// (registry.allowed_paths; by default the state directory and the folders of the configured
// [[models]]), so that registration is no oracle for other files of the machine. A path is
// resolved (symbolic links too) before it is compared, and a refusal says nothing about the
// file itself: not whether it exists, nor what it is. Inside the roots, a path that exists must
// be a regular file (a FIFO would block the reader that opens it). Thread-safe once built.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "server/model_admin.h"

namespace thermocline::server {

class PathPolicy {
 public:
  // Roots that cannot be resolved are kept as written (lexically normalised).
  explicit PathPolicy(const std::vector<std::string>& roots);

  // The resolved absolute path of `path` (the request field `param`) when it may be used;
  // else InvalidRequest (empty, a NUL byte, not a regular file) or PermissionDenied
  // "path_not_allowed" (outside every root).
  absl::StatusOr<std::string> Confine(std::string_view param, std::string_view path) const;

  // Confines a registration's model path and corpus (when given), replacing them by their
  // resolved paths. Both admin front ends call it before ModelAdmin::Register.
  absl::Status ConfineRegistration(RegisterSpec* spec) const;

  const std::vector<std::string>& roots() const { return roots_; }

 private:
  std::vector<std::string> roots_;  // resolved, without a trailing '/'
};

}  // namespace thermocline::server
