// The parsed template: expression and statement nodes, each with the line it came from.
// Filters and tests are resolved to their functions when parsing, so an unknown name is a
// syntax error at load time (as in jinja2) rather than a failure of some later request.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "server/jinja/value.h"

namespace thermocline::server::jinja {

// operand: the filtered value; args: the filter's own arguments.
using FilterFn = Value (*)(Interpreter& in, const Value& operand, CallArgs& args);
using TestFn = bool (*)(Interpreter& in, const Value& operand, CallArgs& args);

struct Expr;
struct Stmt;
using ExprPtr = std::unique_ptr<Expr>;
using StmtPtr = std::unique_ptr<Stmt>;
using Body = std::vector<StmtPtr>;

enum class BinOp {
  kAdd,
  kSub,
  kMul,
  kDiv,
  kFloorDiv,
  kMod,
  kPow,
  kConcat,  // ~
  kAnd,
  kOr,
  kEq,
  kNe,
  kLt,
  kLe,
  kGt,
  kGe,
  kIn,
  kNotIn,
};

struct Expr {
  enum class Type {
    kLiteral,  // value
    kName,     // name
    kList,     // items
    kTuple,    // items
    kDict,     // items: key, value, key, value, ...
    kGetAttr,  // a.name
    kGetItem,  // a[b]
    kSlice,    // a[b:c:d], each bound optional
    kCall,     // a(items, kwargs)
    kFilter,   // a | name(items, kwargs); a is null in a filter block
    kTest,     // a is [not] name(items, kwargs)
    kNeg,      // -a
    kPos,      // +a
    kNot,      // not a
    kBinary,   // a op b
    kCompare,  // a ops[0] items[0] ops[1] items[1] ... (chained)
    kCond,     // b if a else c (c optional)
  };
  Type type;
  int line = 0;
  Value value;
  std::string name;
  BinOp op = BinOp::kAdd;
  ExprPtr a, b, c, d;
  std::vector<ExprPtr> items;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  std::vector<BinOp> ops;
  bool negated = false;
  FilterFn filter = nullptr;
  TestFn test = nullptr;
};

// What a for loop or a set binds: one name, several (tuple unpacking), or ns.attr.
struct Target {
  std::vector<std::string> names;
  bool tuple = false;
  std::string attr;  // set ns.attr: names[0] is the namespace
};

struct MacroParam {
  std::string name;
  ExprPtr default_value;  // null: required
};

struct Stmt {
  enum class Type {
    kText,         // text
    kOutput,       // {{ expr }}
    kIf,           // branches, else_body
    kFor,          // target in expr [if loop_filter] body [else else_body]
    kSet,          // target = expr
    kSetBlock,     // {% set target [| filter] %}body{% endset %}; expr: the filter or null
    kMacro,        // name(params) body
    kCallBlock,    // {% call(params) expr %}body{% endcall %}
    kFilterBlock,  // {% filter expr %}body{% endfilter %}
    kWith,         // assigns, body
    kBreak,
    kContinue,
    kScope,  // a body rendered in place ({% generation %})
  };
  Type type;
  int line = 0;
  std::string text;
  ExprPtr expr;
  std::vector<std::pair<ExprPtr, Body>> branches;
  Body body, else_body;
  Target target;
  ExprPtr loop_filter;
  bool recursive = false;
  std::string name;
  std::vector<MacroParam> params;
  std::vector<std::pair<std::string, ExprPtr>> assigns;
};

}  // namespace thermocline::server::jinja
