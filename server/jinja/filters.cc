// jinja2's builtin filters on sequences and mappings (join, map, selectattr, sort, ...) and the
// table of all filters. Each follows the jinja2 3.1 definition.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>

#include "server/jinja/builtins.h"
#include "server/jinja/cat.h"
#include "server/jinja/error.h"
#include "server/jinja/filters_internal.h"
#include "server/jinja/interpreter.h"
#include "server/jinja/json.h"
#include "server/jinja/strings.h"

namespace thermocline::server::jinja {
namespace {

using Args = CallArgs;

// The value at a dotted attribute path ("function.name", "0"), as jinja2's attribute getter
// walks it (item access first, then attribute).
Value AttrPath(Interpreter& in, const Value& item, const std::string& path) {
  Value v = item;
  size_t start = 0;
  while (true) {
    const size_t dot = path.find('.', start);
    const std::string part = path.substr(start, dot == std::string::npos ? dot : dot - start);
    char* end = nullptr;
    const long long index = std::strtoll(part.c_str(), &end, 10);
    const bool numeric = !part.empty() && end != nullptr && *end == '\0';
    v = in.GetItem(v, numeric ? Value(static_cast<int64_t>(index)) : Value(part));
    if (dot == std::string::npos) return v;
    start = dot + 1;
  }
}

// A sort / unique key: the attribute if asked, lower-cased strings unless case-sensitive.
Value KeyOf(Interpreter& in, const Value& item, const Value* attribute, bool case_sensitive) {
  Value v =
      attribute != nullptr && !attribute->is_none() ? AttrPath(in, item, ToStr(*attribute)) : item;
  if (!case_sensitive && v.is_string()) return Value(Lower(v.str()));
  return v;
}

int64_t Length(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return 0;
    case Value::Kind::kString:
      return static_cast<int64_t>(CodePointCount(v.str()));
    case Value::Kind::kList:
      return static_cast<int64_t>(v.list().size());
    case Value::Kind::kDict:
      return static_cast<int64_t>(v.dict().size());
    default:
      Fail(Cat("object of type '", TypeName(v), "' has no len()"));
  }
}

Value FLength(Interpreter&, const Value& v, Args& args) {
  ArgBinder("length", args, {});
  return Value(Length(v));
}

Value FDefault(Interpreter&, const Value& v, Args& args) {
  ArgBinder b("default", args, {"default_value", "boolean"});
  const bool boolean = Truthy(b.GetOr(1, Value(false)));
  if (v.is_undefined() || (boolean && !Truthy(v))) return b.GetOr(0, Value(""));
  return v;
}

Value FJoin(Interpreter& in, const Value& v, Args& args) {
  ArgBinder b("join", args, {"d", "attribute"});
  const std::string sep = ToStr(b.GetOr(0, Value("")));
  const Value* attribute = b.Get(1);
  std::string out;
  bool first = true;
  for (const Value& item : Iterate(v)) {
    if (!first) out += sep;
    first = false;
    out +=
        ToStr(attribute != nullptr && !attribute->is_none() ? AttrPath(in, item, ToStr(*attribute))
                                                            : item);
  }
  return Value(std::move(out));
}

Value FFirst(Interpreter&, const Value& v, Args& args) {
  ArgBinder("first", args, {});
  ValueList items = Iterate(v);
  if (items.empty()) return Value::Undefined("No first item, sequence was empty.");
  return items.front();
}

Value FLast(Interpreter&, const Value& v, Args& args) {
  ArgBinder("last", args, {});
  ValueList items = Iterate(v);
  if (items.empty()) return Value::Undefined("No last item, sequence was empty.");
  return items.back();
}

Value FList(Interpreter&, const Value& v, Args& args) {
  ArgBinder("list", args, {});
  return Value::List(Iterate(v));
}

Value FItems(Interpreter&, const Value& v, Args& args) {
  ArgBinder("items", args, {});
  if (v.is_undefined()) return Value::List({});
  if (!v.is_dict()) Fail("Can only get item pairs from a mapping.");
  ValueList out;
  for (const auto& [k, val] : v.dict().items()) out.push_back(Value::Tuple({k, val}));
  return Value::List(std::move(out));
}

Value FDictsort(Interpreter&, const Value& v, Args& args) {
  ArgBinder b("dictsort", args, {"case_sensitive", "by", "reverse"});
  const bool case_sensitive = Truthy(b.GetOr(0, Value(false)));
  const std::string by = ToStr(b.GetOr(1, Value("key")));
  const bool reverse = Truthy(b.GetOr(2, Value(false)));
  if (by != "key" && by != "value") Fail("You can only sort by either \"key\" or \"value\"");
  if (v.is_undefined()) Fail(v.str());
  if (!v.is_dict()) Fail(Cat("'", TypeName(v), "' object has no attribute 'items'"));
  std::vector<std::pair<Value, Value>> items(v.dict().items().begin(), v.dict().items().end());
  const int pos = by == "key" ? 0 : 1;
  auto key = [&](const std::pair<Value, Value>& p) {
    const Value& x = pos == 0 ? p.first : p.second;
    return !case_sensitive && x.is_string() ? Value(Lower(x.str())) : x;
  };
  std::stable_sort(items.begin(), items.end(), [&](const auto& a, const auto& c) {
    return reverse ? Less(key(c), key(a)) : Less(key(a), key(c));
  });
  ValueList out;
  for (auto& [k, val] : items) out.push_back(Value::Tuple({k, val}));
  return Value::List(std::move(out));
}

Value FSort(Interpreter& in, const Value& v, Args& args) {
  ArgBinder b("sort", args, {"reverse", "case_sensitive", "attribute"});
  const bool reverse = Truthy(b.GetOr(0, Value(false)));
  const bool case_sensitive = Truthy(b.GetOr(1, Value(false)));
  const Value* attribute = b.Get(2);
  ValueList items = Iterate(v);
  std::vector<std::pair<Value, Value>> keyed;
  for (Value& item : items) keyed.emplace_back(KeyOf(in, item, attribute, case_sensitive), item);
  std::stable_sort(keyed.begin(), keyed.end(), [&](const auto& a, const auto& c) {
    return reverse ? Less(c.first, a.first) : Less(a.first, c.first);
  });
  ValueList out;
  for (auto& [k, item] : keyed) out.push_back(std::move(item));
  return Value::List(std::move(out));
}

Value FUnique(Interpreter& in, const Value& v, Args& args) {
  ArgBinder b("unique", args, {"case_sensitive", "attribute"});
  const bool case_sensitive = Truthy(b.GetOr(0, Value(false)));
  const Value* attribute = b.Get(1);
  ValueList seen, out;
  for (const Value& item : Iterate(v)) {
    Value key = KeyOf(in, item, attribute, case_sensitive);
    if (Contains(Value::List(seen), key)) continue;
    seen.push_back(std::move(key));
    out.push_back(item);
  }
  return Value::List(std::move(out));
}

Value MinMax(Interpreter& in, const Value& v, Args& args, bool max) {
  ArgBinder b(max ? "max" : "min", args, {"case_sensitive", "attribute"});
  const bool case_sensitive = Truthy(b.GetOr(0, Value(false)));
  const Value* attribute = b.Get(1);
  ValueList items = Iterate(v);
  if (items.empty()) {
    return Value::Undefined(max ? "No largest item, sequence was empty."
                                : "No smallest item, sequence was empty.");
  }
  size_t best = 0;
  Value best_key = KeyOf(in, items[0], attribute, case_sensitive);
  for (size_t i = 1; i < items.size(); ++i) {
    Value k = KeyOf(in, items[i], attribute, case_sensitive);
    if (max ? Less(best_key, k) : Less(k, best_key)) {
      best = i;
      best_key = std::move(k);
    }
  }
  return items[best];
}

Value FMax(Interpreter& in, const Value& v, Args& args) { return MinMax(in, v, args, true); }
Value FMin(Interpreter& in, const Value& v, Args& args) { return MinMax(in, v, args, false); }

Value FSum(Interpreter& in, const Value& v, Args& args) {
  ArgBinder b("sum", args, {"attribute", "start"});
  const Value* attribute = b.Get(0);
  Value total = b.GetOr(1, Value(0));
  for (const Value& item : Iterate(v)) {
    total = BinaryOp(BinOp::kAdd, total,
                     attribute != nullptr && !attribute->is_none()
                         ? AttrPath(in, item, ToStr(*attribute))
                         : item);
  }
  return total;
}

Value FReverse(Interpreter&, const Value& v, Args& args) {
  ArgBinder("reverse", args, {});
  if (v.is_string()) return Value(SliceString(v.str(), std::nullopt, std::nullopt, -1));
  ValueList items = Iterate(v);
  std::reverse(items.begin(), items.end());
  return Value::List(std::move(items));
}

// map(filter_name, *args) or map(attribute=path, default=value).
Value FMap(Interpreter& in, const Value& v, Args& args) {
  const Value* attribute = nullptr;
  const Value* fallback = nullptr;
  for (const auto& [k, val] : args.keyword) {
    if (k == "attribute") attribute = &val;
    if (k == "default") fallback = &val;
  }
  ValueList out;
  if (attribute != nullptr) {
    for (const Value& item : Iterate(v)) {
      Value x = AttrPath(in, item, ToStr(*attribute));
      if (x.is_undefined() && fallback != nullptr) x = *fallback;
      out.push_back(std::move(x));
    }
    return Value::List(std::move(out));
  }
  if (args.positional.empty()) Fail("map requires a filter argument");
  const std::string name = ToStr(args.positional[0]);
  CallArgs rest;
  rest.positional.assign(args.positional.begin() + 1, args.positional.end());
  rest.keyword = args.keyword;
  for (const Value& item : Iterate(v)) {
    CallArgs copy = rest;
    out.push_back(in.ApplyFilter(name, item, copy));
  }
  return Value::List(std::move(out));
}

// select / reject / selectattr / rejectattr.
Value Select(Interpreter& in, const Value& v, Args& args, bool keep, bool by_attribute) {
  size_t next = 0;
  std::string attribute;
  if (by_attribute) {
    if (args.positional.empty()) Fail("Missing parameter for attribute name");
    attribute = ToStr(args.positional[next++]);
  }
  std::string test;
  if (next < args.positional.size()) test = ToStr(args.positional[next++]);
  CallArgs test_args;
  test_args.positional.assign(args.positional.begin() + next, args.positional.end());
  test_args.keyword = args.keyword;
  ValueList out;
  for (const Value& item : Iterate(v)) {
    const Value x = by_attribute ? AttrPath(in, item, attribute) : item;
    bool pass;
    if (test.empty()) {
      pass = Truthy(x);
    } else {
      CallArgs copy = test_args;
      pass = in.ApplyTest(test, x, copy);
    }
    if (pass == keep) out.push_back(item);
  }
  return Value::List(std::move(out));
}

Value FSelect(Interpreter& in, const Value& v, Args& a) { return Select(in, v, a, true, false); }
Value FReject(Interpreter& in, const Value& v, Args& a) { return Select(in, v, a, false, false); }
Value FSelectattr(Interpreter& in, const Value& v, Args& a) { return Select(in, v, a, true, true); }
Value FRejectattr(Interpreter& in, const Value& v, Args& a) {
  return Select(in, v, a, false, true);
}

Value FAttr(Interpreter& in, const Value& v, Args& args) {
  ArgBinder b("attr", args, {"name"});
  if (b.Get(0) == nullptr) Fail("attr() missing argument 'name'");
  return in.GetAttr(v, ToStr(*b.Get(0)));
}

Value FBatch(Interpreter&, const Value& v, Args& args) {
  ArgBinder b("batch", args, {"linecount", "fill_with"});
  const int64_t n = ToInt(b.GetOr(0, Value(1)), "batch() linecount");
  if (n <= 0) Fail("batch() linecount must be positive");
  ValueList out, row;
  for (const Value& item : Iterate(v)) {
    row.push_back(item);
    if (static_cast<int64_t>(row.size()) == n) {
      out.push_back(Value::List(std::move(row)));
      row.clear();
    }
  }
  if (!row.empty()) {
    if (b.Get(1) != nullptr && !b.Get(1)->is_none()) {
      while (static_cast<int64_t>(row.size()) < n) row.push_back(*b.Get(1));
    }
    out.push_back(Value::List(std::move(row)));
  }
  return Value::List(std::move(out));
}

const std::map<std::string_view, FilterFn>& Filters() {
  static const std::map<std::string_view, FilterFn> kFilters = {
      {"abs", FAbs},           {"attr", FAttr},
      {"batch", FBatch},       {"capitalize", FCapitalize},
      {"center", FCenter},     {"count", FLength},
      {"d", FDefault},         {"default", FDefault},
      {"dictsort", FDictsort}, {"e", FEscape},
      {"escape", FEscape},     {"first", FFirst},
      {"float", FFloat},       {"forceescape", FEscape},
      {"format", FFormat},     {"indent", FIndent},
      {"int", FInt},           {"items", FItems},
      {"join", FJoin},         {"last", FLast},
      {"length", FLength},     {"list", FList},
      {"lower", FLower},       {"map", FMap},
      {"max", FMax},           {"min", FMin},
      {"reject", FReject},     {"rejectattr", FRejectattr},
      {"replace", FReplace},   {"reverse", FReverse},
      {"round", FRound},       {"safe", FSafe},
      {"select", FSelect},     {"selectattr", FSelectattr},
      {"sort", FSort},         {"string", FString},
      {"sum", FSum},           {"title", FTitle},
      {"tojson", FToJson},     {"trim", FTrim},
      {"truncate", FTruncate}, {"unique", FUnique},
      {"upper", FUpper},       {"wordcount", FWordcount},
  };
  return kFilters;
}

}  // namespace

FilterFn FindFilter(std::string_view name) {
  const auto& f = Filters();
  auto it = f.find(name);
  return it == f.end() ? nullptr : it->second;
}

}  // namespace thermocline::server::jinja
