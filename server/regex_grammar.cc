// Regular expression to GBNF: a recursive-descent parser over the pattern's code points into
// a small tree (alternation, sequence, repetition, character set, anchors), then each set as
// the JSON-string characters that spell its members.
#include "server/regex_grammar.h"

#include <algorithm>
#include <cstdio>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/sampling/utf8_ranges.h"
#include "engine/tokenizer/utf8.h"

namespace thermocline::server {
namespace {

using Ranges = std::vector<std::pair<char32_t, char32_t>>;
constexpr int64_t kMaxRepeat = 10000;

struct Node {
  enum class Kind { kAlt, kSeq, kSet, kRepeat, kStart, kEnd };
  Kind kind = Kind::kSeq;
  std::vector<Node> kids;
  Ranges set;  // kSet: normalized code point ranges
  int64_t min = 0;
  std::optional<int64_t> max;
};

const Ranges& Digits() {
  static const Ranges r = {{'0', '9'}};
  return r;
}
const Ranges& Word() {
  static const Ranges r = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
  return r;
}
const Ranges& Space() {  // ECMAScript's WhiteSpace and LineTerminator
  static const Ranges r = {{0x09, 0x0D},     {0x20, 0x20},     {0xA0, 0xA0},     {0x1680, 0x1680},
                           {0x2000, 0x200A}, {0x2028, 0x2029}, {0x202F, 0x202F}, {0x205F, 0x205F},
                           {0x3000, 0x3000}, {0xFEFF, 0xFEFF}};
  return r;
}
const Ranges& LineTerminators() {
  static const Ranges r = {{0x0A, 0x0A}, {0x0D, 0x0D}, {0x2028, 0x2029}};
  return r;
}

class RegexParser {
 public:
  explicit RegexParser(std::string_view pattern) : pattern_(pattern) {}

  absl::StatusOr<Node> Parse() {
    for (size_t i = 0; i < pattern_.size();) {
      const Utf8Scan scan = ScanUtf8(pattern_, i);
      if (scan.kind != Utf8Scan::kComplete) return Invalid("the pattern is not valid UTF-8");
      cps_.push_back(scan.codepoint);
      i += scan.length;
    }
    absl::StatusOr<Node> node = ParseAlt();
    if (!node.ok()) return node;
    if (pos_ < cps_.size()) return Invalid("unmatched ')'");
    return node;
  }

 private:
  absl::Status Invalid(std::string_view what) const {
    return absl::InvalidArgumentError(
        absl::StrCat("json_schema: pattern '", AbslView(pattern_), "': ", AbslView(what)));
  }
  absl::Status Unsupported(std::string_view what) const {
    return absl::UnimplementedError(absl::StrCat("json_schema: pattern '", AbslView(pattern_),
                                                 "': ", AbslView(what), " is not supported"));
  }
  bool AtEnd() const { return pos_ >= cps_.size(); }
  char32_t Peek(size_t ahead = 0) const {
    return pos_ + ahead < cps_.size() ? cps_[pos_ + ahead] : 0;
  }

  absl::StatusOr<Node> ParseAlt() {
    Node alt;
    alt.kind = Node::Kind::kAlt;
    while (true) {
      absl::StatusOr<Node> seq = ParseSeq();
      if (!seq.ok()) return seq;
      alt.kids.push_back(std::move(*seq));
      if (AtEnd() || Peek() != '|') break;
      ++pos_;
    }
    return alt;
  }

  absl::StatusOr<Node> ParseSeq() {
    Node seq;
    seq.kind = Node::Kind::kSeq;
    while (!AtEnd() && Peek() != '|' && Peek() != ')') {
      absl::StatusOr<Node> atom = ParseAtom();
      if (!atom.ok()) return atom;
      while (!AtEnd()) {
        absl::StatusOr<bool> quantified = ParseQuantifier(&*atom);
        if (!quantified.ok()) return quantified.status();
        if (!*quantified) break;
      }
      seq.kids.push_back(std::move(*atom));
    }
    return seq;
  }

  // Reads a decimal number at pos_ (nullopt, pos_ unchanged, when there is none).
  std::optional<int64_t> Number() {
    int64_t v = 0;
    size_t start = pos_;
    while (!AtEnd() && Peek() >= '0' && Peek() <= '9') {
      v = std::min<int64_t>(v * 10 + (Peek() - '0'), kMaxRepeat + 1);
      ++pos_;
    }
    if (pos_ == start) return std::nullopt;
    return v;
  }

