// GGUF v2 and v3 reading (memory-mapped, every offset bounds-checked) and v3 writing.
// Also reads PowerInfer's files (magic "PWRI", otherwise GGUF v3).
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "engine/gguf/mapping_guard.h"
#include "engine/ops/ggml_types.h"

namespace thermocline {

enum class GgufValueType : uint32_t {
  kUint8 = 0,
  kInt8 = 1,
  kUint16 = 2,
  kInt16 = 3,
  kUint32 = 4,
  kInt32 = 5,
  kFloat32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kUint64 = 10,
  kInt64 = 11,
  kFloat64 = 12,
};
std::string_view GgufValueTypeName(GgufValueType type);

// One metadata value. Scalars keep their GGUF type; arrays keep their element type and hold
// their elements in the matching vector (integers and bools widen to int64/uint64, floats to
// double; strings stay strings). Nested arrays are rejected by the reader.
class GgufValue {
 public:
  GgufValue() = default;
  static GgufValue Uint(GgufValueType type, uint64_t v);
  static GgufValue Int(GgufValueType type, int64_t v);
  static GgufValue Float(GgufValueType type, double v);
  static GgufValue Bool(bool v);
  static GgufValue String(std::string v);
  static GgufValue StringArray(std::vector<std::string> v);
  static GgufValue IntArray(GgufValueType element_type, std::vector<int64_t> v);  // signed types
  static GgufValue UintArray(GgufValueType element_type, std::vector<uint64_t> v);
  static GgufValue FloatArray(GgufValueType element_type, std::vector<double> v);

  GgufValueType type() const { return type_; }
  GgufValueType array_type() const { return array_type_; }  // meaningful when type() == kArray
  bool is_array() const { return type_ == GgufValueType::kArray; }
  size_t array_size() const;

  // Scalar access: nullopt when the value is not of a compatible kind (any integer type or bool
  // reads as integer; any float or integer reads as double).
  std::optional<int64_t> AsInt() const;
  std::optional<uint64_t> AsUint() const;
  std::optional<double> AsDouble() const;
  std::optional<bool> AsBool() const;
  const std::string* AsString() const;

  // Array access: nullptr when not an array of a compatible kind.
  const std::vector<std::string>* AsStringArray() const;
  const std::vector<int64_t>* AsIntArray() const;    // arrays of signed ints and bools
  const std::vector<uint64_t>* AsUintArray() const;  // arrays of unsigned ints
  const std::vector<double>* AsDoubleArray() const;  // arrays of floats

  std::string DebugString(size_t max_elements = 8) const;  // for `inspect`

 private:
  GgufValueType type_ = GgufValueType::kUint8;
  GgufValueType array_type_ = GgufValueType::kUint8;
  std::variant<std::monostate, int64_t, uint64_t, double, bool, std::string,
               std::vector<std::string>, std::vector<int64_t>, std::vector<uint64_t>,
               std::vector<double>>
      value_;
};

struct GgufKeyValue {
  std::string key;
  GgufValue value;
};

struct GgufTensorInfo {
  std::string name;
  GgmlType type = GgmlType::kF32;
  std::vector<int64_t> dims;  // ne[0] first: dims[0] is the row length
  uint64_t offset = 0;        // from the start of the data section
  uint64_t size_bytes = 0;
  int64_t n_elements = 0;
  const uint8_t* data = nullptr;  // into the mapping; valid while the GgufFile lives
};

// Who a mapped file was when it was opened: a file replaced (other inode), rewritten (mtime) or
// truncated (size) since no longer matches.
struct GgufFileStamp {
  uint64_t device = 0;
  uint64_t inode = 0;
  int64_t size = 0;
  int64_t mtime_ns = 0;
  bool operator==(const GgufFileStamp&) const = default;
  // The stamp of `path` now (stat; no open).
  static absl::StatusOr<GgufFileStamp> Of(const std::string& path);
};

class GgufFile {
 public:
  // Maps the file read-only and parses it. Every count, length, type, dimension and offset is
  // validated against the file size before use; errors name the problem and the path. Anything
  // but a regular file (a FIFO, a device) is refused without being opened, so Open never blocks
  // on one.
  static absl::StatusOr<std::unique_ptr<GgufFile>> Open(const std::string& path);
  // Parses a file image held in memory (tests, fuzzing); the bytes are copied.
  static absl::StatusOr<std::unique_ptr<GgufFile>> FromBytes(std::string_view bytes);

