// The one exception type of the Jinja engine. It never leaves server/jinja: Template::Parse and
// Template::Render catch it and return an absl::Status carrying the message and line.
#pragma once

#include <stdexcept>
#include <string>

namespace thermocline::server::jinja {

class JinjaError : public std::runtime_error {
 public:
  enum class Kind { kSyntax, kRuntime, kRaised };
  // line 0: not known where it was thrown; the interpreter adds the line it was running.
  JinjaError(Kind kind, std::string message, int line = 0)
      : std::runtime_error(message), kind_(kind), line_(line) {}
  Kind kind() const { return kind_; }
  int line() const { return line_; }
  void set_line(int line) { line_ = line; }

 private:
  Kind kind_;
  int line_;
};

// A render-time failure (TypeError, UndefinedError, ... in jinja2 terms).
[[noreturn]] inline void Fail(std::string message) {
  throw JinjaError(JinjaError::Kind::kRuntime, std::move(message));
}

}  // namespace thermocline::server::jinja
