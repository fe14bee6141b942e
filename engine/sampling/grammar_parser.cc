// GBNF text to syntax tree by recursive descent. Whitespace is spaces, tabs and `#` comments;
// a newline ends a rule except inside a group, after `::=` or `|`, or before a line that starts
// with `|`.
#include "engine/sampling/grammar_parser.h"

#include <algorithm>
#include <optional>

#include "absl/strings/str_cat.h"
#include "engine/tokenizer/utf8.h"

namespace thermocline {
namespace {

constexpr char32_t kMaxCodePoint = 0x10FFFF;

bool IsNameChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
         c == '_';
}

bool IsDigit(char c) { return c >= '0' && c <= '9'; }

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

class Parser {
 public:
  explicit Parser(std::string_view text) : text_(text) {}

  absl::StatusOr<std::vector<GbnfRule>> Run() {
    std::vector<GbnfRule> rules;
    SkipSpace(/*newlines=*/true);
    while (!AtEnd()) {
      GbnfRule rule;
      rule.offset = pos_;
      rule.name = ParseName();
      if (rule.name.empty()) {
        return Error(pos_, absl::StrCat("expected a rule name, found ", Describe(pos_)));
      }
      SkipSpace(/*newlines=*/false);
      if (text_.substr(pos_, 3) != "::=") {
        return Error(pos_, absl::StrCat("expected '::=' after the rule name '", rule.name,
                                        "', found ", Describe(pos_)));
      }
      pos_ += 3;
      SkipSpace(/*newlines=*/true);
      std::optional<GbnfExpr> body = ParseAlternatives(/*nested=*/false);
      if (!body) return error_;
      rule.body = std::move(*body);
      if (!AtEnd() && Peek() != '\n' && Peek() != '\r') {
        const char* what = Peek() == ')' ? "an unmatched ')'" : nullptr;
        return Error(pos_, absl::StrCat("expected the end of the line after rule '", rule.name,
                                        "', found ", what ? what : Describe(pos_)));
      }
      rules.push_back(std::move(rule));
      SkipSpace(/*newlines=*/true);
    }
    return rules;
  }

 private:
  bool AtEnd() const { return pos_ >= text_.size(); }
  char Peek(size_t ahead = 0) const {
    return pos_ + ahead < text_.size() ? text_[pos_ + ahead] : '\0';
  }

  std::string Describe(size_t at) const {
    if (at >= text_.size()) return "the end of the grammar";
    const char c = text_[at];
    if (c == '\n' || c == '\r') return "the end of the line";
    const Utf8Scan scan = ScanUtf8(text_, at);
    return absl::StrCat(
        "'", AbslView(text_.substr(at, scan.kind == Utf8Scan::kComplete ? scan.length : 1)), "'");
  }

  // Records the first error (with its position) and returns an empty result to unwind.
  absl::Status Error(size_t at, std::string_view message) {
    error_ = absl::InvalidArgumentError(
        absl::StrCat("grammar: ", GbnfLocation(text_, at), ": ", AbslView(message)));
    return error_;
  }

  void SkipSpace(bool newlines) {
    while (!AtEnd()) {
      const char c = Peek();
      if (c == ' ' || c == '\t') {
        ++pos_;
      } else if (c == '#') {
        while (!AtEnd() && Peek() != '\n' && Peek() != '\r') ++pos_;
      } else if ((c == '\n' || c == '\r') && newlines) {
        ++pos_;
      } else {
        break;
      }
    }
  }

  // At a newline outside a group: true (and past the newlines) when the next line continues
  // the alternatives with `|`.
  bool ContinuesOnNextLine() {
    size_t save = pos_;
    SkipSpace(/*newlines=*/true);
    if (Peek() == '|') return true;
    pos_ = save;
    return false;
  }

  std::string ParseName() {
    const size_t start = pos_;
    while (!AtEnd() && IsNameChar(Peek())) ++pos_;
    return std::string(text_.substr(start, pos_ - start));
  }

  std::optional<GbnfExpr> ParseAlternatives(bool nested) {
    GbnfExpr alts;
    alts.kind = GbnfExpr::Kind::kAlternatives;
    alts.offset = pos_;
    while (true) {
      std::optional<GbnfExpr> seq = ParseSequence(nested);
      if (!seq) return std::nullopt;
      alts.children.push_back(std::move(*seq));
      if (!nested && (Peek() == '\n' || Peek() == '\r') && !ContinuesOnNextLine()) break;
      if (Peek() != '|') break;
      ++pos_;
      SkipSpace(/*newlines=*/true);
    }
    if (alts.children.size() == 1) return std::move(alts.children[0]);
    return alts;
  }

