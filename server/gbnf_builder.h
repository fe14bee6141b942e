// Writing GBNF text for the grammar compilers of server/ (JSON schema, tool calls): literals
// and class characters escaped for GBNF, a rule table that names rules after where they come
// from and shares identical bodies, the JSON building blocks (value, string, number, ...), and
// integer ranges as digit patterns.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace thermocline::server {

// `text` (UTF-8) as a GBNF string literal: "..." with ", \ and control characters escaped.
std::string GbnfLiteral(std::string_view text);
// One code point as it may stand inside a GBNF character class.
std::string GbnfClassChar(char32_t cp);

class GbnfBuilder {
 public:
  // compact: JSON with no whitespace between tokens; else a bounded amount (a space, or a
  // newline and up to 20 spaces or tabs), so that a model cannot pad forever.
  explicit GbnfBuilder(bool compact) : compact_(compact) {}

  // Adds `body` as a rule named after `hint` (made unique) and returns the name; a body equal
  // to an earlier rule's returns that rule's name instead.
  std::string Add(std::string_view hint, const std::string& body);
  // A unique name now, its body later (for recursive references).
  std::string Reserve(std::string_view hint);
  void Define(const std::string& name, const std::string& body);
  // The JSON building blocks by name: "ws", "json-value", "json-object", "json-array",
  // "json-string", "json-char", "json-key-char", "json-number", "json-integer",
  // "json-boolean", "json-null"; each is added with what it uses on first use.
  std::string Primitive(std::string_view name);

  // The grammar: root ::= root_body, then the rules in the order they were made.
  std::string Text(const std::string& root_body) const;

 private:
  bool compact_;
  std::vector<std::pair<std::string, std::string>> rules_;  // name, body ("" while reserved)
  std::map<std::string, size_t> index_;                     // name -> rules_ index
  std::map<std::string, std::string> by_body_;
};

// `parts` joined by spaces, the empty ones left out.
std::string GbnfSeq(std::initializer_list<std::string> parts);
// `item` repeated lo..hi times (hi absent: no limit); "" for exactly zero times.
std::string GbnfRepeat(const std::string& item, int64_t lo, std::optional<int64_t> hi);

// A rule name made of [a-z0-9-] from arbitrary text (at most 48 characters).
std::string GbnfName(std::string_view text);

// A GBNF expression for the JSON integers in [lo, hi] (either bound may be absent), as plain
// digits without leading zeros or "-0". Unbounded magnitudes stop at 16 digits, as
// json-integer does. Requires lo <= hi.
std::string IntegerRangeGbnf(std::optional<int64_t> lo, std::optional<int64_t> hi);

}  // namespace thermocline::server
