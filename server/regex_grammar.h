// JSON Schema's "pattern" (an ECMAScript regular expression) as GBNF for the inside of a JSON
// string: the characters as JSON writes them (", \ and control characters escaped), whose
// decoded value the pattern matches. Patterns are not anchored (the match may be anywhere in
// the value) unless an alternative starts with ^ or ends with $.
//
// Supported: literals and escapes (\n \t \r \f \v \0 \xHH \uHHHH, identity escapes), . (any
// character but line terminators), classes [...] and [^...] with ranges and \d \w \s \D \W
// \S, groups (...), (?:...), (?<name>...), alternation, quantifiers * + ? {n} {n,} {n,m}
// (lazy forms too: laziness does not change what matches). Unimplemented errors, naming the
// construct: backreferences, lookahead / lookbehind, \b \B, \p{...}, \c, anchors inside the
// pattern, and unbounded repetition of something that can match the empty string.
#pragma once

#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "server/gbnf_builder.h"

namespace thermocline::server {

// Rules it needs are added to `b`, named after `hint`.
absl::StatusOr<std::string> RegexToJsonStringGbnf(std::string_view pattern, GbnfBuilder& b,
                                                  const std::string& hint);

}  // namespace thermocline::server
