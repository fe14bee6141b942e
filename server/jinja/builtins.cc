// Argument binding, iteration and conversions shared by the builtins, and the globals.
#include "server/jinja/builtins.h"

#include <cmath>
#include <cstdlib>

#include "server/jinja/cat.h"
#include "server/jinja/error.h"
#include "server/jinja/interpreter.h"
#include "server/jinja/objects.h"
#include "server/jinja/strings.h"

namespace thermocline::server::jinja {
namespace {

// The sandbox's cap on range() (jinja2's MAX_RANGE).
constexpr int64_t kMaxRange = 100000;

Value Range(Interpreter&, CallArgs& args) {
  if (!args.keyword.empty()) Fail("range() takes no keyword arguments");
  const size_t n = args.positional.size();
  if (n < 1 || n > 3) Fail(Cat("range expected 1 to 3 arguments, got ", n));
  int64_t start = 0, stop = 0, step = 1;
  if (n == 1) {
    stop = ToInt(args.positional[0], "range()");
  } else {
    start = ToInt(args.positional[0], "range()");
    stop = ToInt(args.positional[1], "range()");
    if (n == 3) step = ToInt(args.positional[2], "range()");
  }
  if (step == 0) Fail("range() arg 3 must not be zero");
  const int64_t count = step > 0 ? (stop > start ? (stop - start + step - 1) / step : 0)
                                 : (start > stop ? (start - stop - step - 1) / -step : 0);
  if (count > kMaxRange) {
    Fail(Cat("Range too big. The sandbox blocks ranges larger than MAX_RANGE (", kMaxRange, ")."));
  }
  ValueList out;
  out.reserve(count);
  for (int64_t i = 0, v = start; i < count; ++i, v += step) out.push_back(Value(v));
  return Value::List(std::move(out));
}

void AddPairs(const Value& source, Dict* d, std::string_view function) {
  if (source.is_dict()) {
    for (const auto& [k, v] : source.dict().items()) d->Set(k, v);
    return;
  }
  for (const Value& item : Iterate(source)) {
    if (!item.is_list() || item.list().size() != 2) {
      Fail(Cat(function, "(): each element must be a pair"));
    }
    d->Set(item.list()[0], item.list()[1]);
  }
}

Value DictFn(Interpreter&, CallArgs& args) {
  if (args.positional.size() > 1) Fail("dict expected at most 1 argument");
  Dict d;
  if (!args.positional.empty()) AddPairs(args.positional[0], &d, "dict");
  for (auto& [k, v] : args.keyword) d.Set(Value(k), v);
  return Value::MakeDict(std::move(d));
}

Value NamespaceFn(Interpreter&, CallArgs& args) {
  auto ns = std::make_shared<Namespace>();
  if (args.positional.size() > 1) Fail("namespace() takes at most 1 positional argument");
  if (!args.positional.empty()) {
    Dict d;
    AddPairs(args.positional[0], &d, "namespace");
    for (const auto& [k, v] : d.items()) ns->Set(ToStr(k), v);
  }
  for (auto& [k, v] : args.keyword) ns->Set(k, v);
  return Value::MakeObject(std::move(ns));
}

class Cycler : public Object, public std::enable_shared_from_this<Cycler> {
 public:
  explicit Cycler(ValueList items) : items_(std::move(items)) {}
  std::string TypeName() const override { return "Cycler"; }
  std::optional<Value> GetAttr(std::string_view name) const override {
    if (name == "current") return items_[pos_];
    if (name == "next") {
      std::shared_ptr<const Cycler> self = shared_from_this();
      return MakeFunction("next", [self](Interpreter&, CallArgs&) {
        Value v = self->items_[self->pos_];
        self->pos_ = (self->pos_ + 1) % self->items_.size();
        return v;
      });
    }
    if (name == "reset") {
      std::shared_ptr<const Cycler> self = shared_from_this();
      return MakeFunction("reset", [self](Interpreter&, CallArgs&) {
        self->pos_ = 0;
        return Value::None();
      });
    }
    return std::nullopt;
  }

