// Python's arithmetic, concatenation, % formatting and membership on template values.
#include <cctype>
#include <cmath>
#include <cstdio>
#include <limits>

#include "server/jinja/cat.h"
#include "server/jinja/error.h"
#include "server/jinja/interpreter.h"
#include "server/jinja/strings.h"

namespace thermocline::server::jinja {
namespace {

const char* OpText(BinOp op) {
  switch (op) {
    case BinOp::kAdd:
      return "+";
    case BinOp::kSub:
      return "-";
    case BinOp::kMul:
      return "*";
    case BinOp::kDiv:
      return "/";
    case BinOp::kFloorDiv:
      return "//";
    case BinOp::kMod:
      return "%";
    case BinOp::kPow:
      return "** or pow()";
    default:
      return "?";
  }
}

[[noreturn]] void Unsupported(BinOp op, const Value& a, const Value& b) {
  Fail(Cat("unsupported operand type(s) for ", OpText(op), ": '", TypeName(a), "' and '",
           TypeName(b), "'"));
}

int64_t CheckedInt(__int128 v) {
  if (v > std::numeric_limits<int64_t>::max() || v < std::numeric_limits<int64_t>::min()) {
    Fail("integer overflow");
  }
  return static_cast<int64_t>(v);
}

// The largest string or list "x * n", "x + y" or "x ~ y" may build.
constexpr size_t kMaxRepeat = 64u << 20;

std::string CheckedSize(std::string s) {
  if (s.size() > kMaxRepeat) Fail("the string would be too large");
  return s;
}

Value Repeat(const Value& seq, int64_t n) {
  const size_t unit = seq.is_string() ? seq.str().size() : seq.list().size();
  if (n > 0 && unit > 0 && static_cast<uint64_t>(n) > kMaxRepeat / unit) {
    Fail("the repeated value would be too large");
  }
  if (seq.is_string()) {
    std::string out;
    for (int64_t i = 0; i < n; ++i) out += seq.str();
    return Value(std::move(out));
  }
  ValueList out;
  for (int64_t i = 0; i < n; ++i) out.insert(out.end(), seq.list().begin(), seq.list().end());
  return seq.is_tuple() ? Value::Tuple(std::move(out)) : Value::List(std::move(out));
}

double FloorMod(double a, double b) {
  double m = std::fmod(a, b);
  if (m != 0 && ((m < 0) != (b < 0))) m += b;
  return m;
}

// printf-style "fmt % args" for the conversions templates use: s r d i f e g x o c and %%.
std::string PercentFormat(const std::string& fmt, const Value& args) {
  std::vector<Value> positional;
  const Dict* mapping = nullptr;
  if (args.is_tuple()) {
    positional = args.list();
  } else if (args.is_dict()) {
    mapping = &args.dict();
  } else {
    positional.push_back(args);
  }
  size_t next = 0;
  std::string out;
  for (size_t i = 0; i < fmt.size(); ++i) {
    if (fmt[i] != '%') {
      out.push_back(fmt[i]);
      continue;
    }
    if (++i >= fmt.size()) Fail("incomplete format");
    const Value* arg = nullptr;
    if (fmt[i] == '(') {
      const size_t close = fmt.find(')', i);
      if (close == std::string::npos || mapping == nullptr) Fail("format requires a mapping");
      arg = mapping->Find(std::string_view(fmt).substr(i + 1, close - i - 1));
      if (arg == nullptr) Fail(Cat("KeyError: ", fmt.substr(i + 1, close - i - 1)));
      i = close + 1;
    }
    std::string spec = "%";
    while (i < fmt.size() && std::string_view("-+ #0").find(fmt[i]) != std::string_view::npos)
      spec.push_back(fmt[i++]);
    while (i < fmt.size() && (std::isdigit(static_cast<unsigned char>(fmt[i])) || fmt[i] == '.'))
      spec.push_back(fmt[i++]);
    if (i >= fmt.size()) Fail("incomplete format");
    const char conv = fmt[i];
    if (conv == '%') {
      out.push_back('%');
      continue;
    }
    if (arg == nullptr) {
      if (next >= positional.size()) Fail("not enough arguments for format string");
      arg = &positional[next++];
    }
    char buf[512];
    switch (conv) {
      case 's':
      case 'r': {
        const std::string s = conv == 's' ? ToStr(*arg) : Repr(*arg);
        std::snprintf(buf, sizeof(buf), (spec + "s").c_str(), s.c_str());
        out += s.size() >= sizeof(buf) - 1 ? s : std::string(buf);
        break;
      }
      case 'd':
      case 'i':
      case 'x':
      case 'X':
      case 'o':
        if (!arg->is_number())
          Fail(Cat("%", std::string(1, conv), " format: a number is required, not ",
                   TypeName(*arg)));
        std::snprintf(buf, sizeof(buf),
                      (spec + "ll" + std::string(1, conv == 'i' ? 'd' : conv)).c_str(),
                      static_cast<long long>(arg->is_float() ? std::trunc(arg->float_value())
                                                             : arg->int_value()));
        out += buf;
        break;
      case 'f':
      case 'F':
      case 'e':
      case 'E':
      case 'g':
      case 'G':
        if (!arg->is_number()) Fail(Cat("must be real number, not ", TypeName(*arg)));
        std::snprintf(buf, sizeof(buf), (spec + std::string(1, conv)).c_str(), arg->number());
        out += buf;
        break;
      case 'c':
        if (arg->is_string()) {
          out += arg->str();
        } else {
          AppendUtf8(static_cast<char32_t>(arg->int_value()), &out);
        }
        break;
      default:
        Fail(Cat("unsupported format character '", std::string(1, conv), "'"));
    }
  }
  if (mapping == nullptr && next < positional.size()) {
    Fail("not all arguments converted during string formatting");
  }
  return out;
}

}  // namespace

Value BinaryOp(BinOp op, const Value& a, const Value& b) {
  if (op == BinOp::kConcat) return Value(CheckedSize(ToStr(a) + ToStr(b)));
  if (a.is_undefined()) Fail(a.str());
  if (b.is_undefined()) Fail(b.str());
  const bool ints = (a.is_int() || a.is_bool()) && (b.is_int() || b.is_bool());
  const bool nums = a.is_number() && b.is_number();
  switch (op) {
    case BinOp::kAdd:
      if (ints) return Value(CheckedInt(static_cast<__int128>(a.int_value()) + b.int_value()));
      if (nums) return Value(a.number() + b.number());
      if (a.is_string() && b.is_string()) return Value(CheckedSize(a.str() + b.str()));
      if (a.is_list() && b.is_list() && a.is_tuple() == b.is_tuple()) {
        ValueList out = a.list();
        out.insert(out.end(), b.list().begin(), b.list().end());
        return a.is_tuple() ? Value::Tuple(std::move(out)) : Value::List(std::move(out));
      }
      if (a.is_string() || a.is_list()) {
        Fail(Cat("can only concatenate ", TypeName(a), " (not \"", TypeName(b), "\") to ",
                 TypeName(a)));
      }
      Unsupported(op, a, b);
    case BinOp::kSub:
      if (ints) return Value(CheckedInt(static_cast<__int128>(a.int_value()) - b.int_value()));
      if (nums) return Value(a.number() - b.number());
      Unsupported(op, a, b);
    case BinOp::kMul:
      if (ints) return Value(CheckedInt(static_cast<__int128>(a.int_value()) * b.int_value()));
      if (nums) return Value(a.number() * b.number());
      if ((a.is_string() || a.is_list()) && (b.is_int() || b.is_bool()))
        return Repeat(a, b.int_value());
      if ((b.is_string() || b.is_list()) && (a.is_int() || a.is_bool()))
        return Repeat(b, a.int_value());
      Unsupported(op, a, b);
    case BinOp::kDiv:
      if (!nums) Unsupported(op, a, b);
      if (b.number() == 0) Fail("division by zero");
      return Value(a.number() / b.number());
    case BinOp::kFloorDiv:
      if (!nums) Unsupported(op, a, b);
      if (b.number() == 0) Fail("integer division or modulo by zero");
      if (ints) {
        const int64_t x = a.int_value(), y = b.int_value();
        int64_t q = x / y;
        if ((x % y != 0) && ((x < 0) != (y < 0))) --q;
        return Value(q);
      }
      return Value(std::floor(a.number() / b.number()));
    case BinOp::kMod:
      if (a.is_string()) return Value(PercentFormat(a.str(), b));
      if (!nums) Unsupported(op, a, b);
      if (b.number() == 0) Fail("integer division or modulo by zero");
      if (ints) {
        const int64_t x = a.int_value(), y = b.int_value();
        int64_t m = x % y;
        if (m != 0 && ((m < 0) != (y < 0))) m += y;
        return Value(m);
      }
      return Value(FloorMod(a.number(), b.number()));
    case BinOp::kPow:
      if (!nums) Unsupported(op, a, b);
      if (ints && b.int_value() >= 0) {
        __int128 r = 1;
        for (int64_t i = 0; i < b.int_value(); ++i) {
          r *= a.int_value();
          CheckedInt(r);
        }
        return Value(static_cast<int64_t>(r));
      }
      return Value(std::pow(a.number(), b.number()));
    default:
      Fail("internal error: not an arithmetic operator");
  }
}

bool Contains(const Value& container, const Value& item) {
  switch (container.kind()) {
    case Value::Kind::kUndefined:
      return false;
    case Value::Kind::kString:
      if (!item.is_string()) {
        Fail(Cat("'in <string>' requires string as left operand, not ", TypeName(item)));
      }
      return container.str().find(item.str()) != std::string::npos;
    case Value::Kind::kList:
      for (const Value& v : container.list()) {
        if (Equal(v, item)) return true;
      }
      return false;
    case Value::Kind::kDict:
      return container.dict().Find(item) != nullptr;
    default:
      Fail(Cat("argument of type '", TypeName(container), "' is not iterable"));
  }
}

}  // namespace thermocline::server::jinja
