// GgufFile: mapping a file (or copying an image) for Parse, and the typed metadata getters.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/gguf/gguf.h"

namespace thermocline {
namespace {

absl::Status OpenError(const std::string& path, int err) {
  const std::string message = absl::StrCat(path, ": ", std::strerror(err));
  switch (err) {
    case ENOENT:
    case ENOTDIR:
      return absl::NotFoundError(absl::StrCat(message, " (check the model path)"));
    case EACCES:
    case EPERM:
      return absl::PermissionDeniedError(message);
    default:
      return absl::UnavailableError(message);
  }
}

std::string Describe(const GgufValue& v) {
  if (v.is_array()) return absl::StrFormat("an array of %s", GgufValueTypeName(v.array_type()));
  return absl::StrFormat("a %s", GgufValueTypeName(v.type()));
}

bool IsIntegerType(GgufValueType t) {
  switch (t) {
    case GgufValueType::kUint8:
    case GgufValueType::kInt8:
    case GgufValueType::kUint16:
    case GgufValueType::kInt16:
    case GgufValueType::kUint32:
    case GgufValueType::kInt32:
    case GgufValueType::kUint64:
    case GgufValueType::kInt64:
      return true;
    default:
      return false;
  }
}

bool IsFloatType(GgufValueType t) {
  return t == GgufValueType::kFloat32 || t == GgufValueType::kFloat64;
}

}  // namespace

absl::StatusOr<std::unique_ptr<GgufFile>> GgufFile::Open(const std::string& path) {
  // The type is checked before anything opens the path: open() of a FIFO blocks until a writer
  // comes (for ever, under whatever lock the caller holds), that of a device may have effects.
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return OpenError(path, errno);
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a regular file"));
  }
  // Non-blocking, and the type checked again on what was opened: the path may have been
  // replaced by a FIFO since the stat.
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
  if (fd < 0) return OpenError(path, errno);
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return OpenError(path, err);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a regular file"));
  }
  ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) & ~O_NONBLOCK);
  if (st.st_size == 0) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat(path, ": file is empty, not a GGUF file"));
  }
  const auto size = static_cast<uint64_t>(st.st_size);
  void* mapping = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  const int map_err = errno;
  ::close(fd);  // the mapping keeps the file alive
  if (mapping == MAP_FAILED) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("%s: mmap of %d bytes failed: %s", path, size, std::strerror(map_err)));
  }
  std::unique_ptr<GgufFile> file(new GgufFile());
  file->path_ = path;
  file->mapping_ = mapping;
  file->base_ = static_cast<const uint8_t*>(mapping);
  file->size_ = size;
  file->stamp_ =
      GgufFileStamp{static_cast<uint64_t>(st.st_dev), static_cast<uint64_t>(st.st_ino),
                    static_cast<int64_t>(st.st_size),
                    static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec};
  file->guard_ = MappingGuard(mapping, size);
  if (absl::Status s = file->Parse(); !s.ok()) return s;
  return file;
}

absl::StatusOr<GgufFileStamp> GgufFileStamp::Of(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) return OpenError(path, errno);
  return GgufFileStamp{static_cast<uint64_t>(st.st_dev), static_cast<uint64_t>(st.st_ino),
                       static_cast<int64_t>(st.st_size),
                       static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec};
}

absl::StatusOr<std::unique_ptr<GgufFile>> GgufFile::FromBytes(std::string_view bytes) {
  std::unique_ptr<GgufFile> file(new GgufFile());
  file->owned_.assign(bytes.begin(), bytes.end());
  file->base_ = file->owned_.data();
  file->size_ = file->owned_.size();
  if (absl::Status s = file->Parse(); !s.ok()) return s;
  return file;
}

GgufFile::~GgufFile() {
  guard_ = MappingGuard();  // before the region can be mapped again by anyone
  if (mapping_ != nullptr) ::munmap(mapping_, size_);
}

