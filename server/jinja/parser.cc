// The statement half of the parser: template structure and the tags.
#include "server/jinja/parser.h"

#include "absl/strings/str_join.h"
#include "server/jinja/cat.h"
#include "server/jinja/error.h"
#include "server/jinja/parser_internal.h"

namespace thermocline::server::jinja {

Body ParseTemplate(std::string_view source) { return Parser(Lex(source)).ParseAll(); }

Body Parser::ParseAll() {
  std::string found;
  return ParseBody({}, OpenBlock{"", 0}, &found);
}

void Parser::Error(const std::string& message, int line) const {
  throw JinjaError(JinjaError::Kind::kSyntax, message, line);
}

std::string Parser::Describe(const Token& t) {
  switch (t.type) {
    case Token::Type::kData:
      return "template text";
    case Token::Type::kVarBegin:
      return "'{{'";
    case Token::Type::kVarEnd:
      return "'}}'";
    case Token::Type::kBlockBegin:
      return "'{%'";
    case Token::Type::kBlockEnd:
      return "'%}'";
    case Token::Type::kEof:
      return "end of template";
    case Token::Type::kString:
      return "a string";
    default:
      return Cat("'", t.text, "'");
  }
}

void Parser::Unexpected(const Token& t, std::string_view expected) const {
  Error(Cat("unexpected ", Describe(t), ", expected ", expected), t.line);
}

bool Parser::SkipName(std::string_view name) {
  if (!IsName(Peek(), name)) return false;
  Next();
  return true;
}

bool Parser::SkipOp(std::string_view op) {
  if (!IsOp(Peek(), op)) return false;
  Next();
  return true;
}

void Parser::ExpectOp(std::string_view op) {
  if (!SkipOp(op)) Unexpected(Peek(), Cat("'", op, "'"));
}

void Parser::ExpectName(std::string_view name) {
  if (!SkipName(name)) Unexpected(Peek(), Cat("'", name, "'"));
}

std::string Parser::ExpectIdentifier(std::string_view what) {
  if (Peek().type != Token::Type::kName) Unexpected(Peek(), what);
  return Next().text;
}

void Parser::ExpectBlockEnd(std::string_view tag) {
  if (Peek().type != Token::Type::kBlockEnd) {
    Unexpected(Peek(), Cat("the end of the '", tag, "' tag ('%}')"));
  }
  Next();
}

ExprPtr Parser::MakeExpr(Expr::Type type, int line) {
  auto e = std::make_unique<Expr>();
  e->type = type;
  e->line = line;
  return e;
}

Body Parser::ParseBody(std::initializer_list<std::string_view> end_tags, const OpenBlock& open,
                       std::string* found) {
  Body body;
  while (true) {
    const Token& t = Peek();
    switch (t.type) {
      case Token::Type::kData: {
        auto s = std::make_unique<Stmt>();
        s->type = Stmt::Type::kText;
        s->line = t.line;
        s->text = t.text;
        body.push_back(std::move(s));
        Next();
        break;
      }
      case Token::Type::kVarBegin: {
        const int line = Next().line;
        auto s = std::make_unique<Stmt>();
        s->type = Stmt::Type::kOutput;
        s->line = line;
        s->expr = ParseTuple(true, false);
        if (Peek().type != Token::Type::kVarEnd) Unexpected(Peek(), "'}}'");
        Next();
        body.push_back(std::move(s));
        break;
      }
      case Token::Type::kBlockBegin: {
        const Token& name = Peek(1);
        if (name.type == Token::Type::kName) {
          for (std::string_view end : end_tags) {
            if (name.text == end) {
              Next();
              Next();
              *found = name.text;
              return body;
            }
          }
        }
        body.push_back(ParseTag());
        break;
      }
      case Token::Type::kEof:
        if (end_tags.size() != 0) {
          std::vector<std::string> names;
          for (std::string_view e : end_tags) names.push_back(Cat("'", e, "'"));
          Error(Cat("unexpected end of template: the '", open.tag, "' opened on line ", open.line,
                    " is not closed (expected ", absl::StrJoin(names, " or "), ")"),
                t.line);
        }
        return body;
      default:
        Unexpected(t, "template text or a tag");
    }
  }
}

StmtPtr Parser::ParseTag() {
  const int line = Next().line;  // {%
  DepthGuard guard(this, line);
  const Token& t = Peek();
  if (t.type != Token::Type::kName) Unexpected(t, "a tag name");
  const std::string tag = Next().text;
  if (tag == "for") return ParseFor(line);
  if (tag == "if") return ParseIf(line);
  if (tag == "set") return ParseSet(line);
  if (tag == "macro") return ParseMacro(line);
  if (tag == "call") return ParseCallBlock(line);
  if (tag == "filter") return ParseFilterBlock(line);
  if (tag == "with") return ParseWith(line);
  if (tag == "break" || tag == "continue") {
    bool in_loop = false;
    for (auto it = open_blocks_.rbegin(); it != open_blocks_.rend(); ++it) {
      if (it->tag == "for") in_loop = true;
      if (it->tag == "for" || it->tag == "macro" || it->tag == "call") break;
    }
    if (!in_loop) Error(Cat("'", tag, "' outside of a loop"), line);
    ExpectBlockEnd(tag);
    auto s = std::make_unique<Stmt>();
    s->type = tag == "break" ? Stmt::Type::kBreak : Stmt::Type::kContinue;
    s->line = line;
    return s;
  }
  if (tag == "generation") {
    ExpectBlockEnd(tag);
    auto s = std::make_unique<Stmt>();
    s->type = Stmt::Type::kScope;
    s->line = line;
    std::string found;
    open_blocks_.push_back({"generation", line});
    s->body = ParseBody({"endgeneration"}, open_blocks_.back(), &found);
    open_blocks_.pop_back();
    ExpectBlockEnd("endgeneration");
    return s;
  }
  if (tag == "extends" || tag == "include" || tag == "import" || tag == "from" || tag == "block") {
    Error(Cat("the '", tag,
              "' tag is not supported: chat templates are rendered without a "
              "template loader"),
          line);
  }
  std::string message = Cat("unknown tag '", tag, "'");
  if (!open_blocks_.empty()) {
    CatTo(&message, " inside the '", open_blocks_.back().tag, "' opened on line ",
          open_blocks_.back().line);
  }
  Error(message, line);
}

Target Parser::ParseTarget(bool allow_namespace, bool for_loop) {
  Target target;
  if (allow_namespace && Peek().type == Token::Type::kName && IsOp(Peek(1), ".")) {
    target.names.push_back(Next().text);
    Next();
    target.attr = ExpectIdentifier("an attribute name");
    return target;
  }
  while (true) {
    if (IsOp(Peek(), "(")) Error("nested tuples are not supported as targets", Peek().line);
    target.names.push_back(ExpectIdentifier("a variable name"));
    if (!SkipOp(",")) break;
    target.tuple = true;
    if ((for_loop && IsName(Peek(), "in")) || IsOp(Peek(), "=") ||
        Peek().type == Token::Type::kBlockEnd)
      break;
  }
  return target;
}

StmtPtr Parser::ParseFor(int line) {
  auto s = std::make_unique<Stmt>();
  s->type = Stmt::Type::kFor;
  s->line = line;
  s->target = ParseTarget(false, true);
  ExpectName("in");
  s->expr = ParseTuple(false, false, {"recursive"});
  if (SkipName("if")) s->loop_filter = ParseExpression();
  s->recursive = SkipName("recursive");
  ExpectBlockEnd("for");
  open_blocks_.push_back({"for", line});
  std::string found;
  s->body = ParseBody({"endfor", "else"}, open_blocks_.back(), &found);
  if (found == "else") {
    ExpectBlockEnd("else");
    s->else_body = ParseBody({"endfor"}, open_blocks_.back(), &found);
  }
  open_blocks_.pop_back();
  ExpectBlockEnd("endfor");
  return s;
}

StmtPtr Parser::ParseIf(int line) {
  auto s = std::make_unique<Stmt>();
  s->type = Stmt::Type::kIf;
  s->line = line;
  open_blocks_.push_back({"if", line});
  ExprPtr cond = ParseTuple(false, false);
  while (true) {
    ExpectBlockEnd("if");
    std::string found;
    Body body = ParseBody({"elif", "else", "endif"}, open_blocks_.back(), &found);
    s->branches.emplace_back(std::move(cond), std::move(body));
    if (found == "elif") {
      cond = ParseTuple(false, false);
      continue;
    }
    if (found == "else") {
      ExpectBlockEnd("else");
      s->else_body = ParseBody({"endif"}, open_blocks_.back(), &found);
    }
    break;
  }
  open_blocks_.pop_back();
  ExpectBlockEnd("endif");
  return s;
}

StmtPtr Parser::ParseSet(int line) {
  auto s = std::make_unique<Stmt>();
  s->line = line;
  s->target = ParseTarget(true, false);
  if (SkipOp("=")) {
    s->type = Stmt::Type::kSet;
    s->expr = ParseTuple(true, false);
    ExpectBlockEnd("set");
    return s;
  }
  s->type = Stmt::Type::kSetBlock;
  if (!s->target.attr.empty() || s->target.tuple) {
    Error("a block set assigns one variable name", line);
  }
  if (SkipOp("|")) s->expr = ParseFilter(nullptr, true);
  ExpectBlockEnd("set");
  open_blocks_.push_back({"set", line});
  std::string found;
  s->body = ParseBody({"endset"}, open_blocks_.back(), &found);
  open_blocks_.pop_back();
  ExpectBlockEnd("endset");
  return s;
}

std::vector<MacroParam> Parser::ParseParams() {
  std::vector<MacroParam> params;
  ExpectOp("(");
  while (!IsOp(Peek(), ")")) {
    if (!params.empty()) ExpectOp(",");
    if (IsOp(Peek(), ")")) break;
    MacroParam p;
    p.name = ExpectIdentifier("a parameter name");
    if (SkipOp("=")) p.default_value = ParseExpression();
    params.push_back(std::move(p));
  }
  Next();
  return params;
}

StmtPtr Parser::ParseMacro(int line) {
  auto s = std::make_unique<Stmt>();
  s->type = Stmt::Type::kMacro;
  s->line = line;
  s->name = ExpectIdentifier("a macro name");
  s->params = ParseParams();
  ExpectBlockEnd("macro");
  open_blocks_.push_back({"macro", line});
  std::string found;
  s->body = ParseBody({"endmacro"}, open_blocks_.back(), &found);
  open_blocks_.pop_back();
  ExpectBlockEnd("endmacro");
  return s;
}

StmtPtr Parser::ParseCallBlock(int line) {
  auto s = std::make_unique<Stmt>();
  s->type = Stmt::Type::kCallBlock;
  s->line = line;
  if (IsOp(Peek(), "(")) s->params = ParseParams();
  s->expr = ParseExpression();
  if (s->expr->type != Expr::Type::kCall) Error("the 'call' tag needs a macro call", line);
  ExpectBlockEnd("call");
  open_blocks_.push_back({"call", line});
  std::string found;
  s->body = ParseBody({"endcall"}, open_blocks_.back(), &found);
  open_blocks_.pop_back();
  ExpectBlockEnd("endcall");
  return s;
}

StmtPtr Parser::ParseFilterBlock(int line) {
  auto s = std::make_unique<Stmt>();
  s->type = Stmt::Type::kFilterBlock;
  s->line = line;
  s->expr = ParseFilter(nullptr, false);
  ExpectBlockEnd("filter");
  open_blocks_.push_back({"filter", line});
  std::string found;
  s->body = ParseBody({"endfilter"}, open_blocks_.back(), &found);
  open_blocks_.pop_back();
  ExpectBlockEnd("endfilter");
  return s;
}

StmtPtr Parser::ParseWith(int line) {
  auto s = std::make_unique<Stmt>();
  s->type = Stmt::Type::kWith;
  s->line = line;
  while (Peek().type != Token::Type::kBlockEnd) {
    if (!s->assigns.empty()) ExpectOp(",");
    std::string name = ExpectIdentifier("a variable name");
    ExpectOp("=");
    s->assigns.emplace_back(std::move(name), ParseExpression());
  }
  ExpectBlockEnd("with");
  open_blocks_.push_back({"with", line});
  std::string found;
  s->body = ParseBody({"endwith"}, open_blocks_.back(), &found);
  open_blocks_.pop_back();
  ExpectBlockEnd("endwith");
  return s;
}

}  // namespace thermocline::server::jinja
