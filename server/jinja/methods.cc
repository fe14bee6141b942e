// The Python methods of str, list, tuple and dict that templates call ("x.strip()",
// "d.items()", "s.split('</think>')"). Mutating methods of list and dict are refused as the
// immutable sandbox refuses them: reading them gives an Undefined that fails on use.
#include <algorithm>
#include <cctype>

#include "server/jinja/builtins.h"
#include "server/jinja/cat.h"
#include "server/jinja/error.h"
#include "server/jinja/interpreter.h"
#include "server/jinja/objects.h"
#include "server/jinja/strings.h"

namespace thermocline::server::jinja {
namespace {

using Method = Value (*)(const Value& self, CallArgs& args);

void NoArguments(std::string_view method, const CallArgs& args) { ArgBinder(method, args, {}); }

std::optional<std::string> OptionalString(const Value* v, std::string_view what) {
  if (v == nullptr || v->is_none()) return std::nullopt;
  return ExpectString(*v, what);
}

Value StringList(std::vector<std::string> parts) {
  ValueList out;
  out.reserve(parts.size());
  for (std::string& p : parts) out.push_back(Value(std::move(p)));
  return Value::List(std::move(out));
}

Value StripMethod(const Value& self, CallArgs& args, bool left, bool right, const char* name) {
  ArgBinder b(name, args, {"chars"});
  return Value(Strip(self.str(), OptionalString(b.Get(0), "chars"), left, right));
}

Value MStrip(const Value& s, CallArgs& a) { return StripMethod(s, a, true, true, "strip"); }
Value MLStrip(const Value& s, CallArgs& a) { return StripMethod(s, a, true, false, "lstrip"); }
Value MRStrip(const Value& s, CallArgs& a) { return StripMethod(s, a, false, true, "rstrip"); }

Value SplitMethod(const Value& self, CallArgs& args, bool from_right) {
  ArgBinder b(from_right ? "rsplit" : "split", args, {"sep", "maxsplit"});
  const int64_t maxsplit = ToInt(b.GetOr(1, Value(-1)), "maxsplit");
  return StringList(Split(self.str(), OptionalString(b.Get(0), "sep"), maxsplit, from_right));
}

Value MSplit(const Value& s, CallArgs& a) { return SplitMethod(s, a, false); }
Value MRSplit(const Value& s, CallArgs& a) { return SplitMethod(s, a, true); }

Value MSplitLines(const Value& s, CallArgs& a) {
  ArgBinder b("splitlines", a, {"keepends"});
  return StringList(SplitLines(s.str(), Truthy(b.GetOr(0, Value(false)))));
}

// startswith / endswith with a string or a tuple of strings, and optional start / end.
Value AffixMethod(const Value& self, CallArgs& args, bool prefix) {
  ArgBinder b(prefix ? "startswith" : "endswith", args, {"affix", "start", "end"});
  if (b.Get(0) == nullptr) Fail("startswith/endswith needs an argument");
  std::string s = self.str();
  if (b.Get(1) != nullptr || b.Get(2) != nullptr) {
    auto bound = [](const Value* v) -> std::optional<int64_t> {
      if (v == nullptr || v->is_none()) return std::nullopt;
      return ToInt(*v, "slice index");
    };
    s = SliceString(s, bound(b.Get(1)), bound(b.Get(2)), std::nullopt);
  }
  std::vector<std::string> affixes;
  const Value& arg = *b.Get(0);
  if (arg.is_list()) {
    for (const Value& v : arg.list()) affixes.push_back(ExpectString(v, "tuple element"));
  } else {
    affixes.push_back(ExpectString(arg, prefix ? "startswith arg" : "endswith arg"));
  }
  for (const std::string& x : affixes) {
    if (x.size() > s.size()) continue;
    if (prefix ? s.compare(0, x.size(), x) == 0 : s.compare(s.size() - x.size(), x.size(), x) == 0)
      return Value(true);
  }
  return Value(false);
}

Value MStartsWith(const Value& s, CallArgs& a) { return AffixMethod(s, a, true); }
Value MEndsWith(const Value& s, CallArgs& a) { return AffixMethod(s, a, false); }

Value MUpper(const Value& s, CallArgs& a) {
  NoArguments("upper", a);
  return Value(Upper(s.str()));
}
Value MLower(const Value& s, CallArgs& a) {
  NoArguments("lower", a);
  return Value(Lower(s.str()));
}
Value MTitle(const Value& s, CallArgs& a) {
  NoArguments("title", a);
  return Value(PyTitle(s.str()));
}
Value MCapitalize(const Value& s, CallArgs& a) {
  NoArguments("capitalize", a);
  return Value(Capitalize(s.str()));
}
Value MSwapCase(const Value& s, CallArgs& a) {
  NoArguments("swapcase", a);
  return Value(SwapCase(s.str()));
}

Value MReplace(const Value& s, CallArgs& a) {
  ArgBinder b("replace", a, {"old", "new", "count"});
  if (b.Get(0) == nullptr || b.Get(1) == nullptr) Fail("replace() needs 'old' and 'new'");
  return Value(Replace(s.str(), ExpectString(*b.Get(0), "replace() old"),
                       ExpectString(*b.Get(1), "replace() new"),
                       ToInt(b.GetOr(2, Value(-1)), "replace() count")));
}

Value FindMethodImpl(const Value& self, CallArgs& args, bool from_right, bool raise,
                     const char* name) {
  ArgBinder b(name, args, {"sub"});
  if (b.Get(0) == nullptr) Fail(Cat(name, "() takes at least 1 argument"));
  const int64_t at = Find(self.str(), ExpectString(*b.Get(0), "sub"), from_right);
  if (at < 0 && raise) Fail("substring not found");
  return Value(at);
}

Value MFind(const Value& s, CallArgs& a) { return FindMethodImpl(s, a, false, false, "find"); }
Value MRFind(const Value& s, CallArgs& a) { return FindMethodImpl(s, a, true, false, "rfind"); }
Value MIndex(const Value& s, CallArgs& a) { return FindMethodImpl(s, a, false, true, "index"); }
Value MRIndex(const Value& s, CallArgs& a) { return FindMethodImpl(s, a, true, true, "rindex"); }

Value MCount(const Value& s, CallArgs& a) {
  ArgBinder b("count", a, {"sub"});
  if (b.Get(0) == nullptr) Fail("count() takes at least 1 argument");
  return Value(Count(s.str(), ExpectString(*b.Get(0), "sub")));
}

Value MJoin(const Value& s, CallArgs& a) {
  ArgBinder b("join", a, {"iterable"});
  if (b.Get(0) == nullptr) Fail("join() takes exactly one argument");
  std::string out;
  bool first = true;
  for (const Value& v : Iterate(*b.Get(0))) {
    if (!first) out += s.str();
    first = false;
    out += ExpectString(v, "sequence item");
  }
  return Value(std::move(out));
}

bool IsDigitChar(char32_t c) { return c >= '0' && c <= '9'; }
bool IsAlphaChar(char32_t c) {
  return IsCased(c) || (c >= 0x80 && IsWordChar(c) && !IsDigitChar(c));
}
bool IsAlnumChar(char32_t c) { return IsAlphaChar(c) || IsDigitChar(c); }

Value MIsDigit(const Value& s, CallArgs& a) {
  NoArguments("isdigit", a);
  return Value(IsAllOf(s.str(), IsDigitChar));
}
Value MIsAlpha(const Value& s, CallArgs& a) {
  NoArguments("isalpha", a);
  return Value(IsAllOf(s.str(), IsAlphaChar));
}
Value MIsAlnum(const Value& s, CallArgs& a) {
  NoArguments("isalnum", a);
  return Value(IsAllOf(s.str(), IsAlnumChar));
}
Value MIsSpace(const Value& s, CallArgs& a) {
  NoArguments("isspace", a);
  return Value(IsAllOf(s.str(), IsSpace));
}

Value MIsUpper(const Value& s, CallArgs& a) {
  ArgBinder("isupper", a, {});
  bool cased = false;
  for (char32_t c : DecodeUtf8(s.str())) {
    if (ToUpper(c) != c) return Value(false);
    if (ToLower(c) != c) cased = true;
  }
  return Value(cased);
}

Value MIsLower(const Value& s, CallArgs& a) {
  ArgBinder("islower", a, {});
  bool cased = false;
  for (char32_t c : DecodeUtf8(s.str())) {
    if (ToLower(c) != c) return Value(false);
    if (ToUpper(c) != c) cased = true;
  }
  return Value(cased);
}

Value PadMethod(const Value& self, CallArgs& args, int where, const char* name) {
  ArgBinder b(name, args, {"width", "fillchar"});
  const int64_t width = ToInt(b.GetOr(0, Value(0)), "width");
  const std::string fill = b.Get(1) ? ExpectString(*b.Get(1), "fillchar") : " ";
  const int64_t n = static_cast<int64_t>(CodePointCount(self.str()));
  if (where == 0) return Value(Center(self.str(), width, fill));
  std::string pad;
  for (int64_t i = n; i < width; ++i) pad += fill;
  return Value(where < 0 ? self.str() + pad : pad + self.str());
}

Value MCenter(const Value& s, CallArgs& a) { return PadMethod(s, a, 0, "center"); }
Value MLJust(const Value& s, CallArgs& a) { return PadMethod(s, a, -1, "ljust"); }
Value MRJust(const Value& s, CallArgs& a) { return PadMethod(s, a, 1, "rjust"); }

Value MRemovePrefix(const Value& s, CallArgs& a) {
  ArgBinder b("removeprefix", a, {"prefix"});
  const std::string p = ExpectString(b.GetOr(0, Value("")), "prefix");
  return Value(s.str().compare(0, p.size(), p) == 0 ? s.str().substr(p.size()) : s.str());
}

Value MRemoveSuffix(const Value& s, CallArgs& a) {
  ArgBinder b("removesuffix", a, {"suffix"});
  const std::string x = ExpectString(b.GetOr(0, Value("")), "suffix");
  const std::string& str = s.str();
  const bool has =
      !x.empty() && x.size() <= str.size() && str.compare(str.size() - x.size(), x.size(), x) == 0;
  return Value(has ? str.substr(0, str.size() - x.size()) : str);
}

Value PartitionMethod(const Value& self, CallArgs& args, bool from_right) {
  ArgBinder b(from_right ? "rpartition" : "partition", args, {"sep"});
  const std::string sep = ExpectString(b.GetOr(0, Value("")), "sep");
  if (sep.empty()) Fail("empty separator");
  const std::string& s = self.str();
  const size_t at = from_right ? s.rfind(sep) : s.find(sep);
  if (at == std::string::npos) {
    return from_right ? Value::Tuple({Value(""), Value(""), Value(s)})
                      : Value::Tuple({Value(s), Value(""), Value("")});
  }
  return Value::Tuple({Value(s.substr(0, at)), Value(sep), Value(s.substr(at + sep.size()))});
}

Value MPartition(const Value& s, CallArgs& a) { return PartitionMethod(s, a, false); }
Value MRPartition(const Value& s, CallArgs& a) { return PartitionMethod(s, a, true); }

Value MZFill(const Value& s, CallArgs& a) {
  ArgBinder b("zfill", a, {"width"});
  const int64_t width = ToInt(b.GetOr(0, Value(0)), "width");
  std::string str = s.str();
  const int64_t n = static_cast<int64_t>(CodePointCount(str));
  if (n >= width) return Value(str);
  const bool sign = !str.empty() && (str[0] == '-' || str[0] == '+');
  str.insert(sign ? 1 : 0, std::string(width - n, '0'));
  return Value(str);
}

// list / tuple
Value MListIndex(const Value& s, CallArgs& a) {
  ArgBinder b("index", a, {"value"});
  const Value x = b.GetOr(0, Value());
  for (size_t i = 0; i < s.list().size(); ++i) {
    if (Equal(s.list()[i], x)) return Value(static_cast<int64_t>(i));
  }
  Fail(Cat(Repr(x), " is not in list"));
}

Value MListCount(const Value& s, CallArgs& a) {
  ArgBinder b("count", a, {"value"});
  const Value x = b.GetOr(0, Value());
  return Value(static_cast<int64_t>(std::count_if(s.list().begin(), s.list().end(),
                                                  [&](const Value& v) { return Equal(v, x); })));
}

Value MCopy(const Value& s, CallArgs& a) {
  NoArguments("copy", a);
  return s;
}

// dict
Value MItems(const Value& s, CallArgs& a) {
  ArgBinder("items", a, {});
  ValueList out;
  for (const auto& [k, v] : s.dict().items()) out.push_back(Value::Tuple({k, v}));
  return Value::List(std::move(out));
}

Value MKeys(const Value& s, CallArgs& a) {
  ArgBinder("keys", a, {});
  return Value::List(Iterate(s));
}

Value MValues(const Value& s, CallArgs& a) {
  ArgBinder("values", a, {});
  ValueList out;
  for (const auto& [k, v] : s.dict().items()) out.push_back(v);
  return Value::List(std::move(out));
}

Value MGet(const Value& s, CallArgs& a) {
  ArgBinder b("get", a, {"key", "default"});
  if (b.Get(0) == nullptr) Fail("get expected at least 1 argument, got 0");
  const Value* v = s.dict().Find(*b.Get(0));
  return v != nullptr ? *v : b.GetOr(1, Value::None());
}

// str.format with automatic or numbered fields, keyword fields and !s / !r; format specs
// (":>10") are refused.
Value MFormat(const Value& self, CallArgs& args) {
  const std::string& f = self.str();
  std::string out;
  size_t next = 0;
  int numbering = 0;
  for (size_t i = 0; i < f.size(); ++i) {
    const char c = f[i];
    if (c == '}') {
      if (i + 1 < f.size() && f[i + 1] == '}')
        ++i;
      else
        Fail("Single '}' encountered in format string");
      out.push_back('}');
      continue;
    }
    if (c != '{') {
      out.push_back(c);
      continue;
    }
    if (i + 1 < f.size() && f[i + 1] == '{') {
      out.push_back('{');
      ++i;
      continue;
    }
    const size_t close = f.find('}', i);
    if (close == std::string::npos) Fail("Single '{' encountered in format string");
    std::string field = f.substr(i + 1, close - i - 1);
    i = close;
    char conversion = 's';
    if (const size_t bang = field.find('!'); bang != std::string::npos) {
      if (bang + 2 != field.size()) Fail("str.format: bad conversion");
      conversion = field[bang + 1];
      field.resize(bang);
    }
    if (field.find(':') != std::string::npos || field.find('[') != std::string::npos ||
        field.find('.') != std::string::npos) {
      Fail("str.format: format specs and field lookups are not supported");
    }
    const Value* v = nullptr;
    if (field.empty() || std::isdigit(static_cast<unsigned char>(field[0]))) {
      const int mode = field.empty() ? 1 : 2;  // automatic / manual numbering
      if (numbering != 0 && numbering != mode) {
        Fail("cannot switch between automatic and manual field numbering");
      }
      numbering = mode;
      const size_t index = field.empty() ? next++ : std::stoul(field);
      if (index >= args.positional.size()) Fail(Cat("Replacement index ", index, " out of range"));
      v = &args.positional[index];
    } else {
      for (const auto& [k, val] : args.keyword) {
        if (k == field) v = &val;
      }
      if (v == nullptr) Fail(Cat("KeyError: '", field, "'"));
    }
    out += conversion == 'r' ? Repr(*v) : ToStr(*v);
  }
  return Value(std::move(out));
}

struct MethodRow {
  std::string_view name;
  Method fn;
};

constexpr MethodRow kStringMethods[] = {
    {"capitalize", MCapitalize},
    {"casefold", MLower},
    {"center", MCenter},
    {"count", MCount},
    {"endswith", MEndsWith},
    {"find", MFind},
    {"index", MIndex},
    {"isalnum", MIsAlnum},
    {"isalpha", MIsAlpha},
    {"isdecimal", MIsDigit},
    {"isdigit", MIsDigit},
    {"islower", MIsLower},
    {"isnumeric", MIsDigit},
    {"isspace", MIsSpace},
    {"isupper", MIsUpper},
    {"join", MJoin},
    {"ljust", MLJust},
    {"lower", MLower},
    {"lstrip", MLStrip},
    {"partition", MPartition},
    {"removeprefix", MRemovePrefix},
    {"removesuffix", MRemoveSuffix},
    {"replace", MReplace},
    {"rfind", MRFind},
    {"rindex", MRIndex},
    {"rjust", MRJust},
    {"rpartition", MRPartition},
    {"rsplit", MRSplit},
    {"rstrip", MRStrip},
    {"split", MSplit},
    {"splitlines", MSplitLines},
    {"startswith", MStartsWith},
    {"strip", MStrip},
    {"swapcase", MSwapCase},
    {"title", MTitle},
    {"upper", MUpper},
    {"zfill", MZFill},
};

constexpr MethodRow kListMethods[] = {
    {"copy", MCopy}, {"count", MListCount}, {"index", MListIndex}};
constexpr MethodRow kTupleMethods[] = {{"count", MListCount}, {"index", MListIndex}};
constexpr MethodRow kDictMethods[] = {
    {"copy", MCopy}, {"get", MGet}, {"items", MItems}, {"keys", MKeys}, {"values", MValues}};

// What the immutable sandbox refuses (jinja2's modifies_known_mutable), and list methods it
// lets through but that would mutate a value here.
constexpr std::string_view kUnsafeList[] = {"append", "reverse", "insert",
                                            "sort",   "extend",  "remove"};
constexpr std::string_view kMutatingList[] = {"pop", "clear"};
constexpr std::string_view kUnsafeDict[] = {"clear", "pop", "popitem", "setdefault", "update"};

template <size_t N>
const MethodRow* FindRow(const MethodRow (&rows)[N], std::string_view name) {
  for (const MethodRow& r : rows) {
    if (r.name == name) return &r;
  }
  return nullptr;
}

template <size_t N>
bool In(const std::string_view (&names)[N], std::string_view name) {
  return std::find(std::begin(names), std::end(names), name) != std::end(names);
}

}  // namespace

std::optional<Value> FindMethod(const Value& obj, std::string_view name) {
  const MethodRow* row = nullptr;
  if (obj.is_string()) {
    row = FindRow(kStringMethods, name);
    if (row == nullptr && name == "format") {
      Value self = obj;
      return MakeFunction("format",
                          [self](Interpreter&, CallArgs& args) { return MFormat(self, args); });
    }
  } else if (obj.is_tuple()) {
    row = FindRow(kTupleMethods, name);
  } else if (obj.is_list()) {
    row = FindRow(kListMethods, name);
    if (row == nullptr && In(kUnsafeList, name)) {
      return Value::Undefined(Cat("access to attribute '", name, "' of 'list' object is unsafe."),
                              true);
    }
    if (row == nullptr && In(kMutatingList, name)) {
      return MakeFunction(
          std::string(name), [name = std::string(name)](Interpreter&, CallArgs&) -> Value {
            Fail(Cat("list.", name, "() is not supported: template values are immutable"));
          });
    }
  } else if (obj.is_dict()) {
    row = FindRow(kDictMethods, name);
    if (row == nullptr && In(kUnsafeDict, name)) {
      return Value::Undefined(Cat("access to attribute '", name, "' of 'dict' object is unsafe."),
                              true);
    }
  }
  if (row == nullptr) return std::nullopt;
  Method fn = row->fn;
  Value self = obj;
  return MakeFunction(std::string(name),
                      [fn, self](Interpreter&, CallArgs& args) { return fn(self, args); });
}

}  // namespace thermocline::server::jinja
