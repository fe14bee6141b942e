#include "server/path_policy.h"

#include <sys/stat.h>

#include <filesystem>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/errors.h"

namespace thermocline::server {
namespace {

namespace fs = std::filesystem;

std::string Resolve(const std::string& path) {
  std::error_code ec;
  fs::path p = fs::absolute(path, ec);
  if (ec) return fs::path(path).lexically_normal().string();
  fs::path resolved = fs::weakly_canonical(p, ec);
  if (ec) resolved = p.lexically_normal();
  std::string out = resolved.string();
  while (out.size() > 1 && out.back() == '/') out.pop_back();
  return out;
}

bool Under(const std::string& path, const std::string& root) {
  if (root == "/") return true;
  return path == root || (path.size() > root.size() && path.compare(0, root.size(), root) == 0 &&
                          path[root.size()] == '/');
}

}  // namespace

PathPolicy::PathPolicy(const std::vector<std::string>& roots) {
  for (const std::string& r : roots) {
    if (!r.empty()) roots_.push_back(Resolve(r));
  }
}

absl::StatusOr<std::string> PathPolicy::Confine(std::string_view param,
                                                std::string_view path) const {
  if (path.empty()) {
    return InvalidRequest(param, "missing_required_parameter",
                          absl::StrCat("'", ToAbsl(param), "' must name a file"));
  }
  if (path.find('\0') != std::string_view::npos) {
    return InvalidRequest(param, "invalid_value",
                          absl::StrCat("'", ToAbsl(param), "' holds a NUL character"));
  }
  const std::string resolved = Resolve(std::string(path));
  bool allowed = false;
  for (const std::string& root : roots_) allowed |= Under(resolved, root);
  if (!allowed) {
    return Forbidden("path_not_allowed",
                     absl::StrCat("'", ToAbsl(param),
                                  "' is outside the folders this daemon may read ("
                                  "registry.allowed_paths: ",
                                  roots_.empty() ? "none" : absl::StrJoin(roots_, ", "),
                                  "); put the file there or add its folder"));
  }
  struct stat st;
  if (::stat(resolved.c_str(), &st) == 0 && !S_ISREG(st.st_mode)) {
    return InvalidRequest(param, "invalid_value",
                          absl::StrCat("'", ToAbsl(param), "' is not a regular file: ", resolved));
  }
  return resolved;
}

absl::Status PathPolicy::ConfineRegistration(RegisterSpec* spec) const {
  auto path = Confine("path", spec->path);
  if (!path.ok()) return path.status();
  spec->path = *path;
  if (!spec->corpus.empty()) {
    auto corpus = Confine("corpus", spec->corpus);
    if (!corpus.ok()) return corpus.status();
    spec->corpus = *corpus;
  }
  return absl::OkStatus();
}

}  // namespace thermocline::server
