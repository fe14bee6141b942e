// jinja2's builtin tests (`x is defined`, `x is string`, `x is equalto y`, ...), with Python's
// notion of each type (a bool is a number; a dict is a sequence; Undefined is iterable).
#include <cmath>
#include <map>

#include "server/jinja/builtins.h"
#include "server/jinja/cat.h"
#include "server/jinja/error.h"
#include "server/jinja/interpreter.h"
#include "server/jinja/strings.h"

namespace thermocline::server::jinja {
namespace {

using Args = CallArgs;

const Value& Arg(Args& args, std::string_view test) {
  if (args.positional.size() + args.keyword.size() != 1) {
    Fail(Cat("the '", test, "' test takes one argument"));
  }
  return args.positional.empty() ? args.keyword[0].second : args.positional[0];
}

void NoArgs(Args& args, std::string_view test) {
  if (!args.positional.empty() || !args.keyword.empty()) {
    Fail(Cat("the '", test, "' test takes no arguments"));
  }
}

bool TDefined(Interpreter&, const Value& v, Args& a) {
  NoArgs(a, "defined");
  return !v.is_undefined();
}
bool TUndefined(Interpreter&, const Value& v, Args& a) {
  NoArgs(a, "undefined");
  return v.is_undefined();
}
bool TNone(Interpreter&, const Value& v, Args& a) {
  NoArgs(a, "none");
  return v.is_none();
}
bool TBoolean(Interpreter&, const Value& v, Args& a) {
  NoArgs(a, "boolean");
  return v.is_bool();
}
bool TTrue(Interpreter&, const Value& v, Args& a) {
  NoArgs(a, "true");
  return v.is_bool() && v.bool_value();
}
bool TFalse(Interpreter&, const Value& v, Args& a) {
  NoArgs(a, "false");
  return v.is_bool() && !v.bool_value();
}
bool TInteger(Interpreter&, const Value& v, Args& a) {
  NoArgs(a, "integer");
  return v.is_int();
}
bool TFloat(Interpreter&, const Value& v, Args& a) {
  NoArgs(a, "float");
  return v.is_float();
}
bool TNumber(Interpreter&, const Value& v, Args& a) {
  NoArgs(a, "number");
  return v.is_number();
}
bool TString(Interpreter&, const Value& v, Args& a) {
  NoArgs(a, "string");
  return v.is_string();
}
bool TMapping(Interpreter&, const Value& v, Args& a) {
  NoArgs(a, "mapping");
  return v.is_dict();
}

bool TIterable(Interpreter&, const Value& v, Args& a) {
  NoArgs(a, "iterable");
  return v.is_undefined() || v.is_string() || v.is_list() || v.is_dict();
}

bool TSequence(Interpreter&, const Value& v, Args& a) {
  NoArgs(a, "sequence");
  return v.is_undefined() || v.is_string() || v.is_list() || v.is_dict();
}

bool TCallable(Interpreter&, const Value& v, Args& a) {
  NoArgs(a, "callable");
  return v.is_undefined() || (v.is_object() && v.object()->callable());
}

bool TEscaped(Interpreter&, const Value&, Args& a) {
  NoArgs(a, "escaped");
  return false;
}

bool TSameAs(Interpreter&, const Value& v, Args& a) {
  const Value& other = Arg(a, "sameas");
  if (v.kind() != other.kind()) return false;
  switch (v.kind()) {
    case Value::Kind::kList:
    case Value::Kind::kDict:
      return false;  // identity of containers is not tracked; distinct objects in practice
    case Value::Kind::kObject:
      return v.object() == other.object();
    default:
      return Equal(v, other);
  }
}

bool TEq(Interpreter&, const Value& v, Args& a) { return Equal(v, Arg(a, "eq")); }
bool TNe(Interpreter&, const Value& v, Args& a) { return !Equal(v, Arg(a, "ne")); }
bool TLt(Interpreter&, const Value& v, Args& a) { return Less(v, Arg(a, "lt")); }
bool TGt(Interpreter&, const Value& v, Args& a) { return Less(Arg(a, "gt"), v); }
bool TLe(Interpreter&, const Value& v, Args& a) {
  const Value& o = Arg(a, "le");
  return Less(v, o) || Equal(v, o);
}
bool TGe(Interpreter&, const Value& v, Args& a) {
  const Value& o = Arg(a, "ge");
  return Less(o, v) || Equal(v, o);
}
bool TIn(Interpreter&, const Value& v, Args& a) { return Contains(Arg(a, "in"), v); }

bool TDivisibleBy(Interpreter&, const Value& v, Args& a) {
  const Value& n = Arg(a, "divisibleby");
  const Value r = BinaryOp(BinOp::kMod, v, n);
  return r.number() == 0;
}

bool TEven(Interpreter&, const Value& v, Args& a) {
  NoArgs(a, "even");
  return BinaryOp(BinOp::kMod, v, Value(2)).number() == 0;
}

bool TOdd(Interpreter&, const Value& v, Args& a) {
  NoArgs(a, "odd");
  return BinaryOp(BinOp::kMod, v, Value(2)).number() == 1;
}

// str.islower() / str.isupper(): some cased character, and none of the other case.
bool CaseIs(const Value& v, bool upper) {
  bool cased = false;
  for (char32_t c : DecodeUtf8(ToStr(v))) {
    if (!IsCased(c)) continue;
    if (upper ? ToLower(c) != c && ToUpper(c) == c : ToUpper(c) != c && ToLower(c) == c) {
      cased = true;
    } else {
      return false;
    }
  }
  return cased;
}

bool TLower(Interpreter&, const Value& v, Args& a) {
  NoArgs(a, "lower");
  return CaseIs(v, false);
}
bool TUpper(Interpreter&, const Value& v, Args& a) {
  NoArgs(a, "upper");
  return CaseIs(v, true);
}

bool TFilter(Interpreter&, const Value& v, Args& a) {
  NoArgs(a, "filter");
  return v.is_string() && FindFilter(v.str()) != nullptr;
}

bool TTest(Interpreter&, const Value& v, Args& a) {
  NoArgs(a, "test");
  return v.is_string() && FindTest(v.str()) != nullptr;
}

const std::map<std::string_view, TestFn>& Tests() {
  static const std::map<std::string_view, TestFn> kTests = {
      {"!=", TNe},
      {"<", TLt},
      {"<=", TLe},
      {"==", TEq},
      {">", TGt},
      {">=", TGe},
      {"boolean", TBoolean},
      {"callable", TCallable},
      {"defined", TDefined},
      {"divisibleby", TDivisibleBy},
      {"eq", TEq},
      {"equalto", TEq},
      {"escaped", TEscaped},
      {"even", TEven},
      {"false", TFalse},
      {"filter", TFilter},
      {"float", TFloat},
      {"ge", TGe},
      {"greaterthan", TGt},
      {"gt", TGt},
      {"in", TIn},
      {"integer", TInteger},
      {"iterable", TIterable},
      {"le", TLe},
      {"lessthan", TLt},
      {"lower", TLower},
      {"lt", TLt},
      {"mapping", TMapping},
      {"ne", TNe},
      {"none", TNone},
      {"number", TNumber},
      {"odd", TOdd},
      {"sameas", TSameAs},
      {"sequence", TSequence},
      {"string", TString},
      {"test", TTest},
      {"true", TTrue},
      {"undefined", TUndefined},
      {"upper", TUpper},
  };
  return kTests;
}

}  // namespace

TestFn FindTest(std::string_view name) {
  const auto& t = Tests();
  auto it = t.find(name);
  return it == t.end() ? nullptr : it->second;
}

}  // namespace thermocline::server::jinja
