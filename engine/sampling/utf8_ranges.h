// Code point ranges as UTF-8 byte sequences: a character class becomes a few alternatives of
// byte ranges, e.g. U+0080..U+07FF -> [C2-DF][80-BF]. Surrogates (U+D800..U+DFFF) have no
// UTF-8 form and are left out.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

namespace thermocline {

struct ByteRange {
  uint8_t lo, hi;
  bool operator==(const ByteRange& o) const { return lo == o.lo && hi == o.hi; }
};

// One alternative: byte i of the character is in ranges[i]. The first byte is a set, so that
// alternatives that differ only in their first byte are one alternative.
struct Utf8Alternative {
  std::vector<ByteRange> first;  // the first byte: a union of ranges
  std::vector<ByteRange> rest;   // the continuation bytes, one range each
};

// Sorts and merges `ranges` (inclusive, code points <= U+10FFFF) and, when `negate`, takes the
// complement within U+0000..U+10FFFF. Returns disjoint sorted ranges without surrogates.
std::vector<std::pair<char32_t, char32_t>> NormalizeCodePointRanges(
    std::vector<std::pair<char32_t, char32_t>> ranges, bool negate);

// The byte sequences of exactly the code points in `ranges` (disjoint, sorted, no
// surrogates), with the alternatives that share their continuation bytes merged.
std::vector<Utf8Alternative> Utf8Alternatives(
    const std::vector<std::pair<char32_t, char32_t>>& ranges);

}  // namespace thermocline
