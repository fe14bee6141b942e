#include "server/jinja/strings.h"

#include <algorithm>

#include "server/jinja/error.h"

namespace thermocline::server::jinja {
namespace {

// Case pairs in Latin Extended-A, where upper and lower case alternate.
bool EvenIsUpper(char32_t c) {
  return (c >= 0x100 && c <= 0x12F) || (c >= 0x132 && c <= 0x137) || (c >= 0x14A && c <= 0x177);
}
bool OddIsUpper(char32_t c) { return (c >= 0x139 && c <= 0x148) || (c >= 0x179 && c <= 0x17E); }

std::string MapCase(std::string_view s, char32_t (*f)(char32_t)) {
  std::string out;
  out.reserve(s.size());
  if (IsAscii(s)) {
    for (char c : s) out.push_back(static_cast<char>(f(static_cast<unsigned char>(c))));
    return out;
  }
  for (char32_t c : DecodeUtf8(s)) AppendUtf8(f(c), &out);
  return out;
}

bool InSet(char32_t c, const std::u32string& set) { return set.find(c) != set.npos; }

}  // namespace

std::u32string DecodeUtf8(std::string_view s) {
  std::u32string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const unsigned char b = static_cast<unsigned char>(s[i]);
    const int n = b < 0x80             ? 0
                  : (b & 0xE0) == 0xC0 ? 1
                  : (b & 0xF0) == 0xE0 ? 2
                  : (b & 0xF8) == 0xF0 ? 3
                                       : -1;
    bool ok = n > 0 && i + n < s.size();
    char32_t c = n > 0 ? (b & (0x3F >> n)) : b;
    for (int k = 1; ok && k <= n; ++k) {
      const unsigned char cb = static_cast<unsigned char>(s[i + k]);
      ok = (cb & 0xC0) == 0x80;
      c = (c << 6) | (cb & 0x3F);
    }
    if (ok) {
      out.push_back(c);
      i += n + 1;
    } else {
      out.push_back(b);  // ASCII, or a stray byte standing for itself
      ++i;
    }
  }
  return out;
}

void AppendUtf8(char32_t c, std::string* out) {
  if (c < 0x80) {
    out->push_back(static_cast<char>(c));
  } else if (c < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (c >> 6)));
    out->push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else if (c < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (c >> 12)));
    out->push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (c >> 18)));
    out->push_back(static_cast<char>(0x80 | ((c >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (c & 0x3F)));
  }
}

std::string EncodeUtf8(std::u32string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char32_t c : s) AppendUtf8(c, &out);
  return out;
}

size_t CodePointCount(std::string_view s) { return IsAscii(s) ? s.size() : DecodeUtf8(s).size(); }

bool IsAscii(std::string_view s) {
  for (char c : s) {
    if (static_cast<unsigned char>(c) >= 0x80) return false;
  }
  return true;
}

bool IsSpace(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 ||
         c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
         c == 0x205F || c == 0x3000;
}

bool IsLineBreak(char32_t c) {
  return c == '\n' || c == '\r' || c == 0x0B || c == 0x0C || (c >= 0x1C && c <= 0x1E) ||
         c == 0x85 || c == 0x2028 || c == 0x2029;
}

bool IsWordChar(char32_t c) {
  if (c < 0x80)
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
  // Not exact for every script: punctuation blocks and spaces are not word characters.
  if (IsSpace(c)) return false;
  if ((c >= 0x2000 && c <= 0x206F) || (c >= 0x3000 && c <= 0x303F) || (c >= 0xFF00 && c <= 0xFF0F))
    return false;
  return !(c >= 0xA1 && c <= 0xBF) && c != 0xD7 && c != 0xF7;
}

namespace {

// The Latin digraphs with an upper, a title and a lower form (DŽ Dž dž, LJ Lj lj, NJ Nj nj,
// DZ Dz dz): the first of each triple.
char32_t DigraphBase(char32_t c) {
  if (c >= 0x1C4 && c <= 0x1CC) return 0x1C4 + (c - 0x1C4) / 3 * 3;
  if (c >= 0x1F1 && c <= 0x1F3) return 0x1F1;
  return 0;
}

}  // namespace

