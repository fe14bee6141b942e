// GBNF text helpers: escaping, the rule table, JSON building blocks, integer ranges.
#include "server/gbnf_builder.h"

#include <algorithm>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace thermocline::server {
namespace {

// JSON's pieces. A string character is anything but ", \ and control characters, or an
// escape; \u escapes of surrogates (D800-DFFF) are left out, so that no output holds a lone
// surrogate that a strict JSON parser refuses (the character itself can be written raw).
// Numbers keep to 16 integer and 16 fraction digits: a model cannot run on forever in one.
struct PrimitiveDef {
  const char* name;
  const char* body;
};
constexpr PrimitiveDef kPrimitives[] = {
    {"json-value",
     "json-object | json-array | json-string | json-number | json-boolean | json-null"},
    {"json-object",
     "\"{\" ws ( json-string ws \":\" ws json-value ws ( \",\" ws json-string ws \":\" ws "
     "json-value ws )* )? \"}\""},
    {"json-array", "\"[\" ws ( json-value ws ( \",\" ws json-value ws )* )? \"]\""},
    {"json-string", "\"\\\"\" json-char* \"\\\"\""},
    {"json-char",
     "[^\"\\\\\\x00-\\x1F] | \"\\\\\" ( [\"\\\\/bfnrt] | \"u\" ( [0-9a-cA-Ce-fE-F] "
     "[0-9a-fA-F]{3} | [dD] [0-7] [0-9a-fA-F]{2} ) )"},
    {"json-key-char", "[^\"\\\\\\x00-\\x1F]"},
    {"json-number",
     "\"-\"? ( \"0\" | [1-9] [0-9]{0,15} ) ( \".\" [0-9]{1,16} )? ( [eE] [-+]? [0-9]{1,3} )?"},
    {"json-integer", "\"-\"? ( \"0\" | [1-9] [0-9]{0,15} )"},
    {"json-boolean", "\"true\" | \"false\""},
    {"json-null", "\"null\""},
};
constexpr char kWsBounded[] = "( \" \" | \"\\n\" [ \\t]{0,20} )?";
constexpr char kWsCompact[] = "\"\"";

bool IsPrimitiveName(std::string_view name) {
  if (name == "ws" || name == "root") return true;
  return std::any_of(std::begin(kPrimitives), std::end(kPrimitives),
                     [&](const PrimitiveDef& p) { return name == p.name; });
}

// Names of the rules a body refers to (the words that are not inside literals or classes).
std::vector<std::string> ReferencedNames(std::string_view body) {
  std::vector<std::string> names;
  for (size_t i = 0; i < body.size();) {
    const char c = body[i];
    if (c == '"' || c == '[') {
      const char close = c == '"' ? '"' : ']';
      for (++i; i < body.size() && body[i] != close; ++i) {
        if (body[i] == '\\') ++i;
      }
      ++i;
    } else if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) {
      const size_t start = i;
      while (i < body.size() && (std::isalnum(static_cast<unsigned char>(body[i])) ||
                                 body[i] == '-' || body[i] == '_')) {
        ++i;
      }
      names.emplace_back(body.substr(start, i - start));
    } else {
      ++i;
    }
  }
  return names;
}

std::string Digits(uint64_t v) { return std::to_string(v); }

std::string DigitClass(char lo, char hi) {
  if (lo == hi) return absl::StrCat("\"", std::string(1, lo), "\"");
  if (lo == '0' && hi == '9') return "[0-9]";
  return absl::StrCat("[", std::string(1, lo), "-", std::string(1, hi), "]");
}

std::string AnyDigits(size_t n) {
  if (n == 0) return "";
  if (n == 1) return "[0-9]";
  return absl::StrCat("[0-9]{", n, "}");
}

std::string Group(const std::vector<std::string>& alts) {
  if (alts.size() == 1) return alts[0];
  return absl::StrCat("( ", absl::StrJoin(alts, " | "), " )");
}

