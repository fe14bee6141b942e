#include "server/jinja/value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "server/jinja/cat.h"
#include "server/jinja/error.h"
#include "server/jinja/strings.h"

namespace thermocline::server::jinja {
namespace {

// Python prints these with escapes in repr() (str.isprintable() is false for them); other
// non-ASCII text is printed as is.
bool NonPrintable(char32_t c) {
  return c < 0x20 || c == 0x7F || (c >= 0x80 && c <= 0xA0) || c == 0xAD ||
         (c >= 0x2000 && c <= 0x200F) || (c >= 0x2028 && c <= 0x202F) ||
         (c >= 0x205F && c <= 0x206F) || c == 0x3000 || c == 0xFEFF ||
         (c >= 0xFFF9 && c <= 0xFFFB) || (c >= 0xD800 && c <= 0xDFFF);
}

std::string StringRepr(std::string_view s) {
  const bool has_single = s.find('\'') != s.npos;
  const bool has_double = s.find('"') != s.npos;
  const char quote = has_single && !has_double ? '"' : '\'';
  std::string out(1, quote);
  for (char32_t c : DecodeUtf8(s)) {
    if (c == static_cast<char32_t>(quote) || c == '\\') {
      out.push_back('\\');
      out.push_back(static_cast<char>(c));
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (NonPrintable(c)) {
      char buf[16];
      if (c < 0x100) {
        std::snprintf(buf, sizeof(buf), "\\x%02x", static_cast<unsigned>(c));
      } else {
        std::snprintf(buf, sizeof(buf), "\\u%04x", static_cast<unsigned>(c));
      }
      out += buf;
    } else {
      AppendUtf8(c, &out);
    }
  }
  out.push_back(quote);
  return out;
}

// str() of a list, tuple or dict: the items' repr().
std::string ContainerStr(const Value& v) {
  std::string out;
  if (v.is_list()) {
    out.push_back(v.is_tuple() ? '(' : '[');
    const ValueList& items = v.list();
    for (size_t i = 0; i < items.size(); ++i) {
      if (i > 0) out.append(", ");
      out.append(Repr(items[i]));
    }
    if (v.is_tuple() && items.size() == 1) out.push_back(',');
    out.push_back(v.is_tuple() ? ')' : ']');
    return out;
  }
  out.push_back('{');
  bool first = true;
  for (const auto& [k, val] : v.dict().items()) {
    if (!first) out.append(", ");
    first = false;
    CatTo(&out, Repr(k), ": ", Repr(val));
  }
  out.push_back('}');
  return out;
}

bool SameSequenceKind(const Value& a, const Value& b) { return a.is_tuple() == b.is_tuple(); }

}  // namespace

const Value* Dict::Find(const Value& key) const {
  if (key.is_string()) return Find(std::string_view(key.str()));
  for (const Item& item : items_) {
    if (Equal(item.first, key)) return &item.second;
  }
  return nullptr;
}

const Value* Dict::Find(std::string_view key) const {
  for (const Item& item : items_) {
    if (item.first.is_string() && item.first.str() == key) return &item.second;
  }
  return nullptr;
}

void Dict::Set(Value key, Value value) {
  for (Item& item : items_) {
    if (Equal(item.first, key)) {
      item.second = std::move(value);
      return;
    }
  }
  items_.emplace_back(std::move(key), std::move(value));
}

Value Value::None() {
  Value v;
  v.kind_ = Kind::kNone;
  return v;
}

Value Value::Undefined(std::string hint, bool unsafe) {
  Value v;
  v.str_ = std::move(hint);
  v.tuple_ = unsafe;
  return v;
}

Value Value::List(ValueList items) {
  Value v;
  v.kind_ = Kind::kList;
  v.list_ = std::make_shared<const ValueList>(std::move(items));
  return v;
}

Value Value::Tuple(ValueList items) {
  Value v = List(std::move(items));
  v.tuple_ = true;
  return v;
}

Value Value::MakeDict(Dict dict) {
  Value v;
  v.kind_ = Kind::kDict;
  v.dict_ = std::make_shared<const Dict>(std::move(dict));
  return v;
}

Value Value::MakeObject(std::shared_ptr<Object> object) {
  Value v;
  v.kind_ = Kind::kObject;
  v.object_ = std::move(object);
  return v;
}

Value Object::Call(Interpreter&, CallArgs&) const {
  Fail(Cat("'", TypeName(), "' object is not callable"));
}

std::string Object::Str() const { return Cat("<", TypeName(), " object>"); }

bool Truthy(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone:
      return false;
    case Value::Kind::kBool:
    case Value::Kind::kInt:
      return v.int_value() != 0;
    case Value::Kind::kFloat:
      return v.float_value() != 0;
    case Value::Kind::kString:
      return !v.str().empty();
    case Value::Kind::kList:
      return !v.list().empty();
    case Value::Kind::kDict:
      return v.dict().size() != 0;
    case Value::Kind::kObject:
      return true;
  }
  return false;
}

bool Equal(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (!a.is_float() && !b.is_float()) return a.int_value() == b.int_value();
    return a.number() == b.number();
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone:
      return true;
    case Value::Kind::kString:
      return a.str() == b.str();
    case Value::Kind::kList: {
      if (!SameSequenceKind(a, b) || a.list().size() != b.list().size()) return false;
      for (size_t i = 0; i < a.list().size(); ++i) {
        if (!Equal(a.list()[i], b.list()[i])) return false;
      }
      return true;
    }
    case Value::Kind::kDict: {
      if (a.dict().size() != b.dict().size()) return false;
      for (const auto& [k, v] : a.dict().items()) {
        const Value* other = b.dict().Find(k);
        if (other == nullptr || !Equal(v, *other)) return false;
      }
      return true;
    }
    case Value::Kind::kObject:
      return a.object() == b.object();
    default:
      return false;
  }
}

