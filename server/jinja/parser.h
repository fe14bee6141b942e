// Tokens to the statement tree: jinja2's grammar for the tags chat templates use (if, for with
// else / loop filters / recursive, set incl. block set and namespace attributes, macro, call,
// filter, with, break, continue, raw, generation) and its expression grammar and precedence.
// Tags that need a template loader (extends, include, import, block) are refused.
#pragma once

#include <string_view>

#include "server/jinja/ast.h"

namespace thermocline::server::jinja {

// Throws JinjaError (kSyntax) with the line of the first problem.
Body ParseTemplate(std::string_view source);

}  // namespace thermocline::server::jinja