char32_t ToUpper(char32_t c) {
  if (c < 0x80) return (c >= 'a' && c <= 'z') ? c - 32 : c;
  if (char32_t base = DigraphBase(c)) return base;
  if ((c >= 0xE0 && c <= 0xFE && c != 0xF7)) return c - 32;
  if (c == 0xFF) return 0x178;
  if (c == 0xB5) return 0x39C;
  if (EvenIsUpper(c)) return c & ~char32_t{1};
  if (OddIsUpper(c)) return (c & 1) ? c : c - 1;
  if (c == 0x17F) return 'S';
  if (c >= 0x3B1 && c <= 0x3C9 && c != 0x3C2) return c - 32;
  if (c == 0x3C2) return 0x3A3;
  if (c == 0x3AC) return 0x386;
  if (c >= 0x3AD && c <= 0x3AF) return c - 37;
  if (c == 0x3CC) return 0x38C;
  if (c == 0x3CD || c == 0x3CE) return c - 63;
  if (c >= 0x430 && c <= 0x44F) return c - 32;
  if (c >= 0x450 && c <= 0x45F) return c - 80;
  if (c >= 0x460 && c <= 0x481) return c & ~char32_t{1};
  return c;
}

char32_t ToLower(char32_t c) {
  if (c < 0x80) return (c >= 'A' && c <= 'Z') ? c + 32 : c;
  if (char32_t base = DigraphBase(c)) return base + 2;
  if ((c >= 0xC0 && c <= 0xDE && c != 0xD7)) return c + 32;
  if (c == 0x178) return 0xFF;
  if (EvenIsUpper(c)) return c | 1;
  if (OddIsUpper(c)) return (c & 1) ? c + 1 : c;
  if (c == 0x130) return 'i';
  if (c >= 0x391 && c <= 0x3A9 && c != 0x3A2) return c + 32;
  if (c == 0x386) return 0x3AC;
  if (c >= 0x388 && c <= 0x38A) return c + 37;
  if (c == 0x38C) return 0x3CC;
  if (c == 0x38E || c == 0x38F) return c + 63;
  if (c >= 0x410 && c <= 0x42F) return c + 32;
  if (c >= 0x400 && c <= 0x40F) return c + 80;
  if (c >= 0x460 && c <= 0x481) return c | 1;
  return c;
}

bool IsCased(char32_t c) { return ToUpper(c) != c || ToLower(c) != c || c == 0xDF; }

std::string Strip(std::string_view s, const std::optional<std::string>& chars, bool left,
                  bool right) {
  if (!chars && IsAscii(s)) {
    size_t b = 0, e = s.size();
    auto ws = [](char c) { return IsSpace(static_cast<unsigned char>(c)); };
    if (left)
      while (b < e && ws(s[b])) ++b;
    if (right)
      while (e > b && ws(s[e - 1])) --e;
    return std::string(s.substr(b, e - b));
  }
  const std::u32string cps = DecodeUtf8(s);
  const std::u32string set = chars ? DecodeUtf8(*chars) : std::u32string();
  auto strip_it = [&](char32_t c) { return chars ? InSet(c, set) : IsSpace(c); };
  size_t b = 0, e = cps.size();
  if (left)
    while (b < e && strip_it(cps[b])) ++b;
  if (right)
    while (e > b && strip_it(cps[e - 1])) --e;
  return EncodeUtf8(std::u32string_view(cps).substr(b, e - b));
}

std::string Upper(std::string_view s) {
  if (IsAscii(s)) return MapCase(s, ToUpper);
  std::string out;
  for (char32_t c : DecodeUtf8(s)) {
    if (c == 0xDF) {
      out += "SS";  // Python: "ß".upper() == "SS"
    } else {
      AppendUtf8(ToUpper(c), &out);
    }
  }
  return out;
}
std::string Lower(std::string_view s) { return MapCase(s, ToLower); }
std::string SwapCase(std::string_view s) {
  return MapCase(s, [](char32_t c) { return ToUpper(c) != c ? ToUpper(c) : ToLower(c); });
}

