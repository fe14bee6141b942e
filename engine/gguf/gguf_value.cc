// GgufValue: construction, typed access and the one-line rendering `inspect` prints.
#include <algorithm>
#include <charconv>
#include <cstdint>
#include <iterator>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "engine/gguf/gguf.h"

namespace thermocline {
namespace {

constexpr size_t kMaxDebugStringBytes = 60;

// Shortest text that reads back to the same float (or double).
template <typename T>
std::string ShortestFloat(T v) {
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), v);
  if (ec != std::errc()) return absl::StrFormat("%g", static_cast<double>(v));
  return std::string(buf, end);
}

std::string FormatDouble(GgufValueType type, double v) {
  return type == GgufValueType::kFloat32 ? ShortestFloat(static_cast<float>(v)) : ShortestFloat(v);
}

// Quoted, with control characters escaped and the body cut at a UTF-8 boundary.
std::string QuoteString(const std::string& s) {
  size_t n = s.size();
  if (n > kMaxDebugStringBytes) {
    n = kMaxDebugStringBytes;
    while (n > 0 && (static_cast<unsigned char>(s[n]) & 0xC0) == 0x80) --n;
  }
  std::string out = "\"";
  for (size_t i = 0; i < n; ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c < 0x20 || c == 0x7F) {
      out += absl::StrFormat("\\x%02x", c);
    } else {
      out += static_cast<char>(c);
    }
  }
  out += '"';
  if (n < s.size()) absl::StrAppend(&out, "... (", s.size(), " bytes)");
  return out;
}

// "e0, e1, ..., e{max-1}, ..." for any element vector.
template <typename T, typename F>
std::string JoinElements(const std::vector<T>& v, size_t max_elements, F format) {
  std::string out;
  const size_t n = std::min(v.size(), max_elements);
  for (size_t i = 0; i < n; ++i) {
    if (i > 0) out += ", ";
    out += format(v[i]);
  }
  if (n < v.size()) out += n > 0 ? ", ..." : "...";
  return out;
}

}  // namespace

std::string_view GgufValueTypeName(GgufValueType type) {
  // Indexed by the GGUF type number.
  static constexpr std::string_view kNames[] = {"uint8",  "int8",    "uint16", "int16",  "uint32",
                                                "int32",  "float32", "bool",   "string", "array",
                                                "uint64", "int64",   "float64"};
  const auto i = static_cast<uint32_t>(type);
  return i < std::size(kNames) ? kNames[i] : "unknown";
}

GgufValue GgufValue::Uint(GgufValueType type, uint64_t v) {
  GgufValue out;
  out.type_ = type;
  out.value_ = v;
  return out;
}

GgufValue GgufValue::Int(GgufValueType type, int64_t v) {
  GgufValue out;
  out.type_ = type;
  out.value_ = v;
  return out;
}

GgufValue GgufValue::Float(GgufValueType type, double v) {
  GgufValue out;
  out.type_ = type;
  out.value_ = v;
  return out;
}

GgufValue GgufValue::Bool(bool v) {
  GgufValue out;
  out.type_ = GgufValueType::kBool;
  out.value_ = v;
  return out;
}

GgufValue GgufValue::String(std::string v) {
  GgufValue out;
  out.type_ = GgufValueType::kString;
  out.value_ = std::move(v);
  return out;
}

GgufValue GgufValue::StringArray(std::vector<std::string> v) {
  GgufValue out;
  out.type_ = GgufValueType::kArray;
  out.array_type_ = GgufValueType::kString;
  out.value_ = std::move(v);
  return out;
}

GgufValue GgufValue::IntArray(GgufValueType element_type, std::vector<int64_t> v) {
  GgufValue out;
  out.type_ = GgufValueType::kArray;
  out.array_type_ = element_type;
  out.value_ = std::move(v);
  return out;
}

GgufValue GgufValue::UintArray(GgufValueType element_type, std::vector<uint64_t> v) {
  GgufValue out;
  out.type_ = GgufValueType::kArray;
  out.array_type_ = element_type;
  out.value_ = std::move(v);
  return out;
}

GgufValue GgufValue::FloatArray(GgufValueType element_type, std::vector<double> v) {
  GgufValue out;
  out.type_ = GgufValueType::kArray;
  out.array_type_ = element_type;
  out.value_ = std::move(v);
  return out;
}

