// The GBNF parser: llama.cpp's grammar text (rules `name ::= ...`, alternatives, groups,
// repetitions, literals, character classes, comments) into a syntax tree of code points, with
// the source offset of every node for error messages. Grammar::FromGbnf compiles the tree.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace thermocline {

struct GbnfExpr {
  enum class Kind {
    kAlternatives,  // children: one sequence each (at least two)
    kSequence,      // children in order; empty: the empty string
    kLiteral,       // text (code points); empty: the empty string
    kCharClass,     // ranges (inclusive), negated for [^...]; `.` is a negated empty class
    kRuleRef,       // name
    kRepeat,        // children[0] repeated min..max times (max -1: no limit)
  };
  Kind kind = Kind::kSequence;
  std::vector<GbnfExpr> children;
  std::u32string text;
  std::vector<std::pair<char32_t, char32_t>> ranges;
  bool negated = false;
  std::string name;
  int32_t min = 0;
  int32_t max = -1;
  size_t offset = 0;  // where the node starts in the source text
};

struct GbnfRule {
  std::string name;
  GbnfExpr body;
  size_t offset = 0;  // of the rule's name
};

// The most a {m,n} bound may be: a repetition is expanded into that many copies of its item.
inline constexpr int32_t kGbnfMaxRepeat = 10000;

// Parses `text`; errors read "grammar: LINE:COLUMN: what was wrong". Only syntax is checked
// here: undefined rules, a missing root and left recursion are the compiler's errors.
absl::StatusOr<std::vector<GbnfRule>> ParseGbnf(std::string_view text);

// "LINE:COLUMN" (both 1-based, columns in bytes) of `offset` in `text`.
std::string GbnfLocation(std::string_view text, size_t offset);

}  // namespace thermocline
