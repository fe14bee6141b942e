// The parser's class, shared by its statement half (parser.cc) and expression half
// (parser_expr.cc). Private to server/jinja.
#pragma once

#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

#include "server/jinja/ast.h"
#include "server/jinja/lexer.h"

namespace thermocline::server::jinja {

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : tokens_(std::move(tokens)) {}
  Body ParseAll();

 private:
  struct OpenBlock {
    std::string_view tag;
    int line;
  };

  // Statements (parser.cc).
  Body ParseBody(std::initializer_list<std::string_view> end_tags, const OpenBlock& open,
                 std::string* found);
  StmtPtr ParseTag();
  StmtPtr ParseFor(int line);
  StmtPtr ParseIf(int line);
  StmtPtr ParseSet(int line);
  StmtPtr ParseMacro(int line);
  StmtPtr ParseCallBlock(int line);
  StmtPtr ParseFilterBlock(int line);
  StmtPtr ParseWith(int line);
  Target ParseTarget(bool allow_namespace, bool for_loop);
  std::vector<MacroParam> ParseParams();

  // Expressions (parser_expr.cc).
  ExprPtr ParseTuple(bool with_condexpr, bool explicit_parens,
                     std::initializer_list<std::string_view> extra_end_names = {});
  ExprPtr ParseExpression(bool with_condexpr = true);
  ExprPtr ParseCond();
  ExprPtr ParseOr();
  ExprPtr ParseAnd();
  ExprPtr ParseNot();
  ExprPtr ParseCompare();
  ExprPtr ParseMath1();
  ExprPtr ParseConcat();
  ExprPtr ParseMath2();
  ExprPtr ParsePow();
  ExprPtr ParseUnary(bool with_filter);
  ExprPtr ParsePrimary();
  ExprPtr ParsePostfix(ExprPtr node);
  ExprPtr ParseFilterExpr(ExprPtr node);
  ExprPtr ParseSubscript(ExprPtr node);
  ExprPtr ParseCall(ExprPtr node);
  // `node` may be null (a filter block's chain).
  ExprPtr ParseFilter(ExprPtr node, bool after_pipe);
  ExprPtr ParseTest(ExprPtr node);
  void ParseCallArgs(Expr* call);

  // Token stream.
  const Token& Peek(size_t k = 0) const {
    const size_t i = pos_ + k;
    return i < tokens_.size() ? tokens_[i] : tokens_.back();
  }
  const Token& Next() { return tokens_[pos_ < tokens_.size() - 1 ? pos_++ : pos_]; }
  bool IsName(const Token& t, std::string_view name) const {
    return t.type == Token::Type::kName && t.text == name;
  }
  bool IsOp(const Token& t, std::string_view op) const {
    return t.type == Token::Type::kOperator && t.text == op;
  }
  bool SkipName(std::string_view name);
  bool SkipOp(std::string_view op);
  void ExpectOp(std::string_view op);
  void ExpectName(std::string_view name);
  std::string ExpectIdentifier(std::string_view what);
  void ExpectBlockEnd(std::string_view tag);
  [[noreturn]] void Error(const std::string& message, int line) const;
  [[noreturn]] void Unexpected(const Token& t, std::string_view expected) const;
  static std::string Describe(const Token& t);
  static ExprPtr MakeExpr(Expr::Type type, int line);

  // Counts the nesting of expressions and blocks, so that no template can exhaust the stack.
  class DepthGuard {
   public:
    DepthGuard(Parser* p, int line);
    ~DepthGuard() { --p_->depth_; }

   private:
    Parser* p_;
  };

  std::vector<Token> tokens_;
  size_t pos_ = 0;
  std::vector<OpenBlock> open_blocks_;
  int depth_ = 0;
};

}  // namespace thermocline::server::jinja
