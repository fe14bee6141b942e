#include "server/jinja/template.h"

#include "server/jinja/ast.h"
#include "server/jinja/cat.h"
#include "server/jinja/error.h"
#include "server/jinja/interpreter.h"
#include "server/jinja/parser.h"

namespace thermocline::server::jinja {

struct Template::Tree {
  Body body;
};

absl::StatusOr<Template> Template::Parse(std::string_view source) {
  try {
    auto tree = std::make_shared<Tree>();
    tree->body = ParseTemplate(source);
    return Template(std::move(tree));
  } catch (const JinjaError& e) {
    return absl::InvalidArgumentError(Cat("line ", e.line(), ": ", e.what()));
  }
}

absl::StatusOr<std::string> Template::Render(const Variables& variables, std::time_t now) const {
  Interpreter in(now);
  try {
    return in.Render(tree_->body, variables);
  } catch (const JinjaError& e) {
    const int line = e.line() > 0 ? e.line() : in.line();
    return absl::InvalidArgumentError(Cat("line ", line, ": ", e.what()));
  }
}

}  // namespace thermocline::server::jinja