 private:
  ValueList items_;
  mutable size_t pos_ = 0;
};

Value CyclerFn(Interpreter&, CallArgs& args) {
  if (args.positional.empty()) Fail("at least one item has to be provided");
  return Value::MakeObject(std::make_shared<Cycler>(args.positional));
}

Value JoinerFn(Interpreter&, CallArgs& args) {
  ArgBinder b("joiner", args, {"sep"});
  const std::string sep = ToStr(b.GetOr(0, Value(", ")));
  auto used = std::make_shared<bool>(false);
  return MakeFunction("joiner", [sep, used](Interpreter&, CallArgs&) {
    if (!*used) {
      *used = true;
      return Value("");
    }
    return Value(sep);
  });
}

Value RaiseException(Interpreter&, CallArgs& args) {
  ArgBinder b("raise_exception", args, {"message"});
  throw JinjaError(JinjaError::Kind::kRaised, ToStr(b.GetOr(0, Value(""))));
}

}  // namespace

ArgBinder::ArgBinder(std::string_view function, const CallArgs& args,
                     std::vector<std::string_view> names)
    : bound_(names.size(), nullptr) {
  if (args.positional.size() > names.size()) {
    Fail(Cat(function, "() takes at most ", names.size(), " argument(s) (", args.positional.size(),
             " given)"));
  }
  for (size_t i = 0; i < args.positional.size(); ++i) bound_[i] = &args.positional[i];
  for (const auto& [key, value] : args.keyword) {
    size_t i = 0;
    while (i < names.size() && names[i] != key) ++i;
    if (i == names.size()) {
      Fail(Cat(function, "() got an unexpected keyword argument '", key, "'"));
    }
    if (bound_[i] != nullptr) {
      Fail(Cat(function, "() got multiple values for argument '", key, "'"));
    }
    bound_[i] = &value;
  }
}

ValueList Iterate(const Value& v) {
  switch (v.kind()) {
    case Value::Kind::kUndefined:
      return {};
    case Value::Kind::kList:
      return v.list();
    case Value::Kind::kDict: {
      ValueList keys;
      keys.reserve(v.dict().size());
      for (const auto& [k, val] : v.dict().items()) keys.push_back(k);
      return keys;
    }
    case Value::Kind::kString: {
      ValueList chars;
      std::string c;
      for (char32_t cp : DecodeUtf8(v.str())) {
        c.clear();
        AppendUtf8(cp, &c);
        chars.push_back(Value(c));
      }
      return chars;
    }
    default:
      Fail(Cat("'", TypeName(v), "' object is not iterable"));
  }
}

int64_t ToInt(const Value& v, std::string_view what) {
  if (v.is_int() || v.is_bool()) return v.int_value();
  if (v.is_undefined()) Fail(v.str());
  Fail(Cat(what, ": '", TypeName(v), "' object cannot be interpreted as an integer"));
}

double ToFloat(const Value& v, std::string_view what) {
  if (v.is_number()) return v.number();
  if (v.is_undefined()) Fail(v.str());
  Fail(Cat(what, ": must be real number, not ", TypeName(v)));
}

const std::string& ExpectString(const Value& v, std::string_view what) {
  if (v.is_string()) return v.str();
  if (v.is_undefined()) Fail(v.str());
  Fail(Cat(what, " must be str, not ", TypeName(v)));
}

std::vector<std::pair<std::string, Value>> Globals(std::time_t now) {
  std::vector<std::pair<std::string, Value>> g;
  g.emplace_back("range", MakeFunction("range", Range));
  g.emplace_back("dict", MakeFunction("dict", DictFn));
  g.emplace_back("namespace", MakeFunction("namespace", NamespaceFn));
  g.emplace_back("cycler", MakeFunction("cycler", CyclerFn));
  g.emplace_back("joiner", MakeFunction("joiner", JoinerFn));
  g.emplace_back("raise_exception", MakeFunction("raise_exception", RaiseException));
  g.emplace_back("strftime_now", MakeFunction("strftime_now", [now](Interpreter&, CallArgs& args) {
                   ArgBinder b("strftime_now", args, {"format"});
                   if (b.Get(0) == nullptr) Fail("strftime_now() missing argument 'format'");
                   const std::string& fmt = ExpectString(*b.Get(0), "strftime_now() format");
                   std::tm tm{};
                   localtime_r(&now, &tm);
                   char buf[512];
                   const size_t n =
                       fmt.empty() ? 0 : std::strftime(buf, sizeof(buf), fmt.c_str(), &tm);
                   return Value(std::string(buf, n));
                 }));
  return g;
}

}  // namespace thermocline::server::jinja
