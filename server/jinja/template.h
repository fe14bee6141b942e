// A Jinja template as HF transformers renders chat templates: parsed once, rendered many times.
// The engine implements the jinja2 subset model templates use (see docs/api.md); its output
// for those templates equals jinja2's byte for byte (tests/chat_templates/).
#pragma once

#include <ctime>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "server/jinja/value.h"

namespace thermocline::server::jinja {

struct Stmt;

class Template {
 public:
  using Variables = std::vector<std::pair<std::string, Value>>;

  // A template that cannot be read is InvalidArgument "line N: <what is wrong>".
  static absl::StatusOr<Template> Parse(std::string_view source);

  // Renders with `variables` (messages, tools, add_generation_prompt, ...) on top of the
  // globals; strftime_now() formats `now`. A failure, including the template's own
  // raise_exception(), is InvalidArgument "line N: <message>". Thread-safe.
  absl::StatusOr<std::string> Render(const Variables& variables, std::time_t now) const;

 private:
  struct Tree;
  explicit Template(std::shared_ptr<const Tree> tree) : tree_(std::move(tree)) {}
  std::shared_ptr<const Tree> tree_;
};

}  // namespace thermocline::server::jinja