size_t GgufValue::array_size() const {
  if (!is_array()) return 0;
  return std::visit(
      [](const auto& v) -> size_t {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, std::vector<std::string>> ||
                      std::is_same_v<T, std::vector<int64_t>> ||
                      std::is_same_v<T, std::vector<uint64_t>> ||
                      std::is_same_v<T, std::vector<double>>) {
          return v.size();
        } else {
          return 0;
        }
      },
      value_);
}

std::optional<int64_t> GgufValue::AsInt() const {
  if (const auto* v = std::get_if<int64_t>(&value_)) return *v;
  if (const auto* v = std::get_if<uint64_t>(&value_)) {
    if (*v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return std::nullopt;
    return static_cast<int64_t>(*v);
  }
  if (const auto* v = std::get_if<bool>(&value_)) return *v ? 1 : 0;
  return std::nullopt;
}

std::optional<uint64_t> GgufValue::AsUint() const {
  if (const auto* v = std::get_if<uint64_t>(&value_)) return *v;
  if (const auto* v = std::get_if<int64_t>(&value_)) {
    if (*v < 0) return std::nullopt;
    return static_cast<uint64_t>(*v);
  }
  if (const auto* v = std::get_if<bool>(&value_)) return *v ? 1 : 0;
  return std::nullopt;
}

std::optional<double> GgufValue::AsDouble() const {
  if (const auto* v = std::get_if<double>(&value_)) return *v;
  if (const auto* v = std::get_if<int64_t>(&value_)) return static_cast<double>(*v);
  if (const auto* v = std::get_if<uint64_t>(&value_)) return static_cast<double>(*v);
  return std::nullopt;
}

std::optional<bool> GgufValue::AsBool() const {
  if (const auto* v = std::get_if<bool>(&value_)) return *v;
  return std::nullopt;
}

const std::string* GgufValue::AsString() const {
  if (is_array()) return nullptr;
  return std::get_if<std::string>(&value_);
}

const std::vector<std::string>* GgufValue::AsStringArray() const {
  return std::get_if<std::vector<std::string>>(&value_);
}

const std::vector<int64_t>* GgufValue::AsIntArray() const {
  return std::get_if<std::vector<int64_t>>(&value_);
}

const std::vector<uint64_t>* GgufValue::AsUintArray() const {
  return std::get_if<std::vector<uint64_t>>(&value_);
}

const std::vector<double>* GgufValue::AsDoubleArray() const {
  return std::get_if<std::vector<double>>(&value_);
}

std::string GgufValue::DebugString(size_t max_elements) const {
  if (is_array()) {
    std::string out = absl::StrFormat("[%s x %d]", GgufValueTypeName(array_type_), array_size());
    std::string elements;
    if (const auto* v = AsStringArray()) {
      elements = JoinElements(*v, max_elements, QuoteString);
    } else if (const auto* v = AsIntArray()) {
      const bool is_bool = array_type_ == GgufValueType::kBool;
      elements = JoinElements(*v, max_elements, [is_bool](int64_t x) {
        return is_bool ? std::string(x != 0 ? "true" : "false") : absl::StrCat(x);
      });
    } else if (const auto* v = AsUintArray()) {
      elements = JoinElements(*v, max_elements, [](uint64_t x) { return absl::StrCat(x); });
    } else if (const auto* v = AsDoubleArray()) {
      const GgufValueType t = array_type_;
      elements = JoinElements(*v, max_elements, [t](double x) { return FormatDouble(t, x); });
    }
    if (!elements.empty()) absl::StrAppend(&out, " ", elements);
    return out;
  }
  if (const auto* v = std::get_if<std::string>(&value_)) return QuoteString(*v);
  if (const auto* v = std::get_if<bool>(&value_)) return *v ? "true" : "false";
  if (const auto* v = std::get_if<int64_t>(&value_)) return absl::StrCat(*v);
  if (const auto* v = std::get_if<uint64_t>(&value_)) return absl::StrCat(*v);
  if (const auto* v = std::get_if<double>(&value_)) return FormatDouble(type_, *v);
  return "(empty)";
}

}  // namespace thermocline