// Digit strings of s.size() digits (leading zeros allowed) >= s, resp. <= s.
std::string AtLeast(std::string_view s) {
  if (s.find_first_not_of('0') == std::string_view::npos) return AnyDigits(s.size());
  if (s.size() == 1) return DigitClass(s[0], '9');
  std::vector<std::string> alts = {GbnfSeq({DigitClass(s[0], s[0]), AtLeast(s.substr(1))})};
  if (s[0] < '9') alts.push_back(GbnfSeq({DigitClass(s[0] + 1, '9'), AnyDigits(s.size() - 1)}));
  return Group(alts);
}

std::string AtMost(std::string_view s) {
  if (s.find_first_not_of('9') == std::string_view::npos) return AnyDigits(s.size());
  if (s.size() == 1) return DigitClass('0', s[0]);
  std::vector<std::string> alts;
  if (s[0] > '0') alts.push_back(GbnfSeq({DigitClass('0', s[0] - 1), AnyDigits(s.size() - 1)}));
  alts.push_back(GbnfSeq({DigitClass(s[0], s[0]), AtMost(s.substr(1))}));
  return Group(alts);
}

// Digit strings of one length between lo and hi (same length, lo <= hi).
std::string SameLengthRange(const std::string& lo, const std::string& hi) {
  size_t i = 0;
  while (i < lo.size() && lo[i] == hi[i]) ++i;
  if (i == lo.size()) return GbnfLiteral(lo);
  const std::string prefix = i > 0 ? GbnfLiteral(lo.substr(0, i)) : "";
  const size_t rest = lo.size() - i - 1;
  if (rest == 0) return GbnfSeq({prefix, DigitClass(lo[i], hi[i])});
  std::vector<std::string> alts = {GbnfSeq({DigitClass(lo[i], lo[i]), AtLeast(lo.substr(i + 1))})};
  if (lo[i] + 1 <= hi[i] - 1)
    alts.push_back(GbnfSeq({DigitClass(lo[i] + 1, hi[i] - 1), AnyDigits(rest)}));
  alts.push_back(GbnfSeq({DigitClass(hi[i], hi[i]), AtMost(hi.substr(i + 1))}));
  return GbnfSeq({prefix, Group(alts)});
}

constexpr size_t kMaxIntegerDigits = 16;

// Non-negative integers in [lo, hi] (hi absent: up to 16 digits) without leading zeros.
std::string NonNegativeRange(uint64_t lo, std::optional<uint64_t> hi) {
  const std::string a = Digits(lo);
  std::vector<std::string> alts;
  const size_t max_len = hi ? Digits(*hi).size() : std::max(kMaxIntegerDigits, a.size());
  for (size_t len = a.size(); len <= max_len; ++len) {
    std::string from = a;  // the least number of this length: lo itself, or 10^(len-1)
    if (len != a.size()) {
      from.assign(len, '0');
      from[0] = '1';
    }
    const std::string to = hi && len == max_len ? Digits(*hi) : std::string(len, '9');
    if (!hi && len > a.size()) {
      // Every longer length at once: [1-9] and the remaining digits.
      const size_t extra_min = a.size(), extra_max = max_len - 1;
      alts.push_back(
          GbnfSeq({"[1-9]", extra_min == extra_max
                                ? AnyDigits(extra_min)
                                : absl::StrCat("[0-9]{", extra_min, ",", extra_max, "}")}));
      break;
    }
    alts.push_back(SameLengthRange(from, to));
  }
  return Group(alts);
}

}  // namespace

std::string GbnfSeq(std::initializer_list<std::string> parts) {
  std::vector<std::string> kept;
  for (const std::string& p : parts) {
    if (!p.empty()) kept.push_back(p);
  }
  return absl::StrJoin(kept, " ");
}

std::string GbnfRepeat(const std::string& item, int64_t lo, std::optional<int64_t> hi) {
  if (hi && *hi == 0) return "";
  const std::string g = absl::StrCat("( ", item, " )");
  if (!hi) return lo == 0 ? g + "*" : lo == 1 ? g + "+" : absl::StrCat(g, "{", lo, ",}");
  if (lo == *hi) return lo == 1 ? g : absl::StrCat(g, "{", lo, "}");
  if (lo == 0 && *hi == 1) return g + "?";
  return absl::StrCat(g, "{", lo, ",", *hi, "}");
}

