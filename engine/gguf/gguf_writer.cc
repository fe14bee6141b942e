// GgufWriter: GGUF v3 in llama.cpp's byte layout (header, metadata in insertion order, tensor
// infos, zero padding to general.alignment, each tensor's data padded to the alignment).
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "engine/gguf/gguf.h"
#include "engine/gguf/gguf_internal.h"

namespace thermocline {
namespace {

constexpr uint32_t kVersion = 3;
constexpr uint64_t kDefaultAlignment = 32;
constexpr size_t kMaxTensorName = 64;  // llama.cpp's GGML_MAX_NAME, terminator included
constexpr int64_t kMaxElements = int64_t{1} << 50;

void PutBytes(std::string* out, const void* p, size_t n) {
  out->append(static_cast<const char*>(p), n);
}
template <typename T>
void Put(std::string* out, T v) {
  PutBytes(out, &v, sizeof(v));
}
void PutString(std::string* out, std::string_view s) {
  Put<uint64_t>(out, s.size());
  out->append(s);
}

uint64_t AlignUp(uint64_t n, uint64_t alignment) {
  return (n + alignment - 1) / alignment * alignment;
}

absl::Status BadValue(std::string_view key, std::string_view what) {
  return absl::InvalidArgumentError(absl::StrFormat("GGUF writer: key '%s': %s", key, what));
}

// Integers are range-checked against their declared GGUF type.
template <typename T>
absl::Status PutInteger(std::string* out, std::string_view key, std::optional<int64_t> s,
                        std::optional<uint64_t> u) {
  if constexpr (std::is_signed_v<T>) {
    if (s.has_value() && *s >= std::numeric_limits<T>::min() &&
        *s <= std::numeric_limits<T>::max()) {
      Put<T>(out, static_cast<T>(*s));
      return absl::OkStatus();
    }
  } else {
    if (u.has_value() && *u <= std::numeric_limits<T>::max()) {
      Put<T>(out, static_cast<T>(*u));
      return absl::OkStatus();
    }
  }
  return BadValue(key, "integer value missing or out of range for its type");
}

// One element of type `type`: the value is passed in whichever form it is stored.
absl::Status PutElement(std::string* out, std::string_view key, GgufValueType type,
                        std::optional<int64_t> s, std::optional<uint64_t> u,
                        std::optional<double> d, const std::string* str) {
  if (type == GgufValueType::kBool) {
    if (!s.has_value()) return BadValue(key, "bool value missing");
    Put<uint8_t>(out, *s != 0 ? 1 : 0);
    return absl::OkStatus();
  }
  if (type == GgufValueType::kString) {
    if (str == nullptr) return BadValue(key, "string value missing");
    PutString(out, *str);
    return absl::OkStatus();
  }
  if (type == GgufValueType::kArray) return BadValue(key, "nested arrays are not supported");
  absl::Status status =
      BadValue(key, absl::StrCat("unknown value type ", static_cast<uint32_t>(type)));
  gguf_internal::VisitNumericType(type, [&](auto tag) {
    using Raw = typename decltype(tag)::type;
    if constexpr (std::is_floating_point_v<Raw>) {
      status = d.has_value() ? absl::OkStatus() : BadValue(key, "float value missing");
      if (d.has_value()) Put<Raw>(out, static_cast<Raw>(*d));
    } else {
      status = PutInteger<Raw>(out, key, s, u);
    }
  });
  return status;
}

// Applies `put` to every element of the array, whichever vector holds them.
template <typename Vec, typename F>
absl::Status PutAll(std::string* out, const Vec* v, F put) {
  Put<uint64_t>(out, v->size());
  for (const auto& x : *v) {
    if (absl::Status s = put(x); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status PutArray(std::string* out, std::string_view key, const GgufValue& value) {
  const GgufValueType t = value.array_type();
  if (t == GgufValueType::kArray || GgufValueTypeName(t) == "unknown") {
    return BadValue(key, "array elements must be scalars or strings");
  }
  Put<uint32_t>(out, static_cast<uint32_t>(t));
  auto none = std::nullopt;
  if (const auto* v = value.AsStringArray(); v != nullptr && t == GgufValueType::kString) {
    return PutAll(out, v, [&](const std::string& x) {
      return PutElement(out, key, t, none, none, none, &x);
    });
  }
  if (const auto* v = value.AsIntArray()) {
    return PutAll(out, v, [&](int64_t x) {
      std::optional<uint64_t> u;
      if (x >= 0) u = static_cast<uint64_t>(x);
      return PutElement(out, key, t, x, u, none, nullptr);
    });
  }
  if (const auto* v = value.AsUintArray()) {
    return PutAll(out, v, [&](uint64_t x) {
      std::optional<int64_t> s;
      if (x <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) s = x;
      return PutElement(out, key, t, s, x, none, nullptr);
    });
  }
  if (const auto* v = value.AsDoubleArray()) {
    return PutAll(out, v,
                  [&](double x) { return PutElement(out, key, t, none, none, x, nullptr); });
  }
  return BadValue(
      key, absl::StrFormat("array elements do not match their type %s", GgufValueTypeName(t)));
}

absl::Status PutKeyValue(std::string* out, const GgufKeyValue& kv) {
  PutString(out, kv.key);
  const GgufValue& v = kv.value;
  Put<uint32_t>(out, static_cast<uint32_t>(v.type()));
  if (v.is_array()) return PutArray(out, kv.key, v);
  std::optional<int64_t> s = v.AsInt();
  if (v.type() == GgufValueType::kBool) s = v.AsBool();
  std::optional<double> d =
      v.type() == GgufValueType::kFloat32 || v.type() == GgufValueType::kFloat64 ? v.AsDouble()
                                                                                 : std::nullopt;
  return PutElement(out, kv.key, v.type(), s, v.AsUint(), d, v.AsString());
}

// Writes all of `data` or reports why not.
absl::Status WriteAll(std::FILE* f, const std::string& path, const void* data, size_t n) {
  if (n > 0 && std::fwrite(data, 1, n, f) != n) {
    return absl::InternalError(absl::StrCat(path, ": write failed: ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

}  // namespace

void GgufWriter::Set(std::string key, GgufValue value) {
  for (GgufKeyValue& kv : metadata_) {
    if (kv.key == key) {
      kv.value = std::move(value);
      return;
    }
  }
  metadata_.push_back({std::move(key), std::move(value)});
}

void GgufWriter::SetString(std::string key, std::string v) {
  Set(std::move(key), GgufValue::String(std::move(v)));
}
void GgufWriter::SetUint32(std::string key, uint32_t v) {
  Set(std::move(key), GgufValue::Uint(GgufValueType::kUint32, v));
}
void GgufWriter::SetInt32(std::string key, int32_t v) {
  Set(std::move(key), GgufValue::Int(GgufValueType::kInt32, v));
}
void GgufWriter::SetUint64(std::string key, uint64_t v) {
  Set(std::move(key), GgufValue::Uint(GgufValueType::kUint64, v));
}
void GgufWriter::SetFloat32(std::string key, float v) {
  Set(std::move(key), GgufValue::Float(GgufValueType::kFloat32, v));
}
void GgufWriter::SetBool(std::string key, bool v) { Set(std::move(key), GgufValue::Bool(v)); }

void GgufWriter::Remove(std::string_view key) {
  std::erase_if(metadata_, [key](const GgufKeyValue& kv) { return kv.key == key; });
}

absl::Status GgufWriter::AddTensor(std::string name, GgmlType type, std::vector<int64_t> dims,
                                   const void* data, uint64_t bytes) {
  auto error = [&](std::string_view what) {
    return absl::InvalidArgumentError(absl::StrFormat("GGUF writer: tensor '%s': %s", name, what));
  };
  if (name.empty() || name.size() >= kMaxTensorName) {
    return error(absl::StrCat("name must be 1..", kMaxTensorName - 1, " bytes"));
  }
  for (const PendingTensor& t : tensors_) {
    if (t.name == name) return error("duplicate tensor name");
  }
  const GgmlTypeInfo* info = FindGgmlType(static_cast<uint32_t>(type));
  if (info == nullptr) return error("unknown ggml type");
  if (dims.empty() || dims.size() > 4) return error("needs 1..4 dimensions");
  int64_t elements = 1;
  for (int64_t d : dims) {
    if (d <= 0) return error(absl::StrCat("dimension ", d, " is not positive"));
    if (__builtin_mul_overflow(elements, d, &elements) || elements > kMaxElements) {
      return error("too many elements");
    }
  }
  if (dims[0] % info->block_size != 0) {
    return error(absl::StrFormat("row length %d is not a multiple of the %s block size %d", dims[0],
                                 info->name, info->block_size));
  }
  const uint64_t expected =
      static_cast<uint64_t>(RowBytes(type, dims[0])) * static_cast<uint64_t>(elements / dims[0]);
  if (bytes != expected) {
    return error(absl::StrFormat("%d bytes given, but %s %s needs %d", bytes, info->name,
                                 absl::StrJoin(dims, "x"), expected));
  }
  if (data == nullptr) return error("data is null");
  tensors_.push_back({std::move(name), type, std::move(dims), data, bytes});
  return absl::OkStatus();
}

absl::Status GgufWriter::AddTensorCopy(std::string name, GgmlType type, std::vector<int64_t> dims,
                                       std::vector<uint8_t> bytes) {
  auto copy = std::make_unique<std::vector<uint8_t>>(std::move(bytes));
  const uint64_t n = copy->size();
  absl::Status s = AddTensor(std::move(name), type, std::move(dims), copy->data(), n);
  if (s.ok()) owned_.push_back(std::move(copy));
  return s;
}

absl::Status GgufWriter::Write(const std::string& path) const {
  uint64_t alignment = kDefaultAlignment;
  for (const GgufKeyValue& kv : metadata_) {
    if (kv.key != "general.alignment") continue;
    std::optional<uint64_t> a = kv.value.AsUint();
    if (kv.value.type() != GgufValueType::kUint32 || !a.has_value() || *a == 0 ||
        (*a & (*a - 1)) != 0 || *a > std::numeric_limits<uint32_t>::max()) {
      return BadValue(kv.key, "must be a uint32 power of two");
    }
    alignment = *a;
  }

  std::string header;
  PutBytes(&header, "GGUF", 4);
  Put<uint32_t>(&header, kVersion);
  Put<uint64_t>(&header, tensors_.size());
  Put<uint64_t>(&header, metadata_.size());
  for (const GgufKeyValue& kv : metadata_) {
    if (absl::Status s = PutKeyValue(&header, kv); !s.ok()) return s;
  }
  uint64_t offset = 0;
  for (const PendingTensor& t : tensors_) {
    PutString(&header, t.name);
    Put<uint32_t>(&header, static_cast<uint32_t>(t.dims.size()));
    for (int64_t d : t.dims) Put<uint64_t>(&header, static_cast<uint64_t>(d));
    Put<uint32_t>(&header, static_cast<uint32_t>(t.type));
    Put<uint64_t>(&header, offset);
    offset += AlignUp(t.bytes, alignment);
  }
  header.resize(AlignUp(header.size(), alignment), '\0');

  const std::string tmp = path + ".tmp";
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (f == nullptr) {
    return absl::PermissionDeniedError(
        absl::StrCat(tmp, ": cannot create: ", std::strerror(errno)));
  }
  const std::string zeros(alignment, '\0');
  absl::Status status = WriteAll(f, tmp, header.data(), header.size());
  for (const PendingTensor& t : tensors_) {
    if (!status.ok()) break;
    status = WriteAll(f, tmp, t.data, t.bytes);
    if (status.ok()) status = WriteAll(f, tmp, zeros.data(), AlignUp(t.bytes, alignment) - t.bytes);
  }
  if (status.ok() && (std::fflush(f) != 0 || ::fsync(fileno(f)) != 0)) {
    status = absl::InternalError(absl::StrCat(tmp, ": flush failed: ", std::strerror(errno)));
  }
  if (std::fclose(f) != 0 && status.ok()) {
    status = absl::InternalError(absl::StrCat(tmp, ": close failed: ", std::strerror(errno)));
  }
  if (status.ok() && std::rename(tmp.c_str(), path.c_str()) != 0) {
    status = absl::InternalError(
        absl::StrCat("cannot rename ", tmp, " to ", path, ": ", std::strerror(errno)));
  }
  if (!status.ok()) std::remove(tmp.c_str());
  return status;
}

}  // namespace thermocline
