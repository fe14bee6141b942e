// Template text to tokens, with the whitespace rules HF transformers renders under: jinja2 with
// trim_blocks (the first newline after a block or comment tag is dropped) and lstrip_blocks
// (spaces before a block or comment tag at the start of a line are dropped), `-` and `+`
// whitespace control on tags, one trailing newline of the template removed, and \r\n / \r read
// as \n. Comments and {% raw %} are resolved here.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace thermocline::server::jinja {

struct Token {
  enum class Type {
    kData,        // literal text
    kVarBegin,    // {{
    kVarEnd,      // }}
    kBlockBegin,  // {%
    kBlockEnd,    // %}
    kName,
    kString,  // text: the unescaped value
    kInt,
    kFloat,
    kOperator,  // text: the operator ("+", "//", "(", "|", ...)
    kEof,
  };
  Type type;
  std::string text;
  int64_t int_value = 0;
  double float_value = 0;
  int line = 1;
};

// Throws JinjaError (kSyntax) with the line for text it cannot read (an unclosed tag, comment
// or string, an unknown character).
std::vector<Token> Lex(std::string_view source);

}  // namespace thermocline::server::jinja