  std::optional<GbnfExpr> ParseSequence(bool nested) {
    GbnfExpr seq;
    seq.kind = GbnfExpr::Kind::kSequence;
    seq.offset = pos_;
    while (!AtEnd()) {
      const char c = Peek();
      if (c == '|' || c == ')' || c == '\n' || c == '\r') break;
      std::optional<GbnfExpr> item = ParsePrimary(nested);
      if (!item) return std::nullopt;
      SkipSpace(nested);
      while (!AtEnd() && (Peek() == '*' || Peek() == '+' || Peek() == '?' || Peek() == '{')) {
        item = ParseRepetition(std::move(*item), nested);
        if (!item) return std::nullopt;
        SkipSpace(nested);
      }
      seq.children.push_back(std::move(*item));
    }
    return seq;
  }

  std::optional<GbnfExpr> ParsePrimary(bool nested) {
    const size_t start = pos_;
    const char c = Peek();
    GbnfExpr e;
    e.offset = start;
    if (c == '"') {
      e.kind = GbnfExpr::Kind::kLiteral;
      ++pos_;
      while (true) {
        if (AtEnd()) return Fail(start, "unterminated string literal (missing '\"')");
        if (Peek() == '"') break;
        std::optional<char32_t> cp = ParseChar();
        if (!cp) return std::nullopt;
        e.text.push_back(*cp);
      }
      ++pos_;
      return e;
    }
    if (c == '[') return ParseClass();
    if (c == '.') {
      ++pos_;
      e.kind = GbnfExpr::Kind::kCharClass;
      e.negated = true;
      return e;
    }
    if (c == '(') {
      ++pos_;
      SkipSpace(/*newlines=*/true);
      std::optional<GbnfExpr> inner = ParseAlternatives(/*nested=*/true);
      if (!inner) return std::nullopt;
      if (Peek() != ')') {
        return Fail(pos_, absl::StrCat("expected ')' to close the group opened at ",
                                       GbnfLocation(text_, start), ", found ", Describe(pos_)));
      }
      ++pos_;
      inner->offset = start;
      return inner;
    }
    if (IsNameChar(c)) {
      e.kind = GbnfExpr::Kind::kRuleRef;
      e.name = ParseName();
      SkipSpace(nested);
      if (text_.substr(pos_, 3) == "::=") {
        return Fail(start, absl::StrCat("rule '", e.name,
                                        "' starts in the middle of a line: put each rule on "
                                        "its own line"));
      }
      return e;
    }
    if (c == '<') return Fail(start, "token references (<...>) are not supported");
    if (c == '*' || c == '+' || c == '?' || c == '{') {
      return Fail(start, absl::StrCat("'", std::string(1, c), "' has nothing to repeat"));
    }
    return Fail(start, absl::StrCat("unexpected ", Describe(start)));
  }

  std::optional<GbnfExpr> ParseClass() {
    const size_t start = pos_;
    GbnfExpr e;
    e.kind = GbnfExpr::Kind::kCharClass;
    e.offset = start;
    ++pos_;  // '['
    if (Peek() == '^') {
      e.negated = true;
      ++pos_;
    }
    while (true) {
      if (AtEnd()) return Fail(start, "unterminated character class (missing ']')");
      if (Peek() == ']') break;
      const size_t item = pos_;
      std::optional<char32_t> lo = ParseChar();
      if (!lo) return std::nullopt;
      char32_t hi = *lo;
      if (Peek() == '-' && Peek(1) != ']' && pos_ + 1 < text_.size()) {
        ++pos_;
        std::optional<char32_t> end = ParseChar();
        if (!end) return std::nullopt;
        hi = *end;
        if (hi < *lo) return Fail(item, "character range is reversed (its end is below its start)");
      }
      e.ranges.emplace_back(*lo, hi);
    }
    ++pos_;  // ']'
    return e;
  }

