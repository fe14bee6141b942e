// The expression half of the parser, following jinja2's precedence: conditional expression,
// or, and, not, comparisons (incl. in / not in), + -, ~, * / // %, **, unary - +, then
// postfix (attribute, subscript, call) and filters / tests.
#include "server/jinja/builtins.h"
#include "server/jinja/cat.h"
#include "server/jinja/parser_internal.h"

namespace thermocline::server::jinja {

ExprPtr Parser::ParseTuple(bool with_condexpr, bool explicit_parens,
                           std::initializer_list<std::string_view> extra_end_names) {
  const int line = Peek().line;
  std::vector<ExprPtr> items;
  bool is_tuple = false;
  auto at_end = [&] {
    const Token& t = Peek();
    if (t.type == Token::Type::kVarEnd || t.type == Token::Type::kBlockEnd || IsOp(t, ")"))
      return true;
    for (std::string_view n : extra_end_names) {
      if (IsName(t, n)) return true;
    }
    return false;
  };
  while (true) {
    if (!items.empty()) ExpectOp(",");
    if (at_end()) break;
    items.push_back(ParseExpression(with_condexpr));
    if (IsOp(Peek(), ",")) {
      is_tuple = true;
    } else {
      break;
    }
  }
  if (!is_tuple) {
    if (!items.empty()) return std::move(items[0]);
    if (!explicit_parens) Unexpected(Peek(), "an expression");
  }
  ExprPtr t = MakeExpr(Expr::Type::kTuple, line);
  t->items = std::move(items);
  return t;
}

// Deeper nesting than this is no real template; refusing it keeps the parser's (and the
// interpreter's) recursion well inside the stack.
constexpr int kMaxNesting = 200;

Parser::DepthGuard::DepthGuard(Parser* p, int line) : p_(p) {
  if (++p_->depth_ > kMaxNesting) {
    --p_->depth_;
    p_->Error(Cat("the template nests deeper than ", kMaxNesting, " levels"), line);
  }
}

ExprPtr Parser::ParseExpression(bool with_condexpr) {
  DepthGuard guard(this, Peek().line);
  return with_condexpr ? ParseCond() : ParseOr();
}

ExprPtr Parser::ParseCond() {
  ExprPtr expr = ParseOr();
  while (IsName(Peek(), "if")) {
    const int line = Next().line;
    ExprPtr cond = MakeExpr(Expr::Type::kCond, line);
    cond->b = std::move(expr);
    cond->a = ParseOr();
    if (SkipName("else")) cond->c = ParseCond();
    expr = std::move(cond);
  }
  return expr;
}

ExprPtr Parser::ParseOr() {
  ExprPtr left = ParseAnd();
  while (IsName(Peek(), "or")) {
    ExprPtr e = MakeExpr(Expr::Type::kBinary, Next().line);
    e->op = BinOp::kOr;
    e->a = std::move(left);
    e->b = ParseAnd();
    left = std::move(e);
  }
  return left;
}

ExprPtr Parser::ParseAnd() {
  ExprPtr left = ParseNot();
  while (IsName(Peek(), "and")) {
    ExprPtr e = MakeExpr(Expr::Type::kBinary, Next().line);
    e->op = BinOp::kAnd;
    e->a = std::move(left);
    e->b = ParseNot();
    left = std::move(e);
  }
  return left;
}

ExprPtr Parser::ParseNot() {
  DepthGuard guard(this, Peek().line);
  if (IsName(Peek(), "not")) {
    ExprPtr e = MakeExpr(Expr::Type::kNot, Next().line);
    e->a = ParseNot();
    return e;
  }
  return ParseCompare();
}

ExprPtr Parser::ParseCompare() {
  const int line = Peek().line;
  ExprPtr expr = ParseMath1();
  ExprPtr cmp;
  while (true) {
    const Token& t = Peek();
    BinOp op;
    if (IsOp(t, "==")) {
      op = BinOp::kEq;
    } else if (IsOp(t, "!=")) {
      op = BinOp::kNe;
    } else if (IsOp(t, "<")) {
      op = BinOp::kLt;
    } else if (IsOp(t, "<=")) {
      op = BinOp::kLe;
    } else if (IsOp(t, ">")) {
      op = BinOp::kGt;
    } else if (IsOp(t, ">=")) {
      op = BinOp::kGe;
    } else if (IsName(t, "in")) {
      op = BinOp::kIn;
    } else if (IsName(t, "not") && IsName(Peek(1), "in")) {
      Next();
      op = BinOp::kNotIn;
    } else {
      break;
    }
    Next();
    if (!cmp) {
      cmp = MakeExpr(Expr::Type::kCompare, line);
      cmp->a = std::move(expr);
    }
    cmp->ops.push_back(op);
    cmp->items.push_back(ParseMath1());
  }
  return cmp ? std::move(cmp) : std::move(expr);
}

ExprPtr Parser::ParseMath1() {
  ExprPtr left = ParseConcat();
  while (IsOp(Peek(), "+") || IsOp(Peek(), "-")) {
    const Token& t = Next();
    ExprPtr e = MakeExpr(Expr::Type::kBinary, t.line);
    e->op = t.text == "+" ? BinOp::kAdd : BinOp::kSub;
    e->a = std::move(left);
    e->b = ParseConcat();
    left = std::move(e);
  }
  return left;
}

ExprPtr Parser::ParseConcat() {
  ExprPtr left = ParseMath2();
  while (IsOp(Peek(), "~")) {
    ExprPtr e = MakeExpr(Expr::Type::kBinary, Next().line);
    e->op = BinOp::kConcat;
    e->a = std::move(left);
    e->b = ParseMath2();
    left = std::move(e);
  }
  return left;
}

ExprPtr Parser::ParseMath2() {
  ExprPtr left = ParsePow();
  while (IsOp(Peek(), "*") || IsOp(Peek(), "/") || IsOp(Peek(), "//") || IsOp(Peek(), "%")) {
    const Token& t = Next();
    ExprPtr e = MakeExpr(Expr::Type::kBinary, t.line);
    e->op = t.text == "*"    ? BinOp::kMul
            : t.text == "/"  ? BinOp::kDiv
            : t.text == "//" ? BinOp::kFloorDiv
                             : BinOp::kMod;
    e->a = std::move(left);
    e->b = ParsePow();
    left = std::move(e);
  }
  return left;
}

ExprPtr Parser::ParsePow() {
  ExprPtr left = ParseUnary(true);
  while (IsOp(Peek(), "**")) {
    ExprPtr e = MakeExpr(Expr::Type::kBinary, Next().line);
    e->op = BinOp::kPow;
    e->a = std::move(left);
    e->b = ParseUnary(true);
    left = std::move(e);
  }
  return left;
}

ExprPtr Parser::ParseUnary(bool with_filter) {
  DepthGuard guard(this, Peek().line);
  ExprPtr node;
  if (IsOp(Peek(), "-") || IsOp(Peek(), "+")) {
    const Token& t = Next();
    node = MakeExpr(t.text == "-" ? Expr::Type::kNeg : Expr::Type::kPos, t.line);
    node->a = ParseUnary(false);
  } else {
    node = ParsePrimary();
  }
  node = ParsePostfix(std::move(node));
  if (with_filter) node = ParseFilterExpr(std::move(node));
  return node;
}

ExprPtr Parser::ParsePrimary() {
  const Token& t = Peek();
  const int line = t.line;
  switch (t.type) {
    case Token::Type::kName: {
      Next();
      ExprPtr e = MakeExpr(Expr::Type::kLiteral, line);
      if (t.text == "true" || t.text == "True") {
        e->value = Value(true);
      } else if (t.text == "false" || t.text == "False") {
        e->value = Value(false);
      } else if (t.text == "none" || t.text == "None") {
        e->value = Value::None();
      } else {
        e->type = Expr::Type::kName;
        e->name = t.text;
      }
      return e;
    }
    case Token::Type::kString: {
      std::string s;
      while (Peek().type == Token::Type::kString) s += Next().text;
      ExprPtr e = MakeExpr(Expr::Type::kLiteral, line);
      e->value = Value(std::move(s));
      return e;
    }
    case Token::Type::kInt:
    case Token::Type::kFloat: {
      ExprPtr e = MakeExpr(Expr::Type::kLiteral, line);
      e->value = t.type == Token::Type::kInt ? Value(t.int_value) : Value(t.float_value);
      Next();
      return e;
    }
    case Token::Type::kOperator:
      if (t.text == "(") {
        Next();
        ExprPtr e = ParseTuple(true, true);
        ExpectOp(")");
        return e;
      }
      if (t.text == "[") {
        Next();
        ExprPtr e = MakeExpr(Expr::Type::kList, line);
        while (!IsOp(Peek(), "]")) {
          if (!e->items.empty()) ExpectOp(",");
          if (IsOp(Peek(), "]")) break;
          e->items.push_back(ParseExpression());
        }
        Next();
        return e;
      }
      if (t.text == "{") {
        Next();
        ExprPtr e = MakeExpr(Expr::Type::kDict, line);
        while (!IsOp(Peek(), "}")) {
          if (!e->items.empty()) ExpectOp(",");
          if (IsOp(Peek(), "}")) break;
          e->items.push_back(ParseExpression());
          ExpectOp(":");
          e->items.push_back(ParseExpression());
        }
        Next();
        return e;
      }
      break;
    default:
      break;
  }
  Unexpected(t, "an expression");
}

ExprPtr Parser::ParsePostfix(ExprPtr node) {
  while (true) {
    if (IsOp(Peek(), ".") || IsOp(Peek(), "[")) {
      node = ParseSubscript(std::move(node));
    } else if (IsOp(Peek(), "(")) {
      node = ParseCall(std::move(node));
    } else {
      return node;
    }
  }
}

ExprPtr Parser::ParseFilterExpr(ExprPtr node) {
  while (true) {
    if (IsOp(Peek(), "|")) {
      Next();
      node = ParseFilter(std::move(node), true);
    } else if (IsName(Peek(), "is")) {
      node = ParseTest(std::move(node));
    } else if (IsOp(Peek(), "(")) {
      node = ParseCall(std::move(node));
    } else {
      return node;
    }
  }
}

ExprPtr Parser::ParseSubscript(ExprPtr node) {
  const Token& t = Next();
  const int line = t.line;
  if (t.text == ".") {
    const Token& attr = Next();
    if (attr.type == Token::Type::kName) {
      ExprPtr e = MakeExpr(Expr::Type::kGetAttr, line);
      e->a = std::move(node);
      e->name = attr.text;
      return e;
    }
    if (attr.type == Token::Type::kInt) {
      ExprPtr e = MakeExpr(Expr::Type::kGetItem, line);
      e->a = std::move(node);
      e->b = MakeExpr(Expr::Type::kLiteral, line);
      e->b->value = Value(attr.int_value);
      return e;
    }
    Unexpected(attr, "an attribute name");
  }
  // [index] or [start:stop:step]
  ExprPtr start;
  if (!IsOp(Peek(), ":")) {
    start = ParseExpression();
    if (!IsOp(Peek(), ":")) {
      ExpectOp("]");
      ExprPtr e = MakeExpr(Expr::Type::kGetItem, line);
      e->a = std::move(node);
      e->b = std::move(start);
      return e;
    }
  }
  Next();  // :
  ExprPtr e = MakeExpr(Expr::Type::kSlice, line);
  e->a = std::move(node);
  e->b = std::move(start);
  if (!IsOp(Peek(), "]") && !IsOp(Peek(), ":")) e->c = ParseExpression();
  if (SkipOp(":") && !IsOp(Peek(), "]")) e->d = ParseExpression();
  ExpectOp("]");
  return e;
}

void Parser::ParseCallArgs(Expr* call) {
  ExpectOp("(");
  bool first = true;
  while (!IsOp(Peek(), ")")) {
    if (!first) ExpectOp(",");
    first = false;
    if (IsOp(Peek(), ")")) break;
    if (IsOp(Peek(), "*") || IsOp(Peek(), "**")) {
      Error("*args and **kwargs in calls are not supported", Peek().line);
    }
    if (Peek().type == Token::Type::kName && IsOp(Peek(1), "=")) {
      std::string key = Next().text;
      Next();
      call->kwargs.emplace_back(std::move(key), ParseExpression());
    } else {
      if (!call->kwargs.empty()) {
        Error("a positional argument follows a keyword argument", Peek().line);
      }
      call->items.push_back(ParseExpression());
    }
  }
  Next();
}

ExprPtr Parser::ParseCall(ExprPtr node) {
  ExprPtr e = MakeExpr(Expr::Type::kCall, Peek().line);
  e->a = std::move(node);
  ParseCallArgs(e.get());
  return e;
}

ExprPtr Parser::ParseFilter(ExprPtr node, bool after_pipe) {
  while (true) {
    const Token& t = Peek();
    const int line = t.line;
    std::string name = ExpectIdentifier("a filter name");
    while (IsOp(Peek(), ".")) {
      Next();
      CatTo(&name, ".", ExpectIdentifier("a filter name"));
    }
    ExprPtr e = MakeExpr(Expr::Type::kFilter, line);
    e->name = name;
    e->filter = FindFilter(name);
    if (e->filter == nullptr) Error(Cat("no filter named '", name, "'"), line);
    e->a = std::move(node);
    if (IsOp(Peek(), "(")) ParseCallArgs(e.get());
    node = std::move(e);
    if (!SkipOp("|")) return node;
  }
}

ExprPtr Parser::ParseTest(ExprPtr node) {
  const int line = Next().line;  // is
  const bool negated = SkipName("not");
  std::string name = ExpectIdentifier("a test name");
  while (IsOp(Peek(), ".")) {
    Next();
    CatTo(&name, ".", ExpectIdentifier("a test name"));
  }
  ExprPtr e = MakeExpr(Expr::Type::kTest, line);
  e->name = name;
  e->negated = negated;
  e->test = FindTest(name);
  if (e->test == nullptr) Error(Cat("no test named '", name, "'"), line);
  e->a = std::move(node);
  const Token& t = Peek();
  if (IsOp(t, "(")) {
    ParseCallArgs(e.get());
  } else if ((t.type == Token::Type::kName || t.type == Token::Type::kString ||
              t.type == Token::Type::kInt || t.type == Token::Type::kFloat || IsOp(t, "[") ||
              IsOp(t, "{")) &&
             !IsName(t, "else") && !IsName(t, "or") && !IsName(t, "and")) {
    if (IsName(t, "is")) Error("you cannot chain multiple tests with 'is'", t.line);
    e->items.push_back(ParsePostfix(ParsePrimary()));
  }
  return e;
}

}  // namespace thermocline::server::jinja
