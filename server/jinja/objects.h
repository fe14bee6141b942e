// The object kinds the builtins and the interpreter share: namespace() (the one mutable
// value, written by {% set ns.attr = ... %}) and a callable wrapping a C++ function (builtin
// globals, bound methods, loop.cycle).
#pragma once

#include <functional>
#include <string>
#include <utility>

#include "server/jinja/cat.h"
#include "server/jinja/value.h"

namespace thermocline::server::jinja {

class Namespace : public Object {
 public:
  std::string TypeName() const override { return "Namespace"; }
  std::optional<Value> GetAttr(std::string_view name) const override {
    const Value* v = attrs_.Find(name);
    if (v == nullptr) return std::nullopt;
    return *v;
  }
  void Set(std::string_view name, Value v) { attrs_.Set(Value(name), std::move(v)); }
  std::string Str() const override {
    return Cat("<Namespace ", Repr(Value::MakeDict(attrs_)), ">");
  }

 private:
  Dict attrs_;
};

class Function : public Object {
 public:
  using Fn = std::function<Value(Interpreter&, CallArgs&)>;
  Function(std::string name, Fn fn, std::string type_name = "builtin_function_or_method")
      : name_(std::move(name)), fn_(std::move(fn)), type_name_(std::move(type_name)) {}
  std::string TypeName() const override { return type_name_; }
  bool callable() const override { return true; }
  Value Call(Interpreter& in, CallArgs& args) const override { return fn_(in, args); }
  std::string Str() const override { return Cat("<built-in function ", name_, ">"); }

 private:
  std::string name_;
  Fn fn_;
  std::string type_name_;
};

inline Value MakeFunction(std::string name, Function::Fn fn) {
  return Value::MakeObject(std::make_shared<Function>(std::move(name), std::move(fn)));
}

}  // namespace thermocline::server::jinja