uint64_t GgufFile::ReleasePages(const void* p, uint64_t bytes) const {
  if (mapping_ == nullptr) return 0;
  const auto begin = reinterpret_cast<uintptr_t>(p);
  const auto map_begin = reinterpret_cast<uintptr_t>(mapping_);
  if (begin < map_begin || begin + bytes > map_begin + size_) return 0;
  static const uintptr_t page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t first = (begin + page - 1) / page * page, last = (begin + bytes) / page * page;
  if (last <= first) return 0;
  // MADV_DONTNEED on a private, never written file mapping only unmaps the pages: a later
  // access reads the file again.
  if (::madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED) != 0) return 0;
  return last - first;
}

const GgufValue* GgufFile::Find(std::string_view key) const {
  for (const GgufKeyValue& kv : metadata_) {
    if (kv.key == key) return &kv.value;
  }
  return nullptr;
}

const GgufTensorInfo* GgufFile::FindTensor(std::string_view name) const {
  for (const GgufTensorInfo& t : tensors_) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

namespace {

// The shared shape of the getters: find the key, convert it, or say what was wrong.
template <typename T, typename Convert>
absl::StatusOr<T> Get(const GgufFile& file, std::string_view key, std::string_view expected,
                      const std::optional<T>& fallback, Convert convert) {
  const std::string where = file.path().empty() ? "GGUF data" : file.path();
  const GgufValue* v = file.Find(key);
  if (v == nullptr) {
    if (fallback.has_value()) return *fallback;
    return absl::NotFoundError(absl::StrFormat("%s: metadata key '%s' is missing", where, key));
  }
  std::optional<T> out = convert(*v);
  if (!out.has_value()) {
    return absl::InvalidArgumentError(absl::StrFormat("%s: metadata key '%s' is %s, expected %s",
                                                      where, key, Describe(*v), expected));
  }
  return *std::move(out);
}

std::optional<std::string> ConvertString(const GgufValue& v) {
  if (const std::string* s = v.AsString()) return *s;
  return std::nullopt;
}

std::optional<int64_t> ConvertInt(const GgufValue& v) {
  if (!IsIntegerType(v.type())) return std::nullopt;
  return v.AsInt();  // nullopt for a uint64 above INT64_MAX
}

std::optional<double> ConvertFloat(const GgufValue& v) {
  if (!IsIntegerType(v.type()) && !IsFloatType(v.type())) return std::nullopt;
  return v.AsDouble();
}

std::optional<bool> ConvertBool(const GgufValue& v) {
  if (v.type() != GgufValueType::kBool) return std::nullopt;
  return v.AsBool();
}

constexpr std::string_view kString = "a string";
constexpr std::string_view kInt = "an integer (that fits in int64)";
constexpr std::string_view kFloat = "a number";
constexpr std::string_view kBool = "a bool";

}  // namespace

absl::StatusOr<std::string> GgufFile::GetString(std::string_view key) const {
  return Get<std::string>(*this, key, kString, std::nullopt, ConvertString);
}
absl::StatusOr<int64_t> GgufFile::GetInt(std::string_view key) const {
  return Get<int64_t>(*this, key, kInt, std::nullopt, ConvertInt);
}
absl::StatusOr<double> GgufFile::GetFloat(std::string_view key) const {
  return Get<double>(*this, key, kFloat, std::nullopt, ConvertFloat);
}
absl::StatusOr<bool> GgufFile::GetBool(std::string_view key) const {
  return Get<bool>(*this, key, kBool, std::nullopt, ConvertBool);
}
absl::StatusOr<std::string> GgufFile::GetString(std::string_view key, std::string fallback) const {
  return Get<std::string>(*this, key, kString, std::move(fallback), ConvertString);
}
absl::StatusOr<int64_t> GgufFile::GetInt(std::string_view key, int64_t fallback) const {
  return Get<int64_t>(*this, key, kInt, fallback, ConvertInt);
}
absl::StatusOr<double> GgufFile::GetFloat(std::string_view key, double fallback) const {
  return Get<double>(*this, key, kFloat, fallback, ConvertFloat);
}
absl::StatusOr<bool> GgufFile::GetBool(std::string_view key, bool fallback) const {
  return Get<bool>(*this, key, kBool, fallback, ConvertBool);
}

}  // namespace thermocline
