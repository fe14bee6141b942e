// Unicode character classes the BPE pre-tokenizer regexes need: \p{L} (letters), \p{N} (numbers)
// and \s (White_Space), from a compact range table (Unicode 14; unassigned gaps inside a run of
// letters or numbers count as part of the run).
#pragma once

#include <cstdint>

namespace thermocline {

enum class CodepointClass : uint8_t {
  kOther = 0,       // punctuation, symbols, marks, controls, unassigned, invalid bytes
  kLetter = 1,      // \p{L}
  kNumber = 2,      // \p{N}
  kWhitespace = 3,  // \s
};

// Thread-safe; O(1) below U+0100, a binary search above.
CodepointClass ClassifyCodepoint(uint32_t cp);

}  // namespace thermocline
