// The callables the interpreter makes: macros (and a call block's caller()), and the `loop`
// variable of a for loop (loop.index ..., loop.cycle(), loop.changed(), loop(...) in a
// recursive loop). Private to server/jinja.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "server/jinja/ast.h"
#include "server/jinja/cat.h"
#include "server/jinja/interpreter.h"
#include "server/jinja/value.h"

namespace thermocline::server::jinja {

// A macro, or the caller() of a call block: a body rendered in a new scope over the scope it
// was defined in.
class Macro : public Object {
 public:
  Macro(const Stmt* def, FramePtr closure, std::string name)
      : def_(def), closure_(std::move(closure)), name_(std::move(name)) {}
  std::string TypeName() const override { return "Macro"; }
  bool callable() const override { return true; }
  std::string Str() const override { return Cat("<Macro '", name_, "'>"); }
  std::optional<Value> GetAttr(std::string_view name) const override {
    if (name == "name") return Value(name_);
    return std::nullopt;
  }

  Value Call(Interpreter& in, CallArgs& args) const override;

 private:
  const Stmt* def_;
  FramePtr closure_;
  std::string name_;
};

// The `loop` variable of a for loop.
class Loop : public Object, public std::enable_shared_from_this<Loop> {
 public:
  Loop(std::shared_ptr<const ValueList> items, int depth, const Stmt* stmt, FramePtr frame)
      : items_(std::move(items)), depth_(depth), stmt_(stmt), frame_(std::move(frame)) {}
  void set_index(size_t i) { index_ = i; }
  std::string TypeName() const override { return "LoopContext"; }
  bool callable() const override { return stmt_->recursive; }

  std::optional<Value> GetAttr(std::string_view name) const override;

  Value Call(Interpreter& in, CallArgs& args) const override;

 private:
  std::shared_ptr<const ValueList> items_;
  size_t index_ = 0;
  int depth_;
  const Stmt* stmt_;
  FramePtr frame_;
  mutable Value last_changed_;
  mutable bool has_last_ = false;
};

}  // namespace thermocline::server::jinja