bool Less(const Value& a, const Value& b) {
  if (a.is_undefined() || b.is_undefined()) {
    Fail(a.is_undefined() ? a.str() : b.str());
  }
  if (a.is_number() && b.is_number()) {
    if (!a.is_float() && !b.is_float()) return a.int_value() < b.int_value();
    return a.number() < b.number();
  }
  if (a.is_string() && b.is_string()) return a.str() < b.str();  // UTF-8 order = code points
  if (a.is_list() && b.is_list() && SameSequenceKind(a, b)) {
    const ValueList& x = a.list();
    const ValueList& y = b.list();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (!Equal(x[i], y[i])) return Less(x[i], y[i]);
    }
    return x.size() < y.size();
  }
  Fail(Cat("'<' not supported between instances of '", TypeName(a), "' and '", TypeName(b), "'"));
}

std::string TypeName(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return "Undefined";
    case Value::Kind::kNone:
      return "NoneType";
    case Value::Kind::kBool:
      return "bool";
    case Value::Kind::kInt:
      return "int";
    case Value::Kind::kFloat:
      return "float";
    case Value::Kind::kString:
      return "str";
    case Value::Kind::kList:
      return v.is_tuple() ? "tuple" : "list";
    case Value::Kind::kDict:
      return "dict";
    case Value::Kind::kObject:
      return v.object()->TypeName();
  }
  return "object";
}

std::string FloatRepr(double f) {
  if (std::isnan(f)) return "nan";
  if (std::isinf(f)) return f < 0 ? "-inf" : "inf";
  if (f == 0) return std::signbit(f) ? "-0.0" : "0.0";
  // The shortest digits that read back as f, as Python's repr() picks them.
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), f, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  const bool negative = sci[0] == '-';
  if (negative) sci.erase(0, 1);
  const size_t e_pos = sci.find('e');
  std::string digits = sci.substr(0, e_pos);
  digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
  const int exponent = std::stoi(sci.substr(e_pos + 1));
  std::string out = negative ? "-" : "";
  if (exponent < -4 || exponent >= 16) {
    out += digits.substr(0, 1);
    if (digits.size() > 1) CatTo(&out, ".", digits.substr(1));
    char exp[16];
    std::snprintf(exp, sizeof(exp), "e%c%02d", exponent < 0 ? '-' : '+', std::abs(exponent));
    return out + exp;
  }
  if (exponent < 0) {
    return Cat(out, "0.", std::string(-exponent - 1, '0'), digits);
  }
  const size_t int_digits = static_cast<size_t>(exponent) + 1;
  if (digits.size() <= int_digits) {
    return Cat(out, digits, std::string(int_digits - digits.size(), '0'), ".0");
  }
  return Cat(out, digits.substr(0, int_digits), ".", digits.substr(int_digits));
}

std::string ToStr(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return "";
    case Value::Kind::kNone:
      return "None";
    case Value::Kind::kBool:
      return v.bool_value() ? "True" : "False";
    case Value::Kind::kInt:
      return std::to_string(v.int_value());
    case Value::Kind::kFloat:
      return FloatRepr(v.float_value());
    case Value::Kind::kString:
      return v.str();
    case Value::Kind::kList:
    case Value::Kind::kDict:
      return ContainerStr(v);
    case Value::Kind::kObject:
      return v.object()->Str();
  }
  return "";
}

std::string Repr(const Value& v) {
  if (v.is_string()) return StringRepr(v.str());
  if (v.is_undefined()) return "Undefined";
  return ToStr(v);
}

}  // namespace thermocline::server::jinja
