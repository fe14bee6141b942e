// jinja2's builtin filters on strings and numbers (upper, trim, indent, int, round, ...), and
// HF transformers' tojson: Python's json.dumps with ensure_ascii=False. Each follows the jinja2
// 3.1 definition.
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "server/jinja/builtins.h"
#include "server/jinja/cat.h"
#include "server/jinja/error.h"
#include "server/jinja/filters_internal.h"
#include "server/jinja/interpreter.h"
#include "server/jinja/json.h"
#include "server/jinja/strings.h"

namespace thermocline::server::jinja {

Value FString(Interpreter&, const Value& v, CallArgs& args) {
  ArgBinder("string", args, {});
  return v.is_string() ? v : Value(ToStr(v));
}

Value FUpper(Interpreter&, const Value& v, CallArgs& args) {
  ArgBinder("upper", args, {});
  return Value(Upper(ToStr(v)));
}

Value FLower(Interpreter&, const Value& v, CallArgs& args) {
  ArgBinder("lower", args, {});
  return Value(Lower(ToStr(v)));
}

Value FCapitalize(Interpreter&, const Value& v, CallArgs& args) {
  ArgBinder("capitalize", args, {});
  return Value(Capitalize(ToStr(v)));
}

// jinja2's title: each run after one of -, whitespace, (, {, [, < starts upper case.
Value FTitle(Interpreter&, const Value& v, CallArgs& args) {
  ArgBinder("title", args, {});
  auto sep = [](char32_t c) {
    return c == '-' || c == '(' || c == '{' || c == '[' || c == '<' || IsSpace(c);
  };
  std::string out;
  bool first_of_piece = true;
  bool prev_sep = false;
  bool started = false;
  for (char32_t c : DecodeUtf8(ToStr(v))) {
    const bool s = sep(c);
    first_of_piece = !started || s != prev_sep;
    AppendUtf8(first_of_piece ? ToUpper(c) : ToLower(c), &out);
    prev_sep = s;
    started = true;
  }
  return Value(std::move(out));
}

Value FTrim(Interpreter&, const Value& v, CallArgs& args) {
  ArgBinder b("trim", args, {"chars"});
  std::optional<std::string> chars;
  if (b.Get(0) != nullptr && !b.Get(0)->is_none()) chars = ToStr(*b.Get(0));
  return Value(Strip(ToStr(v), chars, true, true));
}

Value FReplace(Interpreter&, const Value& v, CallArgs& args) {
  ArgBinder b("replace", args, {"old", "new", "count"});
  if (b.Get(0) == nullptr || b.Get(1) == nullptr) Fail("replace() needs 'old' and 'new'");
  const Value count = b.GetOr(2, Value::None());
  return Value(Replace(ToStr(v), ToStr(*b.Get(0)), ToStr(*b.Get(1)),
                       count.is_none() ? -1 : ToInt(count, "replace() count")));
}

// HF transformers' tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False).
Value FToJson(Interpreter&, const Value& v, CallArgs& args) {
  ArgBinder b("tojson", args, {"ensure_ascii", "indent", "separators", "sort_keys"});
  JsonOptions o;
  o.ensure_ascii = Truthy(b.GetOr(0, Value(false)));
  const Value indent = b.GetOr(1, Value::None());
  if (indent.is_string()) {
    o.indent = indent.str();
  } else if (!indent.is_none()) {
    o.indent = std::string(std::max<int64_t>(0, ToInt(indent, "tojson indent")), ' ');
  }
  const Value seps = b.GetOr(2, Value::None());
  if (!seps.is_none()) {
    if (!seps.is_list() || seps.list().size() != 2) Fail("tojson separators must be a pair");
    o.item_separator = ExpectString(seps.list()[0], "separator");
    o.key_separator = ExpectString(seps.list()[1], "separator");
  }
  o.sort_keys = Truthy(b.GetOr(3, Value(false)));
  return Value(ToJson(v, o));
}

Value FInt(Interpreter&, const Value& v, CallArgs& args) {
  ArgBinder b("int", args, {"default", "base"});
  const Value fallback = b.GetOr(0, Value(0));
  const int base = static_cast<int>(ToInt(b.GetOr(1, Value(10)), "int() base"));
  if (v.is_undefined()) Fail(v.str());
  if (v.is_int() || v.is_bool()) return Value(v.int_value());
  if (v.is_float()) {
    if (!std::isfinite(v.float_value())) return fallback;
    return Value(static_cast<int64_t>(std::trunc(v.float_value())));
  }
  if (v.is_string()) {
    std::string s = Strip(v.str(), std::nullopt, true, true);
    s.erase(std::remove(s.begin(), s.end(), '_'), s.end());
    if (!s.empty()) {
      char* end = nullptr;
      errno = 0;
      const long long x = std::strtoll(s.c_str(), &end, base);
      if (*end == '\0' && errno == 0) return Value(static_cast<int64_t>(x));
      // "42.23"|int is 42: through float, as jinja2 does.
      const double d = std::strtod(s.c_str(), &end);
      if (*end == '\0' && std::isfinite(d)) return Value(static_cast<int64_t>(std::trunc(d)));
    }
  }
  return fallback;
}

Value FFloat(Interpreter&, const Value& v, CallArgs& args) {
  ArgBinder b("float", args, {"default"});
  const Value fallback = b.GetOr(0, Value(0.0));
  if (v.is_undefined()) Fail(v.str());
  if (v.is_number()) return Value(v.number());
  if (v.is_string()) {
    const std::string s = Strip(v.str(), std::nullopt, true, true);
    char* end = nullptr;
    const double d = std::strtod(s.c_str(), &end);
    if (!s.empty() && *end == '\0') return Value(d);
  }
  return fallback;
}

Value FAbs(Interpreter&, const Value& v, CallArgs& args) {
  ArgBinder("abs", args, {});
  if (v.is_float()) return Value(std::fabs(v.float_value()));
  if (v.is_int() || v.is_bool()) return Value(static_cast<int64_t>(std::llabs(v.int_value())));
  if (v.is_undefined()) Fail(v.str());
  Fail(Cat("bad operand type for abs(): '", TypeName(v), "'"));
}

Value FRound(Interpreter&, const Value& v, CallArgs& args) {
  ArgBinder b("round", args, {"precision", "method"});
  const int64_t precision = ToInt(b.GetOr(0, Value(0)), "round() precision");
  const std::string method = ToStr(b.GetOr(1, Value("common")));
  if (method != "common" && method != "ceil" && method != "floor") {
    Fail("method must be 'common', 'ceil' or 'floor'");
  }
  const double x = ToFloat(v, "round()");
  if (method == "common") {
    if ((v.is_int() || v.is_bool()) && precision >= 0) return Value(v.int_value());
    // Python rounds the exact binary value half-to-even; printf does the same.
    char buf[512];
    std::snprintf(buf, sizeof(buf), "%.*f",
                  static_cast<int>(std::clamp<int64_t>(precision, 0, 300)), x);
    double r = std::strtod(buf, nullptr);
    if (precision < 0) {
      const double scale = std::pow(10.0, static_cast<double>(-precision));
      r = std::nearbyint(x / scale) * scale;
    }
    return Value(r);
  }
  const double scale = std::pow(10.0, static_cast<double>(precision));
  return Value((method == "ceil" ? std::ceil(x * scale) : std::floor(x * scale)) / scale);
}

Value FIndent(Interpreter&, const Value& v, CallArgs& args) {
  ArgBinder b("indent", args, {"width", "first", "blank"});
  const Value width = b.GetOr(0, Value(4));
  const std::string indention =
      width.is_string() ? width.str()
                        : std::string(std::max<int64_t>(0, ToInt(width, "indent() width")), ' ');
  const bool first = Truthy(b.GetOr(1, Value(false)));
  const bool blank = Truthy(b.GetOr(2, Value(false)));
  const std::vector<std::string> lines = SplitLines(ToStr(v) + "\n", false);
  std::string out;
  for (size_t i = 0; i < lines.size(); ++i) {
    if (i > 0) {
      out += "\n";
      if (blank || !lines[i].empty()) out += indention;
    }
    out += lines[i];
  }
  if (first) out = indention + out;
  return Value(std::move(out));
}

Value FCenter(Interpreter&, const Value& v, CallArgs& args) {
  ArgBinder b("center", args, {"width"});
  return Value(Center(ToStr(v), ToInt(b.GetOr(0, Value(80)), "center() width"), " "));
}

Value FWordcount(Interpreter&, const Value& v, CallArgs& args) {
  ArgBinder("wordcount", args, {});
  int64_t n = 0;
  bool in_word = false;
  for (char32_t c : DecodeUtf8(ToStr(v))) {
    const bool w = IsWordChar(c);
    if (w && !in_word) ++n;
    in_word = w;
  }
  return Value(n);
}

Value FTruncate(Interpreter&, const Value& v, CallArgs& args) {
  ArgBinder b("truncate", args, {"length", "killwords", "end", "leeway"});
  const int64_t length = ToInt(b.GetOr(0, Value(255)), "truncate() length");
  const bool killwords = Truthy(b.GetOr(1, Value(false)));
  const std::string end = ToStr(b.GetOr(2, Value("...")));
  const int64_t leeway = ToInt(b.GetOr(3, Value(5)), "truncate() leeway");
  const std::string s = ToStr(v);
  const int64_t end_len = static_cast<int64_t>(CodePointCount(end));
  if (length < end_len) Fail("expected length >= the length of 'end'");
  if (static_cast<int64_t>(CodePointCount(s)) <= length + leeway) return Value(s);
  const std::string head = SliceString(s, std::nullopt, length - end_len, std::nullopt);
  if (killwords) return Value(head + end);
  return Value(Split(head, std::string(" "), 1, true)[0] + end);
}

Value FEscape(Interpreter&, const Value& v, CallArgs& args) {
  ArgBinder("escape", args, {});
  std::string out;
  for (char c : ToStr(v)) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&#34;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out.push_back(c);
    }
  }
  return Value(std::move(out));
}

Value FSafe(Interpreter&, const Value& v, CallArgs& args) {
  ArgBinder("safe", args, {});
  return v.is_string() ? v : Value(ToStr(v));
}

Value FFormat(Interpreter&, const Value& v, CallArgs& args) {
  if (!args.positional.empty() && !args.keyword.empty()) {
    Fail("can't handle positional and keyword arguments at the same time");
  }
  if (!args.keyword.empty()) {
    Dict d;
    for (auto& [k, val] : args.keyword) d.Set(Value(k), val);
    return BinaryOp(BinOp::kMod, Value(ToStr(v)), Value::MakeDict(std::move(d)));
  }
  return BinaryOp(BinOp::kMod, Value(ToStr(v)), Value::Tuple(args.positional));
}

}  // namespace thermocline::server::jinja
