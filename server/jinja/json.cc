#include "server/jinja/json.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "server/jinja/cat.h"
#include "server/jinja/error.h"
#include "server/jinja/strings.h"

namespace thermocline::server::jinja {
namespace {

void AppendEscape(char32_t c, std::string* out) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "\\u%04x", static_cast<unsigned>(c));
  *out += buf;
}

void AppendString(std::string_view s, bool ensure_ascii, std::string* out) {
  out->push_back('"');
  auto short_escape = [&](char32_t c) {
    switch (c) {
      case '"':
        *out += "\\\"";
        return true;
      case '\\':
        *out += "\\\\";
        return true;
      case '\n':
        *out += "\\n";
        return true;
      case '\r':
        *out += "\\r";
        return true;
      case '\t':
        *out += "\\t";
        return true;
      case '\b':
        *out += "\\b";
        return true;
      case '\f':
        *out += "\\f";
        return true;
      default:
        return false;
    }
  };
  if (!ensure_ascii) {
    for (char ch : s) {
      const unsigned char c = static_cast<unsigned char>(ch);
      if (short_escape(c)) continue;
      if (c < 0x20) {
        AppendEscape(c, out);
      } else {
        out->push_back(ch);
      }
    }
  } else {
    for (char32_t c : DecodeUtf8(s)) {
      if (short_escape(c)) continue;
      if (c >= 0x20 && c < 0x7F) {
        out->push_back(static_cast<char>(c));
      } else if (c >= 0x10000) {
        const char32_t v = c - 0x10000;
        AppendEscape(0xD800 + (v >> 10), out);
        AppendEscape(0xDC00 + (v & 0x3FF), out);
      } else {
        AppendEscape(c, out);
      }
    }
  }
  out->push_back('"');
}

std::string FloatJson(double f) {
  if (std::isnan(f)) return "NaN";
  if (std::isinf(f)) return f < 0 ? "-Infinity" : "Infinity";
  return FloatRepr(f);
}

std::string KeyText(const Value& k) {
  switch (k.kind()) {
    case Value::Kind::kString:
      return k.str();
    case Value::Kind::kBool:
      return k.bool_value() ? "true" : "false";
    case Value::Kind::kNone:
      return "null";
    case Value::Kind::kInt:
      return std::to_string(k.int_value());
    case Value::Kind::kFloat:
      return FloatJson(k.float_value());
    default:
      Fail(Cat("keys must be str, int, float, bool or None, not ", TypeName(k)));
  }
}

class Writer {
 public:
  explicit Writer(const JsonOptions& o) : o_(o) {
    item_sep_ = o.item_separator ? *o.item_separator : (o.indent ? "," : ", ");
    key_sep_ = o.key_separator ? *o.key_separator : ": ";
  }

  void Write(const Value& v, int depth, std::string* out) {
    switch (v.kind()) {
      case Value::Kind::kNone:
        *out += "null";
        return;
      case Value::Kind::kBool:
        *out += v.bool_value() ? "true" : "false";
        return;
      case Value::Kind::kInt:
        *out += std::to_string(v.int_value());
        return;
      case Value::Kind::kFloat:
        *out += FloatJson(v.float_value());
        return;
      case Value::Kind::kString:
        AppendString(v.str(), o_.ensure_ascii, out);
        return;
      case Value::Kind::kList: {
        const ValueList& items = v.list();
        if (items.empty()) {
          *out += "[]";
          return;
        }
        out->push_back('[');
        for (size_t i = 0; i < items.size(); ++i) {
          if (i > 0) *out += item_sep_;
          Newline(depth + 1, out);
          Write(items[i], depth + 1, out);
        }
        Newline(depth, out);
        out->push_back(']');
        return;
      }
      case Value::Kind::kDict: {
        std::vector<std::pair<std::string, const Value*>> items;
        for (const auto& [k, val] : v.dict().items()) items.emplace_back(KeyText(k), &val);
        if (items.empty()) {
          *out += "{}";
          return;
        }
        if (o_.sort_keys) {
          std::stable_sort(items.begin(), items.end(),
                           [](const auto& a, const auto& b) { return a.first < b.first; });
        }
        out->push_back('{');
        for (size_t i = 0; i < items.size(); ++i) {
          if (i > 0) *out += item_sep_;
          Newline(depth + 1, out);
          AppendString(items[i].first, o_.ensure_ascii, out);
          *out += key_sep_;
          Write(*items[i].second, depth + 1, out);
        }
        Newline(depth, out);
        out->push_back('}');
        return;
      }
      case Value::Kind::kUndefined:
      case Value::Kind::kObject:
        Fail(Cat("Object of type ", TypeName(v), " is not JSON serializable"));
    }
  }

 private:
  void Newline(int depth, std::string* out) const {
    if (!o_.indent) return;
    out->push_back('\n');
    for (int i = 0; i < depth; ++i) *out += *o_.indent;
  }

  const JsonOptions& o_;
  std::string item_sep_, key_sep_;
};

template <typename J>
Value Convert(const J& j) {
  switch (j.type()) {
    case nlohmann::json::value_t::null:
    case nlohmann::json::value_t::discarded:
      return Value::None();
    case nlohmann::json::value_t::boolean:
      return Value(j.template get<bool>());
    case nlohmann::json::value_t::number_integer:
      return Value(j.template get<int64_t>());
    case nlohmann::json::value_t::number_unsigned: {
      const uint64_t u = j.template get<uint64_t>();
      if (u > static_cast<uint64_t>(INT64_MAX)) return Value(static_cast<double>(u));
      return Value(static_cast<int64_t>(u));
    }
    case nlohmann::json::value_t::number_float:
      return Value(j.template get<double>());
    case nlohmann::json::value_t::string:
      return Value(j.template get<std::string>());
    case nlohmann::json::value_t::array: {
      ValueList items;
      items.reserve(j.size());
      for (const auto& item : j) items.push_back(Convert(item));
      return Value::List(std::move(items));
    }
    case nlohmann::json::value_t::object: {
      Dict d;
      for (const auto& [k, item] : j.items()) d.Set(Value(k), Convert(item));
      return Value::MakeDict(std::move(d));
    }
    case nlohmann::json::value_t::binary:
      return Value::None();
  }
  return Value::None();
}

}  // namespace

std::string ToJson(const Value& v, const JsonOptions& options) {
  std::string out;
  Writer(options).Write(v, 0, &out);
  return out;
}

Value FromJson(const nlohmann::ordered_json& j) { return Convert(j); }
Value FromJson(const nlohmann::json& j) { return Convert(j); }

}  // namespace thermocline::server::jinja