std::string PyTitle(std::string_view s) {
  std::string out;
  bool prev_cased = false;
  for (char32_t c : DecodeUtf8(s)) {
    AppendUtf8(prev_cased ? ToLower(c) : ToUpper(c), &out);
    prev_cased = IsCased(c);
  }
  return out;
}

std::string Capitalize(std::string_view s) {
  std::string out;
  bool first = true;
  for (char32_t c : DecodeUtf8(s)) {
    AppendUtf8(first ? ToUpper(c) : ToLower(c), &out);
    first = false;
  }
  return out;
}

std::vector<std::string> Split(std::string_view s, const std::optional<std::string>& sep,
                               int64_t maxsplit, bool from_right) {
  std::vector<std::string> parts;
  if (sep) {
    if (sep->empty()) Fail("empty separator");
    if (!from_right) {
      size_t pos = 0;
      while (maxsplit < 0 || static_cast<int64_t>(parts.size()) < maxsplit) {
        const size_t hit = s.find(*sep, pos);
        if (hit == s.npos) break;
        parts.emplace_back(s.substr(pos, hit - pos));
        pos = hit + sep->size();
      }
      parts.emplace_back(s.substr(pos));
      return parts;
    }
    size_t end = s.size();
    while (maxsplit < 0 || static_cast<int64_t>(parts.size()) < maxsplit) {
      if (end < sep->size()) break;
      const size_t hit = s.rfind(*sep, end - sep->size());
      if (hit == s.npos) break;
      parts.emplace_back(s.substr(hit + sep->size(), end - hit - sep->size()));
      end = hit;
    }
    parts.emplace_back(s.substr(0, end));
    std::reverse(parts.begin(), parts.end());
    return parts;
  }
  std::u32string cps = DecodeUtf8(s);
  if (from_right) std::reverse(cps.begin(), cps.end());
  size_t i = 0;
  const size_t n = cps.size();
  while (true) {
    while (i < n && IsSpace(cps[i])) ++i;
    if (i == n) break;
    if (maxsplit >= 0 && static_cast<int64_t>(parts.size()) == maxsplit) {
      size_t e = n;
      while (e > i && IsSpace(cps[e - 1])) --e;
      std::u32string rest = cps.substr(i, n - i);
      // Python keeps the remainder's trailing whitespace (its leading one, for rsplit).
      if (from_right) std::reverse(rest.begin(), rest.end());
      parts.push_back(EncodeUtf8(rest));
      break;
    }
    size_t j = i;
    while (j < n && !IsSpace(cps[j])) ++j;
    std::u32string word = cps.substr(i, j - i);
    if (from_right) std::reverse(word.begin(), word.end());
    parts.push_back(EncodeUtf8(word));
    i = j;
  }
  if (from_right) std::reverse(parts.begin(), parts.end());
  return parts;
}

std::vector<std::string> SplitLines(std::string_view s, bool keepends) {
  std::vector<std::string> lines;
  const std::u32string cps = DecodeUtf8(s);
  size_t start = 0;
  for (size_t i = 0; i < cps.size(); ++i) {
    if (!IsLineBreak(cps[i])) continue;
    size_t end = i + 1;
    if (cps[i] == '\r' && i + 1 < cps.size() && cps[i + 1] == '\n') end = i + 2;
    lines.push_back(
        EncodeUtf8(std::u32string_view(cps).substr(start, (keepends ? end : i) - start)));
    start = end;
    i = end - 1;
  }
  if (start < cps.size()) lines.push_back(EncodeUtf8(std::u32string_view(cps).substr(start)));
  return lines;
}

