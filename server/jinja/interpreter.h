// Renders a parsed template: scopes as jinja2 has them (each loop iteration, macro call and
// with block gets its own; if does not), Python semantics for operators, attribute and item
// access under the immutable sandbox, macros and call blocks, loop controls. One Interpreter
// renders one template once; it is not shared between threads.
#pragma once

#include <ctime>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "server/jinja/ast.h"
#include "server/jinja/value.h"

namespace thermocline::server::jinja {

// Variables of one scope, looked up through the enclosing scopes.
class Frame {
 public:
  explicit Frame(std::shared_ptr<Frame> parent) : parent_(std::move(parent)) {}
  const Value* Lookup(std::string_view name) const;
  void Set(std::string_view name, Value v);

 private:
  std::shared_ptr<Frame> parent_;
  std::vector<std::pair<std::string, Value>> vars_;
};
using FramePtr = std::shared_ptr<Frame>;

class Interpreter {
 public:
  enum class Flow { kNormal, kBreak, kContinue };

  explicit Interpreter(std::time_t now) : now_(now) {}

  // Renders `body` with `variables` on top of the globals.
  std::string Render(const Body& body, const std::vector<std::pair<std::string, Value>>& variables);

  Flow Exec(const Body& body, const FramePtr& frame, std::string* out);
  Value Eval(const Expr& e, const FramePtr& frame);

  // obj.name and obj[key] as jinja2's sandbox resolves them.
  Value GetAttr(const Value& obj, std::string_view name);
  Value GetItem(const Value& obj, const Value& key);
  Value Call(const Value& callee, CallArgs& args);
  // A filter or test by name (map('upper'), select('odd')); throws for an unknown name.
  Value ApplyFilter(std::string_view name, const Value& operand, CallArgs& args);
  bool ApplyTest(std::string_view name, const Value& operand, CallArgs& args);
  // Runs a for loop over `items` (the recursive loop() call enters here too).
  void RunLoop(const Stmt& s, ValueList items, const FramePtr& frame, int depth, std::string* out);

  // The line of the node being evaluated, for error messages.
  int line() const { return line_; }

 private:
  void ExecOne(const Stmt& s, const FramePtr& frame, std::string* out, Flow* flow);
  void Assign(const Target& t, const Value& v, const FramePtr& frame);
  Value EvalBinary(const Expr& e, const FramePtr& frame);
  Value EvalCompare(const Expr& e, const FramePtr& frame);
  Value EvalSlice(const Expr& e, const FramePtr& frame);
  Value EvalFilter(const Expr& e, const FramePtr& frame, const Value* operand);
  CallArgs EvalArgs(const Expr& e, const FramePtr& frame);

  // Counts statements run and loop iterations, against a budget no real template comes near.
  void Step();

  std::time_t now_;
  int64_t steps_ = 0;
  int line_ = 0;
  int depth_ = 0;  // of macro calls, to stop runaway recursion
};

// Python's binary operators on values (used by the interpreter and by filters such as sum).
Value BinaryOp(BinOp op, const Value& a, const Value& b);
bool Contains(const Value& container, const Value& item);

}  // namespace thermocline::server::jinja
