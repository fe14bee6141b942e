// UTF-8 scanning and encoding, and StreamingDetokenizer (which holds back a character whose
// bytes arrive in several tokens).
#include "engine/tokenizer/utf8.h"

#include "engine/tokenizer/tokenizer.h"

namespace thermocline {

Utf8Scan ScanUtf8(std::string_view text, size_t pos) {
  const auto byte = [&](size_t i) { return static_cast<uint8_t>(text[i]); };
  const uint8_t lead = byte(pos);
  if (lead < 0x80) return {Utf8Scan::kComplete, 1, lead};

  // Allowed range of the second byte, and the number of bytes, per lead byte (Table 3-7).
  int length;
  uint8_t lo = 0x80, hi = 0xBF;
  uint32_t cp;
  if (lead >= 0xC2 && lead <= 0xDF) {
    length = 2;
    cp = lead & 0x1F;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    length = 3;
    cp = lead & 0x0F;
    if (lead == 0xE0) lo = 0xA0;
    if (lead == 0xED) hi = 0x9F;
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    length = 4;
    cp = lead & 0x07;
    if (lead == 0xF0) lo = 0x90;
    if (lead == 0xF4) hi = 0x8F;
  } else {
    return {Utf8Scan::kInvalid, 1, kReplacementChar};  // 0x80-0xC1, 0xF5-0xFF
  }

  for (int k = 1; k < length; ++k) {
    if (pos + k >= text.size()) return {Utf8Scan::kIncomplete, k, kReplacementChar};
    const uint8_t b = byte(pos + k);
    const uint8_t min = k == 1 ? lo : 0x80;
    const uint8_t max = k == 1 ? hi : 0xBF;
    if (b < min || b > max) return {Utf8Scan::kInvalid, k, kReplacementChar};
    cp = (cp << 6) | (b & 0x3F);
  }
  return {Utf8Scan::kComplete, length, cp};
}

void AppendUtf8(uint32_t cp, std::string* out) {
  if ((cp >= 0xD800 && cp <= 0xDFFF) || cp > 0x10FFFF) cp = kReplacementChar;
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

namespace {

// Appends the well-formed part of `text` to `out` (ill-formed subparts as U+FFFD) and returns
// the number of bytes consumed; a truncated final sequence is left unconsumed unless `flush`.
size_t AppendValidPrefix(std::string_view text, bool flush, std::string* out) {
  size_t pos = 0;
  while (pos < text.size()) {
    const Utf8Scan scan = ScanUtf8(text, pos);
    if (scan.kind == Utf8Scan::kComplete) {
      out->append(text.substr(pos, scan.length));
    } else if (scan.kind == Utf8Scan::kIncomplete && !flush) {
      break;
    } else {
      out->append(kReplacementUtf8);
    }
    pos += scan.length;
  }
  return pos;
}

}  // namespace

std::string SanitizeUtf8(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  AppendValidPrefix(text, /*flush=*/true, &out);
  return out;
}

std::string StreamingDetokenizer::Push(int32_t id) {
  std::string piece = tokenizer_.TokenToPiece(id);
  if (piece.empty()) return {};
  if (first_) {
    first_ = false;
    if (tokenizer_.add_space_prefix() && piece[0] == ' ') piece.erase(0, 1);
  }
  pending_ += piece;
  std::string out;
  const size_t consumed = AppendValidPrefix(pending_, /*flush=*/false, &out);
  pending_.erase(0, consumed);
  return out;
}

std::string StreamingDetokenizer::Flush() {
  std::string out;
  AppendValidPrefix(pending_, /*flush=*/true, &out);
  pending_.clear();
  return out;
}

void StreamingDetokenizer::Reset() {
  pending_.clear();
  first_ = true;
}

void StreamingDetokenizer::KeepLeadingSpace() { first_ = false; }

}  // namespace thermocline
