#include "server/jinja/lexer.h"

#include <cctype>
#include <cerrno>
#include <cstdlib>

#include "server/jinja/cat.h"
#include "server/jinja/error.h"
#include "server/jinja/strings.h"

namespace thermocline::server::jinja {
namespace {

bool IsAsciiSpace(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}
bool IsDigit(char c) { return c >= '0' && c <= '9'; }
bool IsNameStart(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool IsNameChar(char c) { return IsNameStart(c) || IsDigit(c); }

// Python's str.rstrip(): drops trailing whitespace.
std::string_view RStripSpace(std::string_view s) {
  if (IsAscii(s)) {
    size_t e = s.size();
    while (e > 0 && IsSpace(static_cast<unsigned char>(s[e - 1]))) --e;
    return s.substr(0, e);
  }
  return s.substr(0, Strip(s, std::nullopt, false, true).size());
}

// True when s is non-empty and all whitespace (regex \s+).
bool AllSpace(std::string_view s) {
  if (s.empty()) return false;
  for (char32_t c : DecodeUtf8(s)) {
    if (!IsSpace(c)) return false;
  }
  return true;
}

// \r\n and \r become \n; one trailing newline is dropped (jinja2's keep_trailing_newline=False).
std::string Normalize(std::string_view src) {
  std::string out;
  out.reserve(src.size());
  for (size_t i = 0; i < src.size(); ++i) {
    if (src[i] == '\r') {
      out.push_back('\n');
      if (i + 1 < src.size() && src[i + 1] == '\n') ++i;
    } else {
      out.push_back(src[i]);
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

void AppendHex(std::string_view hex, std::string* out, int line) {
  char32_t c = 0;
  for (char h : hex) {
    int d = IsDigit(h)               ? h - '0'
            : (h >= 'a' && h <= 'f') ? h - 'a' + 10
            : (h >= 'A' && h <= 'F') ? h - 'A' + 10
                                     : -1;
    if (d < 0)
      throw JinjaError(JinjaError::Kind::kSyntax, "truncated escape in a string literal", line);
    c = c * 16 + d;
  }
  AppendUtf8(c, out);
}

// The escapes of a Python string literal (what jinja2 applies with "unicode-escape").
std::string Unescape(std::string_view s, int line) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '\\' || i + 1 == s.size()) {
      out.push_back(s[i]);
      continue;
    }
    const char c = s[++i];
    switch (c) {
      case '\n':
        break;
      case '\\':
      case '\'':
      case '"':
        out.push_back(c);
        break;
      case 'a':
        out.push_back('\a');
        break;
      case 'b':
        out.push_back('\b');
        break;
      case 'f':
        out.push_back('\f');
        break;
      case 'n':
        out.push_back('\n');
        break;
      case 'r':
        out.push_back('\r');
        break;
      case 't':
        out.push_back('\t');
        break;
      case 'v':
        out.push_back('\v');
        break;
      case 'x':
      case 'u':
      case 'U': {
        const size_t n = c == 'x' ? 2 : c == 'u' ? 4 : 8;
        if (i + n >= s.size()) {
          throw JinjaError(JinjaError::Kind::kSyntax, "truncated escape in a string literal", line);
        }
        AppendHex(s.substr(i + 1, n), &out, line);
        i += n;
        break;
      }
      default:
        if (c >= '0' && c <= '7') {
          char32_t v = c - '0';
          for (int k = 0; k < 2 && i + 1 < s.size() && s[i + 1] >= '0' && s[i + 1] <= '7'; ++k) {
            v = v * 8 + (s[++i] - '0');
          }
          AppendUtf8(v, &out);
        } else {
          out.push_back('\\');
          out.push_back(c);
        }
    }
  }
  return out;
}

class Lexer {
 public:
  explicit Lexer(std::string_view source) : src_(Normalize(source)) {}

  std::vector<Token> Run() {
    const size_t n = src_.size();
    while (pos_ < n) {
      size_t p = pos_;
      while (true) {
        p = src_.find('{', p);
        if (p == std::string::npos || p + 1 >= n) {
          p = std::string::npos;
          break;
        }
        const char k = src_[p + 1];
        if (k == '{' || k == '%' || k == '#') break;
        ++p;
      }
      if (p == std::string::npos) {
        EmitData(std::string_view(src_).substr(pos_), line_);
        Advance(n);
        break;
      }
      const char kind = src_[p + 1];
      const char sign = p + 2 < n && (src_[p + 2] == '-' || src_[p + 2] == '+') ? src_[p + 2] : 0;
      std::string_view text = std::string_view(src_).substr(pos_, p - pos_);
      text = StripBefore(text, sign, kind != '{');
      EmitData(text, line_);
      Advance(p);
      const size_t body = p + 2 + (sign ? 1 : 0);
      if (kind == '#') {
        Comment(body);
      } else if (kind == '%' && RawBlock(body)) {
        // handled
      } else {
        Tag(kind == '{', body);
      }
    }
    out_.push_back(Token{Token::Type::kEof, "", 0, 0, line_});
    return std::move(out_);
  }

 private:
  [[noreturn]] void Error(std::string message, int line) {
    throw JinjaError(JinjaError::Kind::kSyntax, std::move(message), line);
  }

  void Advance(size_t to) {
    for (size_t i = pos_; i < to; ++i) {
      if (src_[i] == '\n') ++line_;
    }
    pos_ = to;
  }

  bool LineStarting() const { return pos_ == 0 || src_[pos_ - 1] == '\n'; }

  // Text before a tag: `-` strips all whitespace; lstrip_blocks strips a block or comment
  // tag's indentation when only whitespace precedes it on its line.
  std::string_view StripBefore(std::string_view text, char sign, bool block_or_comment) {
    if (sign == '-') return RStripSpace(text);
    if (sign == '+' || !block_or_comment) return text;
    const size_t nl = text.rfind('\n');
    const size_t l_pos = nl == std::string_view::npos ? 0 : nl + 1;
    if ((l_pos > 0 || LineStarting()) && AllSpace(text.substr(l_pos))) return text.substr(0, l_pos);
    return text;
  }

  void EmitData(std::string_view text, int line) {
    if (text.empty()) return;
    if (!out_.empty() && out_.back().type == Token::Type::kData) {
      out_.back().text.append(text);
      return;
    }
    out_.push_back(Token{Token::Type::kData, std::string(text), 0, 0, line});
  }

  void Emit(Token::Type type, std::string text, int line) {
    out_.push_back(Token{type, std::move(text), 0, 0, line});
  }

  // After a block or comment end: `-` eats all whitespace, `+` nothing, else trim_blocks
  // eats one newline.
  size_t SkipAfterEnd(size_t i, char sign) {
    if (sign == '-') {
      while (i < src_.size() && IsAsciiSpace(src_[i])) ++i;
    } else if (sign != '+' && i < src_.size() && src_[i] == '\n') {
      ++i;
    }
    return i;
  }

  void Comment(size_t body) {
    const int line = line_;
    const size_t q = src_.find("#}", body);
    if (q == std::string::npos) Error("missing end of comment tag", line);
    char sign = 0;
    if (q > body && (src_[q - 1] == '-' || src_[q - 1] == '+')) sign = src_[q - 1];
    Advance(SkipAfterEnd(q + 2, sign));
  }

  // {% raw %} ... {% endraw %}: the text in between is data.
  bool RawBlock(size_t body) {
    size_t i = body;
    while (i < src_.size() && IsAsciiSpace(src_[i])) ++i;
    if (src_.compare(i, 3, "raw") != 0 || (i + 3 < src_.size() && IsNameChar(src_[i + 3])))
      return false;
    i += 3;
    while (i < src_.size() && IsAsciiSpace(src_[i])) ++i;
    if (src_.compare(i, 3, "-%}") == 0) {
      i += 3;
      while (i < src_.size() && IsAsciiSpace(src_[i])) ++i;
    } else if (src_.compare(i, 2, "%}") == 0) {
      i += 2;
    } else {
      return false;
    }
    const int line = line_;
    Advance(i);
    for (size_t p = src_.find("{%", pos_); p != std::string::npos; p = src_.find("{%", p + 1)) {
      size_t j = p + 2;
      const char sign = j < src_.size() && (src_[j] == '-' || src_[j] == '+') ? src_[j] : 0;
      if (sign) ++j;
      while (j < src_.size() && IsAsciiSpace(src_[j])) ++j;
      if (src_.compare(j, 6, "endraw") != 0) continue;
      j += 6;
      while (j < src_.size() && IsAsciiSpace(src_[j])) ++j;
      char end_sign = 0;
      if (j < src_.size() && (src_[j] == '-' || src_[j] == '+')) end_sign = src_[j++];
      if (src_.compare(j, 2, "%}") != 0) continue;
      std::string_view text = std::string_view(src_).substr(pos_, p - pos_);
      text = StripBefore(text, sign, true);
      EmitData(text, line_);
      Advance(SkipAfterEnd(j + 2, end_sign));
      return true;
    }
    Error("missing end of raw directive", line);
  }

  void Tag(bool variable, size_t body) {
    const int open_line = line_;
    Emit(variable ? Token::Type::kVarBegin : Token::Type::kBlockBegin, "", open_line);
    Advance(body);
    std::vector<char> brackets;
    const size_t n = src_.size();
    while (true) {
      if (pos_ >= n) {
        Error(Cat("unexpected end of template: the ", variable ? "{{" : "{%",
                  " tag opened on line ", open_line, " is not closed"),
              line_);
      }
      if (brackets.empty()) {
        if (variable) {
          if (src_.compare(pos_, 3, "-}}") == 0) {
            Emit(Token::Type::kVarEnd, "", line_);
            Advance(SkipAfterEnd(pos_ + 3, '-'));
            return;
          }
          if (src_.compare(pos_, 2, "}}") == 0) {
            Emit(Token::Type::kVarEnd, "", line_);
            Advance(pos_ + 2);
            return;
          }
        } else {
          char sign = 0;
          size_t end = pos_;
          if (src_[pos_] == '-' || src_[pos_] == '+') sign = src_[end++];
          if (src_.compare(end, 2, "%}") == 0) {
            Emit(Token::Type::kBlockEnd, "", line_);
            Advance(SkipAfterEnd(end + 2, sign));
            return;
          }
        }
      }
      const char c = src_[pos_];
      if (IsAsciiSpace(c)) {
        Advance(pos_ + 1);
      } else if (IsDigit(c)) {
        Number();
      } else if (IsNameStart(c)) {
        size_t e = pos_;
        while (e < n && IsNameChar(src_[e])) ++e;
        Emit(Token::Type::kName, src_.substr(pos_, e - pos_), line_);
        Advance(e);
      } else if (c == '\'' || c == '"') {
        String(c);
      } else {
        Operator(&brackets);
      }
    }
  }

  void Number() {
    const size_t n = src_.size();
    const int line = line_;
    auto digits = [&](size_t i) {
      while (i < n && (IsDigit(src_[i]) || (src_[i] == '_' && i + 1 < n && IsDigit(src_[i + 1]))))
        ++i;
      return i;
    };
    const bool after_dot = pos_ > 0 && src_[pos_ - 1] == '.';
    size_t e = digits(pos_);
    bool is_float = false;
    if (!after_dot) {
      size_t f = e;
      if (f + 1 < n && src_[f] == '.' && IsDigit(src_[f + 1])) {
        f = digits(f + 1);
        is_float = true;
      }
      if (f < n && (src_[f] == 'e' || src_[f] == 'E')) {
        size_t x = f + 1;
        if (x < n && (src_[x] == '+' || src_[x] == '-')) ++x;
        if (x < n && IsDigit(src_[x])) {
          f = digits(x);
          is_float = true;
        }
      }
      if (is_float) e = f;
    }
    std::string text;
    for (size_t i = pos_; i < e; ++i) {
      if (src_[i] != '_') text.push_back(src_[i]);
    }
    Token t{is_float ? Token::Type::kFloat : Token::Type::kInt, text, 0, 0, line};
    if (is_float) {
      t.float_value = std::strtod(text.c_str(), nullptr);
    } else {
      int base = 10;
      std::string digits_text = text;
      if (text == "0" && e < n &&
          (src_[e] == 'x' || src_[e] == 'X' || src_[e] == 'o' || src_[e] == 'O' || src_[e] == 'b' ||
           src_[e] == 'B')) {
        const char p = static_cast<char>(src_[e] | 0x20);
        base = p == 'x' ? 16 : p == 'o' ? 8 : 2;
        size_t i = e + 1;
        digits_text.clear();
        while (i < n && (std::isxdigit(static_cast<unsigned char>(src_[i])) || src_[i] == '_')) {
          if (src_[i] != '_') digits_text.push_back(src_[i]);
          ++i;
        }
        e = i;
      }
      errno = 0;
      t.int_value = std::strtoll(digits_text.c_str(), nullptr, base);
      if (errno == ERANGE) Error("integer literal out of range", line);
    }
    out_.push_back(std::move(t));
    Advance(e);
  }

  void String(char quote) {
    const int line = line_;
    size_t i = pos_ + 1;
    while (i < src_.size() && src_[i] != quote) {
      if (src_[i] == '\\') ++i;
      ++i;
    }
    if (i >= src_.size()) Error("unclosed string literal", line);
    Emit(Token::Type::kString,
         Unescape(std::string_view(src_).substr(pos_ + 1, i - pos_ - 1), line), line);
    Advance(i + 1);
  }

  void Operator(std::vector<char>* brackets) {
    static constexpr std::string_view kTwo[] = {"//", "**", "==", "!=", ">=", "<="};
    static constexpr std::string_view kOne = "+-/*%~[](){}><=.:|,;";
    const int line = line_;
    for (std::string_view op : kTwo) {
      if (src_.compare(pos_, 2, op) == 0) {
        Emit(Token::Type::kOperator, std::string(op), line);
        Advance(pos_ + 2);
        return;
      }
    }
    const char c = src_[pos_];
    if (kOne.find(c) == std::string_view::npos) {
      Error(Cat("unexpected character '", std::string(1, c), "'"), line);
    }
    if (c == '(' || c == '[' || c == '{') {
      brackets->push_back(c == '(' ? ')' : c == '[' ? ']' : '}');
    } else if (c == ')' || c == ']' || c == '}') {
      if (brackets->empty()) Error(Cat("unexpected '", std::string(1, c), "'"), line);
      if (brackets->back() != c) {
        Error(Cat("unexpected '", std::string(1, c), "', expected '",
                  std::string(1, brackets->back()), "'"),
              line);
      }
      brackets->pop_back();
    }
    Emit(Token::Type::kOperator, std::string(1, c), line);
    Advance(pos_ + 1);
  }

  std::string src_;
  size_t pos_ = 0;
  int line_ = 1;
  std::vector<Token> out_;
};

}  // namespace

std::vector<Token> Lex(std::string_view source) { return Lexer(source).Run(); }

}  // namespace thermocline::server::jinja
