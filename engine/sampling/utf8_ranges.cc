// Code point ranges to UTF-8 byte-range sequences: a range is split at the encoded-length
// boundaries and then until each piece is a product of byte ranges (every byte position
// ranges independently), the pieces are encoded, and pieces that share their continuation
// bytes are merged into one alternative with a set of first bytes.
#include "engine/sampling/utf8_ranges.h"

#include <algorithm>
#include <map>

namespace thermocline {
namespace {

constexpr char32_t kMaxCodePoint = 0x10FFFF;
constexpr char32_t kSurrogateLo = 0xD800;
constexpr char32_t kSurrogateHi = 0xDFFF;

int EncodedLength(char32_t cp) {
  if (cp < 0x80) return 1;
  if (cp < 0x800) return 2;
  if (cp < 0x10000) return 3;
  return 4;
}

void Encode(char32_t cp, uint8_t* out) {
  switch (EncodedLength(cp)) {
    case 1:
      out[0] = static_cast<uint8_t>(cp);
      break;
    case 2:
      out[0] = static_cast<uint8_t>(0xC0 | (cp >> 6));
      out[1] = static_cast<uint8_t>(0x80 | (cp & 0x3F));
      break;
    case 3:
      out[0] = static_cast<uint8_t>(0xE0 | (cp >> 12));
      out[1] = static_cast<uint8_t>(0x80 | ((cp >> 6) & 0x3F));
      out[2] = static_cast<uint8_t>(0x80 | (cp & 0x3F));
      break;
    default:
      out[0] = static_cast<uint8_t>(0xF0 | (cp >> 18));
      out[1] = static_cast<uint8_t>(0x80 | ((cp >> 12) & 0x3F));
      out[2] = static_cast<uint8_t>(0x80 | ((cp >> 6) & 0x3F));
      out[3] = static_cast<uint8_t>(0x80 | (cp & 0x3F));
  }
}

// Appends the byte-range sequences of lo..hi (no surrogates inside) to `out`.
void Split(char32_t lo, char32_t hi, std::vector<std::vector<ByteRange>>* out) {
  constexpr char32_t kLengthMax[] = {0x7F, 0x7FF, 0xFFFF};
  for (char32_t max : kLengthMax) {
    if (lo <= max && hi > max) {
      Split(lo, max, out);
      Split(max + 1, hi, out);
      return;
    }
  }
  const int n = EncodedLength(lo);
  // Until, for every count i of trailing continuation bytes, lo and hi either agree above the
  // low 6i bits or span all values of those bits.
  for (int i = 1; i < n; ++i) {
    const char32_t m = (char32_t{1} << (6 * i)) - 1;
    if ((lo & ~m) == (hi & ~m)) continue;
    if ((lo & m) != 0) {
      Split(lo, lo | m, out);
      Split((lo | m) + 1, hi, out);
      return;
    }
    if ((hi & m) != m) {
      Split(lo, (hi & ~m) - 1, out);
      Split(hi & ~m, hi, out);
      return;
    }
  }
  uint8_t a[4], b[4];
  Encode(lo, a);
  Encode(hi, b);
  std::vector<ByteRange> seq(n);
  for (int k = 0; k < n; ++k) seq[k] = {a[k], b[k]};
  out->push_back(std::move(seq));
}

}  // namespace

std::vector<std::pair<char32_t, char32_t>> NormalizeCodePointRanges(
    std::vector<std::pair<char32_t, char32_t>> ranges, bool negate) {
  std::sort(ranges.begin(), ranges.end());
  std::vector<std::pair<char32_t, char32_t>> merged;
  for (const auto& [lo, hi] : ranges) {
    if (!merged.empty() && lo <= merged.back().second + 1) {
      merged.back().second = std::max(merged.back().second, hi);
    } else {
      merged.emplace_back(lo, hi);
    }
  }
  if (negate) {
    std::vector<std::pair<char32_t, char32_t>> complement;
    char32_t next = 0;
    for (const auto& [lo, hi] : merged) {
      if (lo > next) complement.emplace_back(next, lo - 1);
      next = hi + 1;
    }
    if (next <= kMaxCodePoint) complement.emplace_back(next, kMaxCodePoint);
    merged.swap(complement);
  }
  std::vector<std::pair<char32_t, char32_t>> out;
  for (auto [lo, hi] : merged) {
    hi = std::min(hi, kMaxCodePoint);
    if (lo > hi) continue;
    if (lo < kSurrogateLo && hi > kSurrogateHi) {
      out.emplace_back(lo, kSurrogateLo - 1);
      out.emplace_back(kSurrogateHi + 1, hi);
    } else if (lo >= kSurrogateLo && hi <= kSurrogateHi) {
      continue;
    } else if (lo >= kSurrogateLo && lo <= kSurrogateHi) {
      out.emplace_back(kSurrogateHi + 1, hi);
    } else if (hi >= kSurrogateLo && hi <= kSurrogateHi) {
      out.emplace_back(lo, kSurrogateLo - 1);
    } else {
      out.emplace_back(lo, hi);
    }
  }
  return out;
}

std::vector<Utf8Alternative> Utf8Alternatives(
    const std::vector<std::pair<char32_t, char32_t>>& ranges) {
  std::vector<std::vector<ByteRange>> seqs;
  for (const auto& [lo, hi] : ranges) Split(lo, hi, &seqs);

  // Group by continuation bytes, in order of first appearance.
  std::vector<Utf8Alternative> alts;
  std::map<std::vector<std::pair<uint8_t, uint8_t>>, size_t> by_rest;
  for (const std::vector<ByteRange>& seq : seqs) {
    std::vector<std::pair<uint8_t, uint8_t>> key;
    for (size_t k = 1; k < seq.size(); ++k) key.emplace_back(seq[k].lo, seq[k].hi);
    auto [it, inserted] = by_rest.emplace(key, alts.size());
    if (inserted) {
      Utf8Alternative alt;
      alt.rest.assign(seq.begin() + 1, seq.end());
      alts.push_back(std::move(alt));
    }
    std::vector<ByteRange>& first = alts[it->second].first;
    if (!first.empty() && seq[0].lo <= first.back().hi + 1) {
      first.back().hi = std::max(first.back().hi, seq[0].hi);
    } else {
      first.push_back(seq[0]);
    }
  }
  return alts;
}

}  // namespace thermocline