  // A quantifier after `atom`: wraps it and returns true; false when none follows.
  absl::StatusOr<bool> ParseQuantifier(Node* atom) {
    int64_t min;
    std::optional<int64_t> max;
    const char32_t c = Peek();
    if (c == '*' || c == '+' || c == '?') {
      ++pos_;
      min = c == '+' ? 1 : 0;
      if (c == '?') max = 1;
    } else if (c == '{') {
      const size_t save = pos_;
      ++pos_;
      std::optional<int64_t> lo = Number();
      bool ok = lo.has_value();
      if (ok && Peek() == ',') {
        ++pos_;
        max = Number();
      } else {
        max = lo;
      }
      if (!ok || Peek() != '}') {  // not a quantifier: '{' stands for itself
        pos_ = save;
        return false;
      }
      ++pos_;
      min = *lo;
      if (min > kMaxRepeat || (max && *max > kMaxRepeat)) {
        return Unsupported(absl::StrCat("a repetition bound above ", kMaxRepeat));
      }
      if (max && *max < min) return Invalid("a repetition {n,m} has m below n");
    } else {
      return false;
    }
    if (!AtEnd() && Peek() == '?') ++pos_;  // lazy: the same language
    if (atom->kind == Node::Kind::kStart || atom->kind == Node::Kind::kEnd) {
      return Invalid("an anchor cannot be repeated");
    }
    Node rep;
    rep.kind = Node::Kind::kRepeat;
    rep.min = min;
    rep.max = max;
    rep.kids.push_back(std::move(*atom));
    *atom = std::move(rep);
    return true;
  }

  static Node SetNode(Ranges ranges, bool negate) {
    Node n;
    n.kind = Node::Kind::kSet;
    n.set = NormalizeCodePointRanges(std::move(ranges), negate);
    return n;
  }

  absl::StatusOr<Node> ParseAtom() {
    const char32_t c = Peek();
    ++pos_;
    switch (c) {
      case '(': {
        if (Peek() == '?') {
          const char32_t k = Peek(1);
          if (k == ':') {
            pos_ += 2;
          } else if (k == '<' && Peek(2) != '=' && Peek(2) != '!') {
            pos_ += 2;
            while (!AtEnd() && Peek() != '>') ++pos_;
            if (AtEnd()) return Invalid("unterminated group name");
            ++pos_;
          } else if (k == '=' || k == '!' || k == '<') {
            return Unsupported("lookahead and lookbehind ((?=, (?!, (?<=, (?<!)");
          } else {
            return Unsupported("a '(?' group other than (?: and (?<name>");
          }
        }
        absl::StatusOr<Node> inner = ParseAlt();
        if (!inner.ok()) return inner;
        if (AtEnd() || Peek() != ')') return Invalid("missing ')'");
        ++pos_;
        return inner;
      }
      case '[':
        return ParseClass();
      case '.':
        return SetNode(LineTerminators(), /*negate=*/true);
      case '^': {
        Node n;
        n.kind = Node::Kind::kStart;
        return n;
      }
      case '$': {
        Node n;
        n.kind = Node::Kind::kEnd;
        return n;
      }
      case '\\': {
        absl::StatusOr<Ranges> set = ParseEscape(/*in_class=*/false);
        if (!set.ok()) return set.status();
        return SetNode(std::move(*set), false);
      }
      case ')':
        return Invalid("unmatched ')'");
      case '*':
      case '+':
      case '?':
        return Invalid("a quantifier with nothing to repeat");
      default:
        return SetNode({{c, c}}, false);
    }
  }

  // After a backslash: the set it stands for.
  absl::StatusOr<Ranges> ParseEscape(bool in_class) {
    if (AtEnd()) return Invalid("the pattern ends with a backslash");
    const char32_t c = Peek();
    ++pos_;
    const auto one = [](char32_t cp) { return Ranges{{cp, cp}}; };
    const auto complement = [](const Ranges& r) { return NormalizeCodePointRanges(r, true); };
    switch (c) {
      case 'd':
        return Digits();
      case 'D':
        return complement(Digits());
      case 'w':
        return Word();
      case 'W':
        return complement(Word());
      case 's':
        return Space();
      case 'S':
        return complement(Space());
      case 'n':
        return one('\n');
      case 'r':
        return one('\r');
      case 't':
        return one('\t');
      case 'f':
        return one('\f');
      case 'v':
        return one('\v');
      case '0':
        return one(0);
      case 'b':
        if (in_class) return one('\b');
        return Unsupported("a word boundary (\\b)");
      case 'B':
        return Unsupported("a non-word boundary (\\B)");
      case 'p':
      case 'P':
        return Unsupported("a Unicode property class (\\p{...})");
      case 'c':
        return Unsupported("a control escape (\\c)");
      case 'k':
        return Unsupported("a named backreference (\\k<...>)");
      case 'x':
      case 'u': {
        const int digits = c == 'x' ? 2 : 4;
        char32_t v = 0;
        for (int i = 0; i < digits; ++i) {
          const char32_t h = Peek();
          int d = -1;
          if (h >= '0' && h <= '9') d = static_cast<int>(h - '0');
          if (h >= 'a' && h <= 'f') d = static_cast<int>(h - 'a' + 10);
          if (h >= 'A' && h <= 'F') d = static_cast<int>(h - 'A' + 10);
          if (d < 0) {
            if (c == 'u' && h == '{') return Unsupported("\\u{...} (it needs the u flag)");
            return Invalid(absl::StrCat("\\", std::string(1, static_cast<char>(c)), " needs ",
                                        digits, " hex digits"));
          }
          v = v * 16 + static_cast<char32_t>(d);
          ++pos_;
        }
        return one(v);
      }
      default:
        if (c >= '1' && c <= '9') return Unsupported("a backreference (\\1 ...)");
        return one(c);  // an identity escape: \. \* \\ \/ ...
    }
  }

