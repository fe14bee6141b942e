// GgufFile::Parse: walks a GGUF v2 or v3 image, checking every length, count, type, dimension and
// offset against the bytes that are actually there before using it.
#include <algorithm>
#include <bit>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <unordered_set>
#include <utility>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/gguf/gguf.h"
#include "engine/gguf/gguf_internal.h"

namespace thermocline {
namespace {

static_assert(std::endian::native == std::endian::little, "the GGUF reader assumes little-endian");

constexpr uint32_t kMaxDims = 4;
constexpr int64_t kMaxElements = int64_t{1} << 50;
constexpr uint32_t kLastValueType = static_cast<uint32_t>(GgufValueType::kFloat64);
// Smallest possible encodings, used to bound counts by the bytes left before allocating:
// key length + value type + a 1-byte value; name length + n_dims + one dim + type + offset.
constexpr uint64_t kMinKeyValueBytes = 8 + 4 + 1;
constexpr uint64_t kMinTensorInfoBytes = 8 + 4 + 8 + 4 + 8;
// Counts are bounded by the file size, but reserve only modestly up front all the same.
constexpr size_t kMaxReserve = 4096;

// Encoded size of an array element (strings: their length prefix).
uint64_t MinEncodedSize(GgufValueType type) {
  if (type == GgufValueType::kString) return 8;
  uint64_t size = 1;  // bool
  gguf_internal::VisitNumericType(type,
                                  [&](auto tag) { size = sizeof(typename decltype(tag)::type); });
  return size;
}

// Sequential little-endian reads over [base, base + size); every read checks what is left.
class Cursor {
 public:
  Cursor(const uint8_t* base, uint64_t size, std::string prefix)
      : base_(base), size_(size), prefix_(std::move(prefix)) {}

  uint64_t pos() const { return pos_; }
  uint64_t remaining() const { return size_ - pos_; }

  absl::Status Error(std::string_view message) const {
    return absl::InvalidArgumentError(absl::StrFormat("%s: %s", prefix_, message));
  }
  absl::Status Truncated(std::string_view what, uint64_t need) const {
    return Error(absl::StrFormat(
        "file truncated: %s at byte %d needs %d bytes but only %d remain (file is %d bytes)", what,
        pos_, need, remaining(), size_));
  }