  // One character of a literal or class: an escape or one UTF-8 encoded code point.
  std::optional<char32_t> ParseChar() {
    const size_t start = pos_;
    if (Peek() == '\\') {
      const char k = Peek(1);
      pos_ += 2;
      switch (k) {
        case 'n':
          return U'\n';
        case 'r':
          return U'\r';
        case 't':
          return U'\t';
        case '0':
          return U'\0';
        case '\\':
        case '"':
        case '\'':
        case '[':
        case ']':
        case '-':
        case '^':
        case '/':
          return static_cast<char32_t>(k);
        case 'x':
          return ParseHex(start, 2);
        case 'u':
          return ParseHex(start, 4);
        case 'U':
          return ParseHex(start, 8);
        default:
          if (start + 1 >= text_.size()) return Fail(start, "the grammar ends inside an escape");
          return Fail(start, absl::StrCat("unknown escape '\\", Describe(start + 1).substr(1)));
      }
    }
    const Utf8Scan scan = ScanUtf8(text_, pos_);
    if (scan.kind != Utf8Scan::kComplete) return Fail(start, "the grammar is not valid UTF-8");
    pos_ += scan.length;
    return static_cast<char32_t>(scan.codepoint);
  }

  std::optional<char32_t> ParseHex(size_t start, int digits) {
    uint32_t value = 0;
    for (int i = 0; i < digits; ++i) {
      const int h = HexValue(Peek());
      if (h < 0) {
        return Fail(start, absl::StrCat("escape '", AbslView(text_.substr(start, 2)), "' needs ",
                                        digits, " hex digits"));
      }
      value = value * 16 + static_cast<uint32_t>(h);
      ++pos_;
    }
    if (value > kMaxCodePoint) return Fail(start, "code point above U+10FFFF");
    return static_cast<char32_t>(value);
  }

  std::optional<int32_t> ParseInt() {
    const size_t start = pos_;
    int64_t value = 0;
    while (IsDigit(Peek())) {
      value = value * 10 + (Peek() - '0');
      if (value > kGbnfMaxRepeat) {
        return Fail(start, absl::StrCat("repetition bound above ", kGbnfMaxRepeat,
                                        ", the most this grammar engine expands"));
      }
      ++pos_;
    }
    if (pos_ == start)
      return Fail(start, absl::StrCat("expected a number, found ", Describe(start)));
    return static_cast<int32_t>(value);
  }

  std::optional<GbnfExpr> ParseRepetition(GbnfExpr item, bool nested) {
    GbnfExpr rep;
    rep.kind = GbnfExpr::Kind::kRepeat;
    rep.offset = item.offset;
    const size_t op = pos_;
    const char c = Peek();
    ++pos_;
    if (c == '*') {
      rep.min = 0;
      rep.max = -1;
    } else if (c == '+') {
      rep.min = 1;
      rep.max = -1;
    } else if (c == '?') {
      rep.min = 0;
      rep.max = 1;
    } else {  // {m}, {m,}, {m,n}
      SkipSpace(nested);
      std::optional<int32_t> min = ParseInt();
      if (!min) return std::nullopt;
      rep.min = rep.max = *min;
      SkipSpace(nested);
      if (Peek() == ',') {
        ++pos_;
        SkipSpace(nested);
        rep.max = -1;
        if (IsDigit(Peek())) {
          std::optional<int32_t> max = ParseInt();
          if (!max) return std::nullopt;
          rep.max = *max;
          SkipSpace(nested);
        }
      }
      if (Peek() != '}') {
        return Fail(pos_,
                    absl::StrCat("expected '}' to close the repetition, found ", Describe(pos_)));
      }
      ++pos_;
      if (rep.max >= 0 && rep.max < rep.min) {
        return Fail(op, absl::StrCat("repetition {", rep.min, ",", rep.max,
                                     "} has its maximum below its minimum"));
      }
    }
    rep.children.push_back(std::move(item));
    return rep;
  }

  std::nullopt_t Fail(size_t at, std::string_view message) {
    static_cast<void>(Error(at, message));
    return std::nullopt;
  }

  std::string_view text_;
  size_t pos_ = 0;
  absl::Status error_;
};

}  // namespace

std::string GbnfLocation(std::string_view text, size_t offset) {
  offset = std::min(offset, text.size());
  int line = 1;
  size_t line_start = 0;
  for (size_t i = 0; i < offset; ++i) {
    if (text[i] == '\n') {
      ++line;
      line_start = i + 1;
    }
  }
  return absl::StrCat(line, ":", offset - line_start + 1);
}

absl::StatusOr<std::vector<GbnfRule>> ParseGbnf(std::string_view text) {
  return Parser(text).Run();
}

}  // namespace thermocline
