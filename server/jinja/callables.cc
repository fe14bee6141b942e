#include "server/jinja/callables.h"

#include "server/jinja/builtins.h"
#include "server/jinja/cat.h"
#include "server/jinja/error.h"
#include "server/jinja/objects.h"

namespace thermocline::server::jinja {

Value Macro::Call(Interpreter& in, CallArgs& args) const {
  auto frame = std::make_shared<Frame>(closure_);
  size_t next = 0;
  ValueList varargs;
  Dict kwargs;
  std::vector<bool> given(def_->params.size(), false);
  for (size_t i = 0; i < def_->params.size() && next < args.positional.size(); ++i) {
    frame->Set(def_->params[i].name, args.positional[next++]);
    given[i] = true;
  }
  while (next < args.positional.size()) varargs.push_back(args.positional[next++]);
  for (auto& [key, value] : args.keyword) {
    bool matched = false;
    for (size_t i = 0; i < def_->params.size(); ++i) {
      if (def_->params[i].name != key) continue;
      if (given[i]) Fail(Cat("macro '", name_, "' got multiple values for argument '", key, "'"));
      frame->Set(key, value);
      given[i] = matched = true;
    }
    if (matched) continue;
    if (key == "caller") {
      frame->Set("caller", value);
    } else {
      kwargs.Set(Value(key), value);
    }
  }
  for (size_t i = 0; i < def_->params.size(); ++i) {
    if (given[i]) continue;
    const MacroParam& p = def_->params[i];
    frame->Set(p.name, p.default_value
                           ? in.Eval(*p.default_value, frame)
                           : Value::Undefined(Cat("parameter '", p.name, "' was not provided")));
  }
  frame->Set("varargs", Value::Tuple(std::move(varargs)));
  frame->Set("kwargs", Value::MakeDict(std::move(kwargs)));
  std::string out;
  in.Exec(def_->body, frame, &out);
  return Value(std::move(out));
}
std::optional<Value> Loop::GetAttr(std::string_view name) const {
  const int64_t n = static_cast<int64_t>(items_->size());
  const int64_t i = static_cast<int64_t>(index_);
  if (name == "index") return Value(i + 1);
  if (name == "index0") return Value(i);
  if (name == "revindex") return Value(n - i);
  if (name == "revindex0") return Value(n - i - 1);
  if (name == "first") return Value(i == 0);
  if (name == "last") return Value(i == n - 1);
  if (name == "length") return Value(n);
  if (name == "depth") return Value(static_cast<int64_t>(depth_));
  if (name == "depth0") return Value(static_cast<int64_t>(depth_ - 1));
  if (name == "previtem") {
    return i > 0 ? (*items_)[i - 1] : Value::Undefined("there is no previous item");
  }
  if (name == "nextitem") {
    return i + 1 < n ? (*items_)[i + 1] : Value::Undefined("there is no next item");
  }
  if (name == "cycle") {
    std::shared_ptr<const Loop> self = shared_from_this();
    return MakeFunction("cycle", [self](Interpreter&, CallArgs& args) {
      if (args.positional.empty()) Fail("no items for cycling given");
      return args.positional[self->index_ % args.positional.size()];
    });
  }
  if (name == "changed") {
    std::shared_ptr<const Loop> self = shared_from_this();
    return MakeFunction("changed", [self](Interpreter&, CallArgs& args) {
      Value now = Value::List(args.positional);
      if (self->has_last_ && Equal(now, self->last_changed_)) return Value(false);
      self->last_changed_ = now;
      self->has_last_ = true;
      return Value(true);
    });
  }
  return std::nullopt;
}
Value Loop::Call(Interpreter& in, CallArgs& args) const {
  if (!stmt_->recursive) return Object::Call(in, args);
  if (args.positional.size() != 1) Fail("loop() takes exactly one argument");
  std::string out;
  in.RunLoop(*stmt_, Iterate(args.positional[0]), frame_, depth_ + 1, &out);
  return Value(std::move(out));
}
}  // namespace thermocline::server::jinja