  template <typename T>
  absl::Status Read(T* out, std::string_view what) {
    if (remaining() < sizeof(T)) return Truncated(what, sizeof(T));
    std::memcpy(out, base_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return absl::OkStatus();
  }

  // Reads a uint64 length and that many bytes; `what` is built only on error.
  template <typename What>
  absl::Status ReadString(std::string* out, What what) {
    uint64_t len = 0;
    if (remaining() < sizeof(len)) return Truncated(absl::StrCat("length of ", what()), 8);
    std::memcpy(&len, base_ + pos_, sizeof(len));
    if (len > remaining() - sizeof(len)) {
      return Error(absl::StrFormat("%s at byte %d has length %d but only %d bytes remain", what(),
                                   pos_, len, remaining() - sizeof(len)));
    }
    pos_ += sizeof(len);
    out->assign(reinterpret_cast<const char*>(base_ + pos_), len);
    pos_ += len;
    return absl::OkStatus();
  }

  // The caller has checked that `n` bytes remain.
  const uint8_t* Take(uint64_t n) {
    const uint8_t* p = base_ + pos_;
    pos_ += n;
    return p;
  }

 private:
  const uint8_t* base_;
  uint64_t size_;
  uint64_t pos_ = 0;
  std::string prefix_;
};

// Wraps a decoded number (or a run of them) in the GgufValue kind its type widens to.
template <typename Raw>
GgufValue MakeNumber(GgufValueType type, Raw v) {
  if constexpr (std::is_floating_point_v<Raw>) {
    return GgufValue::Float(type, v);
  } else if constexpr (std::is_signed_v<Raw>) {
    return GgufValue::Int(type, v);
  } else {
    return GgufValue::Uint(type, v);
  }
}

// Reads `count` fixed-size elements; the caller has checked that they are all there. Bools
// widen to int64 like signed integers.
template <typename Raw>
GgufValue TakeArray(Cursor& c, GgufValueType type, uint64_t count) {
  constexpr bool kSigned = std::is_signed_v<Raw> || std::is_same_v<Raw, bool>;
  using Wide = std::conditional_t<std::is_floating_point_v<Raw>, double,
                                  std::conditional_t<kSigned, int64_t, uint64_t>>;
  std::vector<Wide> out(count);
  const uint8_t* p = c.Take(count * sizeof(Raw));
  for (uint64_t i = 0; i < count; ++i) {
    if constexpr (std::is_same_v<Raw, bool>) {
      out[i] = p[i] != 0;
    } else {
      Raw x;
      std::memcpy(&x, p + i * sizeof(Raw), sizeof(Raw));
      out[i] = static_cast<Wide>(x);
    }
  }
  if constexpr (std::is_floating_point_v<Raw>) {
    return GgufValue::FloatArray(type, std::move(out));
  } else if constexpr (kSigned) {
    return GgufValue::IntArray(type, std::move(out));
  } else {
    return GgufValue::UintArray(type, std::move(out));
  }
}

absl::StatusOr<GgufValue> ReadArray(Cursor& c, const std::string& key) {
  uint32_t raw_type = 0;
  if (auto s = c.Read(&raw_type, absl::StrCat("array element type of key '", key, "'")); !s.ok()) {
    return s;
  }
  if (raw_type == static_cast<uint32_t>(GgufValueType::kArray)) {
    return c.Error(
        absl::StrFormat("key '%s': nested arrays are not supported (byte %d)", key, c.pos() - 4));
  }
  if (raw_type > kLastValueType) {
    return c.Error(absl::StrFormat("key '%s': unknown array element type %d at byte %d", key,
                                   raw_type, c.pos() - 4));
  }
  const auto type = static_cast<GgufValueType>(raw_type);
  uint64_t count = 0;
  if (auto s = c.Read(&count, absl::StrCat("array length of key '", key, "'")); !s.ok()) return s;
  const uint64_t min_size = MinEncodedSize(type);
  if (count > c.remaining() / min_size) {
    return c.Error(absl::StrFormat(
        "key '%s': array count %d at byte %d is impossible: the %d bytes left hold at most %d %s "
        "elements",
        key, count, c.pos() - 8, c.remaining(), c.remaining() / min_size, GgufValueTypeName(type)));
  }
  if (type == GgufValueType::kString) {
    std::vector<std::string> v(count);
    for (uint64_t i = 0; i < count; ++i) {
      auto what = [&] { return absl::StrFormat("element %d of key '%s'", i, key); };
      if (auto s = c.ReadString(&v[i], what); !s.ok()) return s;
    }
    return GgufValue::StringArray(std::move(v));
  }
  if (type == GgufValueType::kBool) return TakeArray<bool>(c, type, count);
  GgufValue out;
  gguf_internal::VisitNumericType(
      type, [&](auto tag) { out = TakeArray<typename decltype(tag)::type>(c, type, count); });
  return out;
}

absl::StatusOr<GgufValue> ReadValue(Cursor& c, uint32_t raw_type, const std::string& key) {
  if (raw_type > kLastValueType) {
    return c.Error(
        absl::StrFormat("key '%s': unknown value type %d at byte %d", key, raw_type, c.pos() - 4));
  }
  const auto type = static_cast<GgufValueType>(raw_type);
  if (type == GgufValueType::kArray) return ReadArray(c, key);
  if (type == GgufValueType::kString) {
    std::string s;
    auto what = [&] { return absl::StrCat("string value of key '", key, "'"); };
    if (auto st = c.ReadString(&s, what); !st.ok()) return st;
    return GgufValue::String(std::move(s));
  }
  const std::string what = absl::StrCat("value of key '", key, "'");
  if (type == GgufValueType::kBool) {
    uint8_t v = 0;
    if (auto s = c.Read(&v, what); !s.ok()) return s;
    return GgufValue::Bool(v != 0);
  }
  absl::Status status;
  GgufValue out;
  gguf_internal::VisitNumericType(type, [&](auto tag) {
    typename decltype(tag)::type v{};
    status = c.Read(&v, what);
    out = MakeNumber(type, v);
  });
  if (!status.ok()) return status;
  return out;
}

absl::StatusOr<GgufTensorInfo> ReadTensorInfo(Cursor& c, uint64_t index) {
  GgufTensorInfo t;
  auto what = [&] { return absl::StrCat("name of tensor #", index); };
  if (auto s = c.ReadString(&t.name, what); !s.ok()) return s;
  const std::string label = absl::StrCat("tensor '", t.name, "'");
  uint32_t n_dims = 0;
  if (auto s = c.Read(&n_dims, absl::StrCat("n_dims of ", label)); !s.ok()) return s;
  if (n_dims == 0 || n_dims > kMaxDims) {
    return c.Error(absl::StrFormat("%s: n_dims %d at byte %d is out of range (1..%d)", label,
                                   n_dims, c.pos() - 4, kMaxDims));
  }
  t.n_elements = 1;
  for (uint32_t d = 0; d < n_dims; ++d) {
    uint64_t raw = 0;
    if (auto s = c.Read(&raw, absl::StrCat("dimensions of ", label)); !s.ok()) return s;
    const auto dim = static_cast<int64_t>(raw);
    if (dim <= 0) {
      return c.Error(absl::StrFormat("%s: dimension %d is %d (must be positive)", label, d, dim));
    }
    if (__builtin_mul_overflow(t.n_elements, dim, &t.n_elements) || t.n_elements > kMaxElements) {
      return c.Error(
          absl::StrFormat("%s: element count overflows or exceeds 2^50 at dimension %d", label, d));
    }
    t.dims.push_back(dim);
  }
  uint32_t raw_type = 0;
  if (auto s = c.Read(&raw_type, absl::StrCat("type of ", label)); !s.ok()) return s;
  const GgmlTypeInfo* info = FindGgmlType(raw_type);
  if (info == nullptr) {
    return c.Error(
        absl::StrFormat("%s: unknown ggml type %d at byte %d", label, raw_type, c.pos() - 4));
  }
  t.type = info->type;
  if (t.dims[0] % info->block_size != 0) {
    return c.Error(absl::StrFormat("%s: row length %d is not a multiple of the %s block size %d",
                                   label, t.dims[0], info->name, info->block_size));
  }
  uint64_t rows = static_cast<uint64_t>(t.n_elements / t.dims[0]);
  if (__builtin_mul_overflow(static_cast<uint64_t>(RowBytes(t.type, t.dims[0])), rows,
                             &t.size_bytes)) {
    return c.Error(absl::StrFormat("%s: data size overflows", label));
  }
  if (auto s = c.Read(&t.offset, absl::StrCat("data offset of ", label)); !s.ok()) return s;
  return t;
}

// Checks that each tensor's data is aligned, inside the file and overlaps no other tensor, and
// points `data` at it.
absl::Status PlaceTensors(const Cursor& c, const uint8_t* base, uint64_t size, uint64_t data_offset,
                          uint64_t alignment, std::vector<GgufTensorInfo>& tensors) {
  for (GgufTensorInfo& t : tensors) {
    if (t.offset % alignment != 0) {
      return c.Error(absl::StrFormat("tensor '%s': offset %d is not a multiple of the alignment %d",
                                     t.name, t.offset, alignment));
    }
    uint64_t start = 0;
    uint64_t end = 0;
    if (__builtin_add_overflow(data_offset, t.offset, &start) ||
        __builtin_add_overflow(start, t.size_bytes, &end) || end > size) {
      return c.Error(absl::StrFormat(
          "tensor '%s' data [offset %d, %d bytes] extends past the end of the file (%d bytes; the "
          "data section starts at byte %d)",
          t.name, t.offset, t.size_bytes, size, data_offset));
    }
    t.data = base + start;
  }
  std::vector<const GgufTensorInfo*> by_offset;
  by_offset.reserve(tensors.size());
  for (const GgufTensorInfo& t : tensors) by_offset.push_back(&t);
  std::sort(by_offset.begin(), by_offset.end(),
            [](const auto* a, const auto* b) { return a->offset < b->offset; });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const GgufTensorInfo& a = *by_offset[i - 1];
    const GgufTensorInfo& b = *by_offset[i];
    if (a.offset + a.size_bytes > b.offset) {
      return c.Error(absl::StrFormat(
          "tensors '%s' [offset %d, %d bytes] and '%s' [offset %d, %d bytes] overlap", a.name,
          a.offset, a.size_bytes, b.name, b.offset, b.size_bytes));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status GgufFile::Parse() {
  Cursor c(base_, size_, path_.empty() ? std::string("GGUF data") : path_);
  char magic[4] = {};
  if (auto s = c.Read(&magic, "magic"); !s.ok()) {
    return c.Error(absl::StrFormat("not a GGUF file: only %d bytes", size_));
  }
  if (std::memcmp(magic, "PWRI", 4) == 0) {
    powerinfer_ = true;
  } else if (std::memcmp(magic, "GGUF", 4) != 0) {
    return c.Error(absl::StrFormat("not a GGUF file: magic is \"%s\", expected \"GGUF\"",
                                   absl::CHexEscape(absl::string_view(magic, 4))));
  }
  if (auto s = c.Read(&version_, "version"); !s.ok()) return s;
  // Version 2 made every count and length 64-bit; version 3 only allowed big-endian files
  // (marked by the byte order of this very field), so a little-endian v2 file is laid out as v3.
  if (version_ == 1) {
    return c.Error(
        "GGUF version 1 is not supported (its counts and lengths are 32-bit); convert the file "
        "with a current llama.cpp (gguf-py's gguf_convert_endian / re-quantize it)");
  }
  if (version_ != 2 && version_ != 3) {
    const bool swapped = __builtin_bswap32(version_) <= 3;
    return c.Error(
        absl::StrFormat("unsupported GGUF version %d (this reader handles versions 2 and 3)%s",
                        version_, swapped ? "; the file looks big-endian" : ""));
  }
  uint64_t tensor_count = 0;
  uint64_t kv_count = 0;
  if (auto s = c.Read(&tensor_count, "tensor count"); !s.ok()) return s;
  if (auto s = c.Read(&kv_count, "metadata count"); !s.ok()) return s;
  if (tensor_count > c.remaining() / kMinTensorInfoBytes) {
    return c.Error(absl::StrFormat(
        "tensor count %d is impossible: the %d bytes after the header hold at most %d tensor "
        "infos (file truncated or corrupt)",
        tensor_count, c.remaining(), c.remaining() / kMinTensorInfoBytes));
  }
  if (kv_count > c.remaining() / kMinKeyValueBytes) {
    return c.Error(absl::StrFormat(
        "metadata count %d is impossible: the %d bytes after the header hold at most %d "
        "key/values (file truncated or corrupt)",
        kv_count, c.remaining(), c.remaining() / kMinKeyValueBytes));
  }

  std::unordered_set<std::string> keys;
  metadata_.reserve(std::min<uint64_t>(kv_count, kMaxReserve));
  for (uint64_t i = 0; i < kv_count; ++i) {
    GgufKeyValue kv;
    auto what = [&] { return absl::StrCat("key #", i); };
    if (auto s = c.ReadString(&kv.key, what); !s.ok()) return s;
    if (!keys.insert(kv.key).second) {
      return c.Error(absl::StrFormat("duplicate metadata key '%s' (key #%d)", kv.key, i));
    }
    uint32_t raw_type = 0;
    if (auto s = c.Read(&raw_type, absl::StrCat("value type of key '", kv.key, "'")); !s.ok()) {
      return s;
    }
    absl::StatusOr<GgufValue> value = ReadValue(c, raw_type, kv.key);
    if (!value.ok()) return value.status();
    kv.value = *std::move(value);
    metadata_.push_back(std::move(kv));
  }

  if (const GgufValue* a = Find("general.alignment"); a != nullptr) {
    if (a->type() != GgufValueType::kUint32) {
      return c.Error(absl::StrFormat("general.alignment must be a uint32, not %s",
                                     a->is_array() ? "an array" : GgufValueTypeName(a->type())));
    }
    alignment_ = a->AsUint().value_or(0);
    if (alignment_ == 0 || !std::has_single_bit(alignment_)) {
      return c.Error(
          absl::StrFormat("general.alignment %d is not a nonzero power of two", alignment_));
    }
  }

  std::unordered_set<std::string> names;
  tensors_.reserve(std::min<uint64_t>(tensor_count, kMaxReserve));
  for (uint64_t i = 0; i < tensor_count; ++i) {
    absl::StatusOr<GgufTensorInfo> t = ReadTensorInfo(c, i);
    if (!t.ok()) return t.status();
    if (!names.insert(t->name).second) {
      return c.Error(absl::StrFormat("duplicate tensor name '%s' (tensor #%d)", t->name, i));
    }
    tensors_.push_back(*std::move(t));
  }

  // The data section starts at the end of the tensor infos, rounded up to the alignment.
  data_offset_ = (c.pos() + alignment_ - 1) / alignment_ * alignment_;
  return PlaceTensors(c, base_, size_, data_offset_, alignment_, tensors_);
}

}  // namespace thermocline