  ~GgufFile();
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  bool is_powerinfer() const { return powerinfer_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t file_size() const { return size_; }
  uint64_t data_offset() const { return data_offset_; }
  // The file as opened (zeros for FromBytes).
  const GgufFileStamp& stamp() const { return stamp_; }
  // The bytes before the tensor data: magic, metadata and tensor table.
  std::string_view header_bytes() const {
    return {reinterpret_cast<const char*>(base_),
            static_cast<size_t>(std::min(data_offset_, size_))};
  }
  // True once a read of the mapping faulted (the file shrank or its disk failed under it; see
  // mapping_guard.h): its data can no longer be trusted. Lock-free: cheap enough per token.
  bool faulted() const { return guard_.faulted(); }

  const std::vector<GgufKeyValue>& metadata() const { return metadata_; }
  const GgufValue* Find(std::string_view key) const;

  // Typed getters; a missing key or a value of the wrong type is an error naming the key.
  absl::StatusOr<std::string> GetString(std::string_view key) const;
  absl::StatusOr<int64_t> GetInt(std::string_view key) const;
  absl::StatusOr<double> GetFloat(std::string_view key) const;
  absl::StatusOr<bool> GetBool(std::string_view key) const;
  // Defaults when absent (still an error when present with the wrong type).
  absl::StatusOr<std::string> GetString(std::string_view key, std::string fallback) const;
  absl::StatusOr<int64_t> GetInt(std::string_view key, int64_t fallback) const;
  absl::StatusOr<double> GetFloat(std::string_view key, double fallback) const;
  absl::StatusOr<bool> GetBool(std::string_view key, bool fallback) const;

  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
  const GgufTensorInfo* FindTensor(std::string_view name) const;

  // Drops this process's pages of [p, p + bytes) (the whole pages inside it) where they are
  // mapped from the file: the contents stay the file's, and a later read faults them in again.
  // For data that a copy has replaced (the sparse FFN's reordered rows). Returns the bytes
  // released; 0 for memory the file does not map (a FromBytes image, converted tensors).
  uint64_t ReleasePages(const void* p, uint64_t bytes) const;

 private:
  GgufFile() = default;
  absl::Status Parse();

  std::string path_;
  const uint8_t* base_ = nullptr;
  uint64_t size_ = 0;
  void* mapping_ = nullptr;     // mmap'd region, or nullptr
  std::vector<uint8_t> owned_;  // FromBytes copy
  GgufFileStamp stamp_;
  MappingGuard guard_;  // of mapping_
  uint32_t version_ = 0;
  bool powerinfer_ = false;
  uint64_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  std::vector<GgufKeyValue> metadata_;
  std::vector<GgufTensorInfo> tensors_;
};

// Writes GGUF v3 files. Metadata keeps insertion order; tensors are laid out in insertion order
// at general.alignment (32 unless set).
class GgufWriter {
 public:
  void Set(std::string key, GgufValue value);  // replaces an existing key in place
  void SetString(std::string key, std::string v);
  void SetUint32(std::string key, uint32_t v);
  void SetInt32(std::string key, int32_t v);
  void SetUint64(std::string key, uint64_t v);
  void SetFloat32(std::string key, float v);
  void SetBool(std::string key, bool v);
  void Remove(std::string_view key);

  // `data` must stay valid until Write(); bytes must equal the size that type and dims imply.
  absl::Status AddTensor(std::string name, GgmlType type, std::vector<int64_t> dims,
                         const void* data, uint64_t bytes);
  // The same, with the writer owning a copy of the bytes.
  absl::Status AddTensorCopy(std::string name, GgmlType type, std::vector<int64_t> dims,
                             std::vector<uint8_t> bytes);

  // Writes to a temporary file beside `path` and renames it into place.
  absl::Status Write(const std::string& path) const;

 private:
  struct PendingTensor {
    std::string name;
    GgmlType type;
    std::vector<int64_t> dims;
    const void* data;
    uint64_t bytes;
  };
  std::vector<GgufKeyValue> metadata_;
  std::vector<PendingTensor> tensors_;
  std::vector<std::unique_ptr<std::vector<uint8_t>>> owned_;
};

}  // namespace thermocline