std::string GbnfLiteral(std::string_view text) {
  std::string out = "\"";
  for (char c : text) {
    const auto b = static_cast<unsigned char>(c);
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (b < 0x20 || b == 0x7F) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\x%02X", b);
          out += buf;
        } else {
          out.push_back(c);
        }
    }
  }
  out += "\"";
  return out;
}

std::string GbnfClassChar(char32_t cp) {
  char buf[16];
  if (cp == '\\' || cp == ']' || cp == '[' || cp == '-' || cp == '^' || cp == '"') {
    return std::string{'\\', static_cast<char>(cp)};
  }
  if (cp < 0x20 || cp == 0x7F) {
    std::snprintf(buf, sizeof buf, "\\x%02X", static_cast<unsigned>(cp));
    return buf;
  }
  if (cp < 0x80) return std::string(1, static_cast<char>(cp));
  if (cp < 0x10000) {
    std::snprintf(buf, sizeof buf, "\\u%04X", static_cast<unsigned>(cp));
  } else {
    std::snprintf(buf, sizeof buf, "\\U%08X", static_cast<unsigned>(cp));
  }
  return buf;
}

std::string GbnfName(std::string_view text) {
  std::string out;
  for (char c : text) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9');
    if (c >= 'A' && c <= 'Z') {
      out.push_back(static_cast<char>(c - 'A' + 'a'));
    } else if (ok) {
      out.push_back(c);
    } else if (!out.empty() && out.back() != '-') {
      out.push_back('-');
    }
    if (out.size() >= 48) break;
  }
  while (!out.empty() && out.back() == '-') out.pop_back();
  if (out.empty() || !(out[0] >= 'a' && out[0] <= 'z')) out.insert(0, "r-");
  return out;
}

std::string GbnfBuilder::Reserve(std::string_view hint) {
  const std::string base = GbnfName(hint);
  std::string name = base;
  for (int n = 2; IsPrimitiveName(name) || index_.count(name); ++n)
    name = absl::StrCat(base, "-", n);
  index_[name] = rules_.size();
  rules_.emplace_back(name, "");
  return name;
}

void GbnfBuilder::Define(const std::string& name, const std::string& body) {
  rules_[index_.at(name)].second = body;
  by_body_.emplace(body, name);
}

std::string GbnfBuilder::Add(std::string_view hint, const std::string& body) {
  auto it = by_body_.find(body);
  if (it != by_body_.end()) return it->second;
  const std::string name = Reserve(hint);
  Define(name, body);
  return name;
}

std::string GbnfBuilder::Primitive(std::string_view name) {
  const std::string key(name);
  if (index_.count(key)) return key;
  std::string body;
  if (name == "ws") {
    body = compact_ ? kWsCompact : kWsBounded;
  } else {
    for (const PrimitiveDef& p : kPrimitives) {
      if (name == p.name) body = p.body;
    }
  }
  index_[key] = rules_.size();
  rules_.emplace_back(key, body);
  for (const std::string& ref : ReferencedNames(body)) Primitive(ref);
  return key;
}

std::string GbnfBuilder::Text(const std::string& root_body) const {
  std::string out = absl::StrCat("root ::= ", root_body, "\n");
  for (const auto& [name, body] : rules_) absl::StrAppend(&out, name, " ::= ", body, "\n");
  return out;
}

std::string IntegerRangeGbnf(std::optional<int64_t> lo, std::optional<int64_t> hi) {
  std::vector<std::string> alts;
  // Negative part: "-" and magnitudes in [max(1, -hi), -lo].
  if (!lo || *lo < 0) {
    const uint64_t min_mag = hi && *hi < 0 ? static_cast<uint64_t>(-(*hi + 1)) + 1 : 1;
    std::optional<uint64_t> max_mag;
    if (lo) max_mag = static_cast<uint64_t>(-(*lo + 1)) + 1;
    alts.push_back(GbnfSeq({"\"-\"", NonNegativeRange(min_mag, max_mag)}));
  }
  // Non-negative part.
  if (!hi || *hi >= 0) {
    const uint64_t from = lo && *lo > 0 ? static_cast<uint64_t>(*lo) : 0;
    std::optional<uint64_t> to;
    if (hi) to = static_cast<uint64_t>(*hi);
    alts.push_back(NonNegativeRange(from, to));
  }
  return Group(alts);
}

}  // namespace thermocline::server
