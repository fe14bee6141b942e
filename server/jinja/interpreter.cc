#include "server/jinja/interpreter.h"

#include "server/jinja/builtins.h"
#include "server/jinja/callables.h"
#include "server/jinja/cat.h"
#include "server/jinja/error.h"
#include "server/jinja/objects.h"
#include "server/jinja/strings.h"

namespace thermocline::server::jinja {
namespace {

// Deeper macro recursion than this is a runaway template (Python would hit its own limit).
constexpr int kMaxCallDepth = 200;
// Statements and loop iterations one render may run: a real chat template runs thousands;
// this stops a template that would keep a request's thread busy for minutes.
constexpr int64_t kMaxSteps = 10'000'000;
// The largest text one render may produce.
constexpr size_t kMaxOutputBytes = 64u << 20;

// How jinja2 names an object in "has no attribute" messages.
std::string ObjectTypeRepr(const Value& v) {
  if (v.is_none()) return "None";
  return Cat(TypeName(v), " object");
}

Value MissingAttribute(const Value& obj, std::string_view name) {
  return Value::Undefined(Cat("'", ObjectTypeRepr(obj), "' has no attribute '", name, "'"));
}

Value MissingElement(const Value& obj, const Value& key) {
  if (key.is_string()) return MissingAttribute(obj, key.str());
  return Value::Undefined(Cat(ObjectTypeRepr(obj), " has no element ", Repr(key)));
}

[[noreturn]] void FailUndefined(const Value& v) {
  Fail(v.str().empty() ? std::string("undefined value") : v.str());
}

}  // namespace

const Value* Frame::Lookup(std::string_view name) const {
  for (const Frame* f = this; f != nullptr; f = f->parent_.get()) {
    for (const auto& [k, v] : f->vars_) {
      if (k == name) return &v;
    }
  }
  return nullptr;
}

void Frame::Set(std::string_view name, Value v) {
  for (auto& [k, old] : vars_) {
    if (k == name) {
      old = std::move(v);
      return;
    }
  }
  vars_.emplace_back(std::string(name), std::move(v));
}

std::string Interpreter::Render(const Body& body,
                                const std::vector<std::pair<std::string, Value>>& variables) {
  auto globals = std::make_shared<Frame>(nullptr);
  for (auto& [name, value] : Globals(now_)) globals->Set(name, std::move(value));
  auto context = std::make_shared<Frame>(globals);
  for (const auto& [name, value] : variables) context->Set(name, value);
  std::string out;
  Exec(body, context, &out);
  return out;
}

Interpreter::Flow Interpreter::Exec(const Body& body, const FramePtr& frame, std::string* out) {
  Flow flow = Flow::kNormal;
  for (const StmtPtr& s : body) {
    ExecOne(*s, frame, out, &flow);
    if (flow != Flow::kNormal) return flow;
  }
  return flow;
}

void Interpreter::Assign(const Target& t, const Value& v, const FramePtr& frame) {
  if (!t.attr.empty()) {
    const Value* ns = frame->Lookup(t.names[0]);
    Namespace* n =
        ns != nullptr && ns->is_object() ? dynamic_cast<Namespace*>(ns->object()) : nullptr;
    if (n == nullptr) Fail("cannot assign attribute on non-namespace object");
    n->Set(t.attr, v);
    return;
  }
  if (!t.tuple) {
    frame->Set(t.names[0], v);
    return;
  }
  if (v.is_undefined()) FailUndefined(v);
  const ValueList items = Iterate(v);
  if (items.size() < t.names.size()) {
    Fail(
        Cat("not enough values to unpack (expected ", t.names.size(), ", got ", items.size(), ")"));
  }
  if (items.size() > t.names.size()) {
    Fail(Cat("too many values to unpack (expected ", t.names.size(), ")"));
  }
  for (size_t i = 0; i < items.size(); ++i) frame->Set(t.names[i], items[i]);
}

void Interpreter::RunLoop(const Stmt& s, ValueList items, const FramePtr& frame, int depth,
                          std::string* out) {
  if (s.loop_filter) {
    ValueList kept;
    for (Value& item : items) {
      Step();
      auto f = std::make_shared<Frame>(frame);
      Assign(s.target, item, f);
      if (Truthy(Eval(*s.loop_filter, f))) kept.push_back(std::move(item));
    }
    items = std::move(kept);
  }
  if (items.empty()) {
    Exec(s.else_body, std::make_shared<Frame>(frame), out);
    return;
  }
  auto shared = std::make_shared<const ValueList>(std::move(items));
  auto loop = std::make_shared<Loop>(shared, depth, &s, frame);
  const Value loop_value = Value::MakeObject(loop);
  for (size_t i = 0; i < shared->size(); ++i) {
    Step();
    loop->set_index(i);
    auto f = std::make_shared<Frame>(frame);
    line_ = s.line;
    Assign(s.target, (*shared)[i], f);
    f->Set("loop", loop_value);
    if (Exec(s.body, f, out) == Flow::kBreak) break;
  }
}

void Interpreter::Step() {
  if (++steps_ > kMaxSteps) Fail(Cat("the template ran more than ", kMaxSteps, " steps"));
}

void Interpreter::ExecOne(const Stmt& s, const FramePtr& frame, std::string* out, Flow* flow) {
  line_ = s.line;
  Step();
  if (out->size() > kMaxOutputBytes)
    Fail(Cat("the template wrote more than ", kMaxOutputBytes, " bytes"));
  switch (s.type) {
    case Stmt::Type::kText:
      out->append(s.text);
      return;
    case Stmt::Type::kOutput:
      out->append(ToStr(Eval(*s.expr, frame)));
      return;
    case Stmt::Type::kIf:
      for (const auto& [cond, body] : s.branches) {
        if (Truthy(Eval(*cond, frame))) {
          *flow = Exec(body, frame, out);
          return;
        }
      }
      *flow = Exec(s.else_body, frame, out);
      return;
    case Stmt::Type::kFor: {
      const Value iterable = Eval(*s.expr, frame);
      RunLoop(s, Iterate(iterable), frame, 1, out);
      return;
    }
    case Stmt::Type::kSet:
      Assign(s.target, Eval(*s.expr, frame), frame);
      return;
    case Stmt::Type::kSetBlock: {
      std::string text;
      Exec(s.body, std::make_shared<Frame>(frame), &text);
      Value v(std::move(text));
      if (s.expr) v = EvalFilter(*s.expr, frame, &v);
      Assign(s.target, v, frame);
      return;
    }
    case Stmt::Type::kMacro:
      frame->Set(s.name, Value::MakeObject(std::make_shared<Macro>(&s, frame, s.name)));
      return;
    case Stmt::Type::kCallBlock: {
      const Expr& call = *s.expr;
      const Value callee = Eval(*call.a, frame);
      CallArgs args = EvalArgs(call, frame);
      args.keyword.emplace_back("caller",
                                Value::MakeObject(std::make_shared<Macro>(&s, frame, "caller")));
      line_ = s.line;
      out->append(ToStr(Call(callee, args)));
      return;
    }
    case Stmt::Type::kFilterBlock: {
      std::string text;
      Exec(s.body, std::make_shared<Frame>(frame), &text);
      const Value v(std::move(text));
      out->append(ToStr(EvalFilter(*s.expr, frame, &v)));
      return;
    }
    case Stmt::Type::kWith: {
      auto f = std::make_shared<Frame>(frame);
      for (const auto& [name, expr] : s.assigns) f->Set(name, Eval(*expr, frame));
      *flow = Exec(s.body, f, out);
      return;
    }
    case Stmt::Type::kBreak:
      *flow = Flow::kBreak;
      return;
    case Stmt::Type::kContinue:
      *flow = Flow::kContinue;
      return;
    case Stmt::Type::kScope:
      *flow = Exec(s.body, frame, out);
      return;
  }
}

CallArgs Interpreter::EvalArgs(const Expr& e, const FramePtr& frame) {
  CallArgs args;
  args.positional.reserve(e.items.size());
  for (const ExprPtr& a : e.items) args.positional.push_back(Eval(*a, frame));
  for (const auto& [k, v] : e.kwargs) args.keyword.emplace_back(k, Eval(*v, frame));
  return args;
}

Value Interpreter::EvalFilter(const Expr& e, const FramePtr& frame, const Value* operand) {
  Value v;
  if (e.a == nullptr) {
    v = *operand;
  } else if (e.a->type == Expr::Type::kFilter) {
    v = EvalFilter(*e.a, frame, operand);
  } else {
    v = Eval(*e.a, frame);
  }
  CallArgs args = EvalArgs(e, frame);
  line_ = e.line;
  return e.filter(*this, v, args);
}

Value Interpreter::Eval(const Expr& e, const FramePtr& frame) {
  line_ = e.line;
  switch (e.type) {
    case Expr::Type::kLiteral:
      return e.value;
    case Expr::Type::kName: {
      const Value* v = frame->Lookup(e.name);
      if (v != nullptr) return *v;
      return Value::Undefined(Cat("'", e.name, "' is undefined"));
    }
    case Expr::Type::kList:
    case Expr::Type::kTuple: {
      ValueList items;
      items.reserve(e.items.size());
      for (const ExprPtr& i : e.items) items.push_back(Eval(*i, frame));
      return e.type == Expr::Type::kList ? Value::List(std::move(items))
                                         : Value::Tuple(std::move(items));
    }
    case Expr::Type::kDict: {
      Dict d;
      for (size_t i = 0; i + 1 < e.items.size(); i += 2) {
        Value k = Eval(*e.items[i], frame);
        if (k.is_list() && !k.is_tuple()) Fail("unhashable type: 'list'");
        if (k.is_dict()) Fail("unhashable type: 'dict'");
        d.Set(std::move(k), Eval(*e.items[i + 1], frame));
      }
      return Value::MakeDict(std::move(d));
    }
    case Expr::Type::kGetAttr: {
      const Value obj = Eval(*e.a, frame);
      line_ = e.line;
      return GetAttr(obj, e.name);
    }
    case Expr::Type::kGetItem: {
      const Value obj = Eval(*e.a, frame);
      const Value key = Eval(*e.b, frame);
      line_ = e.line;
      return GetItem(obj, key);
    }
    case Expr::Type::kSlice:
      return EvalSlice(e, frame);
    case Expr::Type::kCall: {
      const Value callee = Eval(*e.a, frame);
      CallArgs args = EvalArgs(e, frame);
      line_ = e.line;
      return Call(callee, args);
    }
    case Expr::Type::kFilter:
      return EvalFilter(e, frame, nullptr);
    case Expr::Type::kTest: {
      const Value v = Eval(*e.a, frame);
      CallArgs args = EvalArgs(e, frame);
      line_ = e.line;
      return Value(e.test(*this, v, args) != e.negated);
    }
    case Expr::Type::kNeg:
    case Expr::Type::kPos: {
      const Value v = Eval(*e.a, frame);
      line_ = e.line;
      if (v.is_undefined()) FailUndefined(v);
      if (v.is_float())
        return Value(e.type == Expr::Type::kNeg ? -v.float_value() : v.float_value());
      if (v.is_int() || v.is_bool()) {
        return Value(e.type == Expr::Type::kNeg ? -v.int_value() : v.int_value());
      }
      Fail(Cat("bad operand type for unary ", e.type == Expr::Type::kNeg ? "-" : "+", ": '",
               TypeName(v), "'"));
    }
    case Expr::Type::kNot:
      return Value(!Truthy(Eval(*e.a, frame)));
    case Expr::Type::kBinary:
      return EvalBinary(e, frame);
    case Expr::Type::kCompare:
      return EvalCompare(e, frame);
    case Expr::Type::kCond:
      if (Truthy(Eval(*e.a, frame))) return Eval(*e.b, frame);
      if (e.c) return Eval(*e.c, frame);
      return Value::Undefined(Cat("the inline if-expression on line ", e.line,
                                  " evaluated to false and no else section was "
                                  "defined."));
  }
  return Value();
}

Value Interpreter::EvalBinary(const Expr& e, const FramePtr& frame) {
  if (e.op == BinOp::kAnd) {
    Value a = Eval(*e.a, frame);
    return Truthy(a) ? Eval(*e.b, frame) : a;
  }
  if (e.op == BinOp::kOr) {
    Value a = Eval(*e.a, frame);
    return Truthy(a) ? a : Eval(*e.b, frame);
  }
  const Value a = Eval(*e.a, frame);
  const Value b = Eval(*e.b, frame);
  line_ = e.line;
  return BinaryOp(e.op, a, b);
}

Value Interpreter::EvalCompare(const Expr& e, const FramePtr& frame) {
  Value left = Eval(*e.a, frame);
  for (size_t i = 0; i < e.ops.size(); ++i) {
    Value right = Eval(*e.items[i], frame);
    line_ = e.line;
    bool ok = false;
    switch (e.ops[i]) {
      case BinOp::kEq:
        ok = Equal(left, right);
        break;
      case BinOp::kNe:
        ok = !Equal(left, right);
        break;
      case BinOp::kLt:
        ok = Less(left, right);
        break;
      case BinOp::kLe:
        ok = Less(left, right) || Equal(left, right);
        break;
      case BinOp::kGt:
        ok = Less(right, left);
        break;
      case BinOp::kGe:
        ok = Less(right, left) || Equal(left, right);
        break;
      case BinOp::kIn:
        ok = Contains(right, left);
        break;
      case BinOp::kNotIn:
        ok = !Contains(right, left);
        break;
      default:
        break;
    }
    if (!ok) return Value(false);
    left = std::move(right);
  }
  return Value(true);
}

Value Interpreter::EvalSlice(const Expr& e, const FramePtr& frame) {
  const Value obj = Eval(*e.a, frame);
  auto bound = [&](const ExprPtr& x) -> std::optional<int64_t> {
    if (!x) return std::nullopt;
    const Value v = Eval(*x, frame);
    if (v.is_none()) return std::nullopt;
    if (!v.is_int() && !v.is_bool()) {
      Fail("slice indices must be integers or None or have an __index__ method");
    }
    return v.int_value();
  };
  const auto start = bound(e.b), stop = bound(e.c), step = bound(e.d);
  line_ = e.line;
  if (obj.is_undefined()) FailUndefined(obj);
  if (obj.is_string()) return Value(SliceString(obj.str(), start, stop, step));
  if (obj.is_list()) {
    ValueList out;
    for (int64_t i : SliceIndices(static_cast<int64_t>(obj.list().size()), start, stop, step)) {
      out.push_back(obj.list()[i]);
    }
    return obj.is_tuple() ? Value::Tuple(std::move(out)) : Value::List(std::move(out));
  }
  return Value::Undefined(Cat(ObjectTypeRepr(obj), " has no element slice"));
}

Value Interpreter::GetAttr(const Value& obj, std::string_view name) {
  switch (obj.kind()) {
    case Value::Kind::kUndefined:
      FailUndefined(obj);
    case Value::Kind::kObject: {
      std::optional<Value> v = obj.object()->GetAttr(name);
      if (v) return *v;
      return MissingAttribute(obj, name);
    }
    default:
      break;
  }
  if (!name.empty() && name[0] == '_') {
    return Value::Undefined(
        Cat("access to attribute '", name, "' of '", TypeName(obj), "' object is unsafe."), true);
  }
  if (std::optional<Value> m = FindMethod(obj, name)) return *m;
  if (obj.is_dict()) {
    const Value* v = obj.dict().Find(name);
    if (v != nullptr) return *v;
  }
  return MissingAttribute(obj, name);
}

Value Interpreter::GetItem(const Value& obj, const Value& key) {
  switch (obj.kind()) {
    case Value::Kind::kUndefined:
      FailUndefined(obj);
    case Value::Kind::kDict: {
      if ((key.is_list() && !key.is_tuple()) || key.is_dict()) break;
      const Value* v = obj.dict().Find(key);
      if (v != nullptr) return *v;
      break;
    }
    case Value::Kind::kString:
      if (key.is_int() || key.is_bool()) {
        std::optional<std::string> c = CharAt(obj.str(), key.int_value());
        if (c) return Value(std::move(*c));
      }
      break;
    case Value::Kind::kList:
      if (key.is_int() || key.is_bool()) {
        int64_t i = key.int_value();
        const int64_t n = static_cast<int64_t>(obj.list().size());
        if (i < 0) i += n;
        if (i >= 0 && i < n) return obj.list()[i];
      }
      break;
    default:
      break;
  }
  // jinja2 falls back to the attribute of that name for a string key.
  if (key.is_string()) {
    if (obj.is_object()) {
      std::optional<Value> v = obj.object()->GetAttr(key.str());
      if (v) return *v;
    } else if (!key.str().empty() && key.str()[0] != '_') {
      if (std::optional<Value> m = FindMethod(obj, key.str())) return *m;
    }
  }
  return MissingElement(obj, key);
}

Value Interpreter::Call(const Value& callee, CallArgs& args) {
  if (callee.is_undefined()) FailUndefined(callee);
  if (!callee.is_object() || !callee.object()->callable()) {
    Fail(Cat("'", TypeName(callee), "' object is not callable"));
  }
  if (++depth_ > kMaxCallDepth) {
    depth_ = 0;
    Fail("maximum recursion depth exceeded in the template's macros");
  }
  const int line = line_;
  Value result = callee.object()->Call(*this, args);
  line_ = line;
  --depth_;
  return result;
}

Value Interpreter::ApplyFilter(std::string_view name, const Value& operand, CallArgs& args) {
  FilterFn f = FindFilter(name);
  if (f == nullptr) Fail(Cat("no filter named '", name, "'"));
  return f(*this, operand, args);
}

bool Interpreter::ApplyTest(std::string_view name, const Value& operand, CallArgs& args) {
  TestFn t = FindTest(name);
  if (t == nullptr) Fail(Cat("no test named '", name, "'"));
  return t(*this, operand, args);
}

}  // namespace thermocline::server::jinja