  absl::StatusOr<Node> ParseClass() {
    bool negate = false;
    if (Peek() == '^') {
      negate = true;
      ++pos_;
    }
    Ranges ranges;
    while (true) {
      if (AtEnd()) return Invalid("missing ']'");
      if (Peek() == ']') break;
      // One class atom: a single character (possibly escaped) or an escape's set.
      const auto atom = [&]() -> absl::StatusOr<Ranges> {
        const char32_t c = Peek();
        ++pos_;
        if (c == '\\') return ParseEscape(/*in_class=*/true);
        return Ranges{{c, c}};
      };
      absl::StatusOr<Ranges> lo = atom();
      if (!lo.ok()) return lo.status();
      if (Peek() == '-' && Peek(1) != ']' && pos_ + 1 < cps_.size()) {
        ++pos_;
        absl::StatusOr<Ranges> hi = atom();
        if (!hi.ok()) return hi.status();
        if (lo->size() != 1 || hi->size() != 1 || (*lo)[0].first != (*lo)[0].second ||
            (*hi)[0].first != (*hi)[0].second) {
          return Invalid("a class range between a set escape (\\d, \\w, \\s)");
        }
        if ((*hi)[0].first < (*lo)[0].first) return Invalid("a class range out of order");
        ranges.emplace_back((*lo)[0].first, (*hi)[0].first);
      } else {
        ranges.insert(ranges.end(), lo->begin(), lo->end());
      }
    }
    ++pos_;  // ']'
    return SetNode(std::move(ranges), negate);
  }

  std::string_view pattern_;
  std::vector<char32_t> cps_;
  size_t pos_ = 0;
};

bool Nullable(const Node& n) {
  switch (n.kind) {
    case Node::Kind::kSet:
      return false;
    case Node::Kind::kSeq:
      for (const Node& k : n.kids) {
        if (!Nullable(k)) return false;
      }
      return true;
    case Node::Kind::kAlt:
      for (const Node& k : n.kids) {
        if (Nullable(k)) return true;
      }
      return false;
    case Node::Kind::kRepeat:
      return n.min == 0 || Nullable(n.kids[0]);
    default:
      return true;  // anchors
  }
}

bool Contains(const Ranges& r, char32_t cp) {
  for (const auto& [lo, hi] : r) {
    if (cp >= lo && cp <= hi) return true;
  }
  return false;
}

class Emitter {
 public:
  Emitter(std::string_view pattern, GbnfBuilder& b, const std::string& hint)
      : pattern_(pattern), b_(b), hint_(hint) {}

  absl::StatusOr<std::string> Top(const Node& root) {
    const std::string any = absl::StrCat("( ", b_.Primitive("json-char"), " )*");
    std::vector<std::string> alts;
    for (const Node& seq : root.kids) {
      std::vector<const Node*> items;
      for (const Node& k : seq.kids) items.push_back(&k);
      const bool start = !items.empty() && items.front()->kind == Node::Kind::kStart;
      if (start) items.erase(items.begin());
      const bool end = !items.empty() && items.back()->kind == Node::Kind::kEnd;
      if (end) items.pop_back();
      std::vector<std::string> parts;
      if (!start) parts.push_back(any);
      for (const Node* item : items) {
        absl::StatusOr<std::string> e = Emit(*item);
        if (!e.ok()) return e;
        if (!e->empty()) parts.push_back(*e);
      }
      if (!end) parts.push_back(any);
      alts.push_back(parts.empty() ? "\"\"" : absl::StrJoin(parts, " "));
    }
    return alts.size() == 1 ? alts[0] : absl::StrCat("( ", absl::StrJoin(alts, " | "), " )");
  }