std::string Replace(std::string_view s, std::string_view old_text, std::string_view new_text,
                    int64_t count) {
  std::string out;
  if (old_text.empty()) {
    // Python inserts `new` before every code point and at the end.
    const std::u32string cps = DecodeUtf8(s);
    int64_t done = 0;
    for (char32_t c : cps) {
      if (count < 0 || done < count) {
        out += new_text;
        ++done;
      }
      AppendUtf8(c, &out);
    }
    if (count < 0 || done < count) out += new_text;
    return out;
  }
  size_t pos = 0;
  int64_t done = 0;
  while (count < 0 || done < count) {
    const size_t hit = s.find(old_text, pos);
    if (hit == s.npos) break;
    out.append(s.substr(pos, hit - pos));
    out.append(new_text);
    pos = hit + old_text.size();
    ++done;
  }
  out.append(s.substr(pos));
  return out;
}

int64_t Find(std::string_view s, std::string_view sub, bool from_right) {
  const size_t hit = from_right ? s.rfind(sub) : s.find(sub);
  if (hit == s.npos) return -1;
  return static_cast<int64_t>(CodePointCount(s.substr(0, hit)));
}

int64_t Count(std::string_view s, std::string_view sub) {
  if (sub.empty()) return static_cast<int64_t>(CodePointCount(s)) + 1;
  int64_t n = 0;
  for (size_t pos = s.find(sub); pos != s.npos; pos = s.find(sub, pos + sub.size())) ++n;
  return n;
}

std::vector<int64_t> SliceIndices(int64_t length, std::optional<int64_t> start,
                                  std::optional<int64_t> stop, std::optional<int64_t> step) {
  const int64_t st = step.value_or(1);
  if (st == 0) Fail("slice step cannot be zero");
  auto clamp = [&](std::optional<int64_t> v, int64_t def) -> int64_t {
    if (!v) return def;
    int64_t x = *v;
    if (x < 0) x += length;
    if (st > 0) return std::clamp<int64_t>(x, 0, length);
    return std::clamp<int64_t>(x, -1, length - 1);
  };
  const int64_t b = clamp(start, st > 0 ? 0 : length - 1);
  const int64_t e = clamp(stop, st > 0 ? length : -1);
  std::vector<int64_t> idx;
  if (st > 0) {
    for (int64_t i = b; i < e; i += st) idx.push_back(i);
  } else {
    for (int64_t i = b; i > e; i += st) idx.push_back(i);
  }
  return idx;
}

std::string SliceString(std::string_view s, std::optional<int64_t> start,
                        std::optional<int64_t> stop, std::optional<int64_t> step) {
  std::string out;
  if (IsAscii(s)) {
    for (int64_t i : SliceIndices(static_cast<int64_t>(s.size()), start, stop, step))
      out.push_back(s[i]);
    return out;
  }
  const std::u32string cps = DecodeUtf8(s);
  for (int64_t i : SliceIndices(static_cast<int64_t>(cps.size()), start, stop, step))
    AppendUtf8(cps[i], &out);
  return out;
}

std::optional<std::string> CharAt(std::string_view s, int64_t i) {
  if (IsAscii(s)) {
    const int64_t n = static_cast<int64_t>(s.size());
    if (i < 0) i += n;
    if (i < 0 || i >= n) return std::nullopt;
    return std::string(1, s[i]);
  }
  const std::u32string cps = DecodeUtf8(s);
  const int64_t n = static_cast<int64_t>(cps.size());
  if (i < 0) i += n;
  if (i < 0 || i >= n) return std::nullopt;
  std::string out;
  AppendUtf8(cps[i], &out);
  return out;
}

std::string Center(std::string_view s, int64_t width, std::string_view fill) {
  const int64_t n = static_cast<int64_t>(CodePointCount(s));
  if (width <= n) return std::string(s);
  const int64_t pad = width - n;
  // Python puts the odd extra character on the left when the width is odd.
  const int64_t left = pad / 2 + (pad & width & 1);
  std::string out;
  for (int64_t i = 0; i < left; ++i) out += fill;
  out += s;
  for (int64_t i = 0; i < pad - left; ++i) out += fill;
  return out;
}

bool IsAllOf(std::string_view s, bool (*pred)(char32_t)) {
  if (s.empty()) return false;
  for (char32_t c : DecodeUtf8(s)) {
    if (!pred(c)) return false;
  }
  return true;
}

}  // namespace thermocline::server::jinja
