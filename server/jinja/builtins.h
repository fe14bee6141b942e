// The builtins a template can reach: filters and tests (by name, for the parser and for
// map/select), the Python methods of str, list and dict that the immutable sandbox allows, the
// globals (range, namespace, dict, cycler, joiner, raise_exception, strftime_now), and the
// argument binding they share.
#pragma once

#include <ctime>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "server/jinja/ast.h"
#include "server/jinja/value.h"

namespace thermocline::server::jinja {

// null when there is no such filter / test.
FilterFn FindFilter(std::string_view name);
TestFn FindTest(std::string_view name);

// obj.name for a str, list or dict method: a bound method, or an Undefined that refuses a
// mutating one the way the sandbox does; nullopt when the type has no such method.
std::optional<Value> FindMethod(const Value& obj, std::string_view name);

// The globals every render sees. `now` is what strftime_now formats (local time).
std::vector<std::pair<std::string, Value>> Globals(std::time_t now);

// Binds call arguments to named parameters, Python style: positionals first, then keywords;
// an unknown keyword or too many positionals is a TypeError naming `function`.
class ArgBinder {
 public:
  ArgBinder(std::string_view function, const CallArgs& args, std::vector<std::string_view> names);
  // The argument for parameter i, or nullopt when not given.
  const Value* Get(size_t i) const { return bound_[i]; }
  Value GetOr(size_t i, Value fallback) const { return bound_[i] ? *bound_[i] : fallback; }

 private:
  std::vector<const Value*> bound_;
};

// The items a for loop (or list()) walks: list items, dict keys, string characters; an
// undefined value walks nothing. Throws for values that are not iterable.
ValueList Iterate(const Value& v);

// Python int(), float() and str-or-fail conversions used by filters and methods.
int64_t ToInt(const Value& v, std::string_view what);
double ToFloat(const Value& v, std::string_view what);
const std::string& ExpectString(const Value& v, std::string_view what);

}  // namespace thermocline::server::jinja
