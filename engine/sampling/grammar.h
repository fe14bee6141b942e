// A compiled context-free grammar over bytes, from llama.cpp-style GBNF text. Terminals are
// sets of bytes (character classes are compiled to their UTF-8 byte sequences), repetitions
// are expanded into helper rules, and bytes that no terminal tells apart share a byte class.
// GrammarMatcher runs it as a pushdown automaton. Immutable after FromGbnf: one grammar may
// serve any number of matchers on any threads.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace thermocline {

class Grammar {
 public:
  // One position in a rule's alternative: match a byte of a set, expand a rule, or the end of
  // the alternative.
  struct Element {
    enum Kind : uint8_t { kEnd, kBytes, kRule };
    Kind kind;
    int32_t value;  // kBytes: byte set id; kRule: rule id
  };

  // Parses and compiles GBNF with `root` as the start rule. Errors name the line and column:
  // syntax errors, a rule defined twice, an undefined rule, a missing start rule, and left
  // recursion (a rule that can reach itself before matching any character, including a
  // repetition of something that can match the empty string), which this engine cannot run.
  static absl::StatusOr<std::shared_ptr<const Grammar>> FromGbnf(std::string_view text,
                                                                 std::string_view root = "root");

  int32_t root_rule() const { return root_; }
  int32_t num_rules() const { return static_cast<int32_t>(rule_alts_.size()); }
  // Start positions (into elements()) of the rule's alternatives.
  absl::Span<const int32_t> alternatives(int32_t rule) const { return rule_alts_[rule]; }
  const Element& element(int32_t pos) const { return elements_[pos]; }
  int32_t num_elements() const { return static_cast<int32_t>(elements_.size()); }
  bool ByteInSet(int32_t set, uint8_t byte) const {
    return (byte_sets_[set][byte >> 6] >> (byte & 63)) & 1;
  }
  int32_t num_byte_sets() const { return static_cast<int32_t>(byte_sets_.size()); }
  // Bytes in one class match exactly the same byte sets.
  int32_t num_byte_classes() const { return num_classes_; }
  const std::array<uint8_t, 256>& byte_classes() const { return byte_class_; }
  uint8_t class_representative(int32_t byte_class) const { return class_rep_[byte_class]; }
  // A user rule's name, or "<user rule>~N" for a helper rule made while compiling it.
  const std::string& rule_name(int32_t rule) const { return rule_names_[rule]; }

  using ByteSet = std::array<uint64_t, 4>;

 private:
  friend class GrammarCompiler;
  Grammar() = default;

  std::vector<Element> elements_;
  std::vector<std::vector<int32_t>> rule_alts_;
  std::vector<std::string> rule_names_;
  std::vector<ByteSet> byte_sets_;
  std::array<uint8_t, 256> byte_class_{};
  std::vector<uint8_t> class_rep_;
  int32_t num_classes_ = 0;
  int32_t root_ = 0;
};

}  // namespace thermocline