 private:
  absl::Status Unsupported(std::string_view what) const {
    return absl::UnimplementedError(absl::StrCat("json_schema: pattern '", AbslView(pattern_),
                                                 "': ", AbslView(what), " is not supported"));
  }

  absl::StatusOr<std::string> Emit(const Node& n) {
    switch (n.kind) {
      case Node::Kind::kStart:
      case Node::Kind::kEnd:
        return Unsupported("an anchor (^ or $) other than at the start or end of an alternative");
      case Node::Kind::kSet:
        return Set(n.set);
      case Node::Kind::kSeq: {
        std::vector<std::string> parts;
        for (const Node& k : n.kids) {
          absl::StatusOr<std::string> e = Emit(k);
          if (!e.ok()) return e;
          if (!e->empty()) parts.push_back(*e);
        }
        if (parts.empty()) return std::string("\"\"");
        return parts.size() == 1 ? parts[0] : absl::StrCat("( ", absl::StrJoin(parts, " "), " )");
      }
      case Node::Kind::kAlt: {
        std::vector<std::string> alts;
        for (const Node& k : n.kids) {
          absl::StatusOr<std::string> e = Emit(k);
          if (!e.ok()) return e;
          alts.push_back(e->empty() ? "\"\"" : *e);
        }
        return alts.size() == 1 ? alts[0] : absl::StrCat("( ", absl::StrJoin(alts, " | "), " )");
      }
      case Node::Kind::kRepeat: {
        if (!n.max && Nullable(n.kids[0])) {
          return Unsupported(
              "unbounded repetition of something that can match nothing, e.g. (a*)*");
        }
        absl::StatusOr<std::string> item = Emit(n.kids[0]);
        if (!item.ok()) return item;
        return GbnfRepeat(*item, n.min, n.max);
      }
    }
    return std::string();
  }

  // The JSON-string spellings of the characters in `set`: the ones JSON writes plainly as a
  // class, and ", \ and control characters by their escapes.
  std::string Set(const Ranges& set) {
    std::vector<std::string> alts;
    std::string raw;
    for (auto [lo, hi] : set) {
      // Leave out 0x00-0x1F, '"' and '\\'.
      const Ranges pieces = {{0x20, 0x21}, {0x23, 0x5B}, {0x5D, 0x10FFFF}};
      for (const auto& [plo, phi] : pieces) {
        const char32_t a = std::max(lo, plo), z = std::min(hi, phi);
        if (a > z) continue;
        raw += GbnfClassChar(a);
        if (z > a) absl::StrAppend(&raw, "-", GbnfClassChar(z));
      }
    }
    if (!raw.empty()) alts.push_back(absl::StrCat("[", raw, "]"));
    if (Contains(set, '"')) alts.push_back(GbnfLiteral("\\\""));
    if (Contains(set, '\\')) alts.push_back(GbnfLiteral("\\\\"));
    int controls = 0;
    for (char32_t c = 0; c < 0x20; ++c) controls += Contains(set, c) ? 1 : 0;
    if (controls == 0x20) {
      alts.push_back(GbnfLiteral("\\") + " ( [bfnrt] | \"u00\" [01] [0-9a-fA-F] )");
    } else {
      for (char32_t c = 0; c < 0x20; ++c) {
        if (!Contains(set, c)) continue;
        const char* shorts[] = {"b", "t", "n", nullptr, "f", "r"};
        const char* s = c >= 8 && c <= 13 ? shorts[c - 8] : nullptr;
        char buf[8];
        std::snprintf(buf, sizeof buf, "u%04x", static_cast<unsigned>(c));
        alts.push_back(GbnfLiteral(absl::StrCat("\\", s ? s : buf)));
      }
    }
    if (alts.empty()) return "[]";  // an empty class: matches nothing
    if (alts.size() == 1) return alts[0];
    return b_.Add(hint_ + "-char", absl::StrJoin(alts, " | "));
  }

  std::string_view pattern_;
  GbnfBuilder& b_;
  const std::string& hint_;
};

}  // namespace

absl::StatusOr<std::string> RegexToJsonStringGbnf(std::string_view pattern, GbnfBuilder& b,
                                                  const std::string& hint) {
  absl::StatusOr<Node> root = RegexParser(pattern).Parse();
  if (!root.ok()) return root.status();
  return Emitter(pattern, b, hint).Top(*root);
}

}  // namespace thermocline::server
