// Hand-written matchers for the GPT-2 / Llama-3 / Qwen2 pre-tokenizer regexes. Each matcher
// walks the code points once, trying the regex's alternatives in order at each position, as
// llama.cpp's unicode_regex_split_custom_gpt2 / _llama3 do.
#include "engine/tokenizer/pretokenize.h"

#include <cstddef>
#include <cstdint>

#include "engine/tokenizer/unicode_class.h"
#include "engine/tokenizer/utf8.h"

namespace thermocline {
namespace {

constexpr uint32_t kOutOfRange = 0xFFFFFFFF;

// The text as code points, with each one's byte offset; invalid bytes become U+FFFD (class
// "other") one byte at a time.
class CodepointView {
 public:
  explicit CodepointView(std::string_view text) : text_(text) {
    cps_.reserve(text.size());
    offsets_.reserve(text.size() + 1);
    size_t pos = 0;
    while (pos < text.size()) {
      const Utf8Scan scan = ScanUtf8(text, pos);
      offsets_.push_back(pos);
      if (scan.kind == Utf8Scan::kComplete) {
        cps_.push_back(scan.codepoint);
        classes_.push_back(ClassifyCodepoint(scan.codepoint));
        pos += scan.length;
      } else {
        cps_.push_back(kReplacementChar);
        classes_.push_back(CodepointClass::kOther);
        pos += 1;
      }
    }
    offsets_.push_back(text.size());
  }

  size_t size() const { return cps_.size(); }
  // kOutOfRange / kOther past the end, as llama.cpp's _get_cpt / _get_flags.
  uint32_t cp(size_t i) const { return i < cps_.size() ? cps_[i] : kOutOfRange; }
  bool in_range(size_t i) const { return i < cps_.size(); }
  bool is_letter(size_t i) const { return in_range(i) && classes_[i] == CodepointClass::kLetter; }
  bool is_number(size_t i) const { return in_range(i) && classes_[i] == CodepointClass::kNumber; }
  bool is_space(size_t i) const {
    return in_range(i) && classes_[i] == CodepointClass::kWhitespace;
  }
  // [^\s\p{L}\p{N}]
  bool is_other(size_t i) const { return in_range(i) && classes_[i] == CodepointClass::kOther; }
  std::string_view Slice(size_t begin, size_t end) const {
    return text_.substr(offsets_[begin], offsets_[end] - offsets_[begin]);
  }

 private:
  std::string_view text_;
  std::vector<uint32_t> cps_;
  std::vector<CodepointClass> classes_;
  std::vector<size_t> offsets_;
};

uint32_t AsciiLower(uint32_t cp) { return cp >= 'A' && cp <= 'Z' ? cp + ('a' - 'A') : cp; }
bool IsCrLf(uint32_t cp) { return cp == '\r' || cp == '\n'; }

// 's|'t|'re|'ve|'m|'ll|'d at `pos` (case-insensitive when asked): the match length, or 0.
size_t MatchContraction(const CodepointView& v, size_t pos, bool ignore_case) {
  if (v.cp(pos) != '\'' || !v.in_range(pos + 1)) return 0;
  const auto fold = [&](uint32_t cp) { return ignore_case ? AsciiLower(cp) : cp; };
  const uint32_t c1 = fold(v.cp(pos + 1));
  if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') return 2;
  if (!v.in_range(pos + 2)) return 0;
  const uint32_t c2 = fold(v.cp(pos + 2));
  if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l')) return 3;
  return 0;
}

// The whitespace alternatives shared by both families, at `pos` (a whitespace code point or
// not): \s*[\r\n]+ (when `crlf_rule`), \s+(?!\S), \s+. Returns the end of the match; pos + 1
// when nothing matches (llama.cpp emits an unmatched code point on its own).
size_t MatchWhitespace(const CodepointView& v, size_t pos, bool crlf_rule) {
  size_t n = 0;
  size_t last_crlf_end = 0;
  while (v.is_space(pos + n)) {
    if (IsCrLf(v.cp(pos + n))) last_crlf_end = pos + n + 1;
    ++n;
  }
  if (crlf_rule && last_crlf_end > 0) return last_crlf_end;  // \s*[\r\n]+
  if (n > 1 && v.in_range(pos + n)) return pos + n - 1;      // \s+(?!\S)
  if (n > 0) return pos + n;                                 // \s+
  return pos + 1;
}

size_t NextGpt2(const CodepointView& v, size_t pos) {
  if (size_t n = MatchContraction(v, pos, /*ignore_case=*/false)) return pos + n;
  // An optional leading ' ' for the three classes below.
  const size_t body = v.cp(pos) == ' ' ? pos + 1 : pos;
  if (v.is_letter(body)) {  // ?\p{L}+
    size_t end = body;
    while (v.is_letter(end)) ++end;
    return end;
  }
  if (v.is_number(body)) {  // ?\p{N}+
    size_t end = body;
    while (v.is_number(end)) ++end;
    return end;
  }
  if (v.is_other(body)) {  // ?[^\s\p{L}\p{N}]+
    size_t end = body;
    while (v.is_other(end)) ++end;
    return end;
  }
  return MatchWhitespace(v, pos, /*crlf_rule=*/false);
}

size_t NextLlama3(const CodepointView& v, size_t pos, size_t max_digits) {
  if (size_t n = MatchContraction(v, pos, /*ignore_case=*/true)) return pos + n;
  const uint32_t cp = v.cp(pos);
  // [^\r\n\p{L}\p{N}]?\p{L}+
  if (!IsCrLf(cp) && !v.is_number(pos) && (v.is_letter(pos) || v.is_letter(pos + 1))) {
    size_t end = pos + 1;
    while (v.is_letter(end)) ++end;
    return end;
  }
  // \p{N}{1,3} (Llama-3) or \p{N} (Qwen2)
  if (v.is_number(pos)) {
    size_t end = pos;
    while (end - pos < max_digits && v.is_number(end)) ++end;
    return end;
  }
  // ?[^\s\p{L}\p{N}]+[\r\n]*
  const size_t body = cp == ' ' ? pos + 1 : pos;
  if (v.is_other(body)) {
    size_t end = body;
    while (v.is_other(end)) ++end;
    while (v.in_range(end) && IsCrLf(v.cp(end))) ++end;
    return end;
  }
  return MatchWhitespace(v, pos, /*crlf_rule=*/true);
}

}  // namespace

std::optional<PreTokenizerKind> PreTokenizerFromName(std::string_view name) {
  static constexpr std::string_view kGpt2[] = {
      "",           "gpt-2",      "gpt2",       "phi-2",        "mpt",
      "olmo",       "jais",       "exaone4",    "jina-es",      "jina-de",
      "jina-v1-en", "jina-v2-es", "jina-v2-de", "jina-v2-code", "roberta-bpe",
      "gigachat",   "a.x-4.0",    "mellum",     "trillion"};
  static constexpr std::string_view kLlama3[] = {"llama3",    "llama-v3", "llama-bpe", "falcon3",
                                                 "falcon-h1", "pixtral",  "midm-2.0",  "lfm2",
                                                 "dbrx",      "smaug-bpe"};
  static constexpr std::string_view kQwen2[] = {"qwen2", "deepseek-r1-qwen", "megrez", "stablelm2"};
  for (std::string_view n : kGpt2) {
    if (name == n) return PreTokenizerKind::kGpt2;
  }
  for (std::string_view n : kLlama3) {
    if (name == n) return PreTokenizerKind::kLlama3;
  }
  for (std::string_view n : kQwen2) {
    if (name == n) return PreTokenizerKind::kQwen2;
  }
  return std::nullopt;
}

std::vector<std::string_view> PreTokenize(std::string_view text, PreTokenizerKind kind) {
  const CodepointView v(text);
  std::vector<std::string_view> pieces;
  size_t pos = 0;
  while (pos < v.size()) {
    size_t end;
    switch (kind) {
      case PreTokenizerKind::kGpt2:
        end = NextGpt2(v, pos);
        break;
      case PreTokenizerKind::kLlama3:
        end = NextLlama3(v, pos, 3);
        break;
      case PreTokenizerKind::kQwen2:
      default:
        end = NextLlama3(v, pos, 1);
        break;
    }
    pieces.push_back(v.Slice(pos, end));
    pos = end;
  }
  return pieces;
}

}  // namespace thermocline
