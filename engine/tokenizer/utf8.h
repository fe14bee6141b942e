// UTF-8 helpers for the tokenizers: strict validation (Unicode Table 3-7), U+FFFD replacement
// of ill-formed bytes, and encoding.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "absl/strings/string_view.h"

namespace thermocline {

// This abseil build has its own string_view type; hash-map lookups and StrCat take it.
inline absl::string_view AbslView(std::string_view s) { return {s.data(), s.size()}; }

inline constexpr uint32_t kReplacementChar = 0xFFFD;
inline constexpr std::string_view kReplacementUtf8 = "\xEF\xBF\xBD";

// What the bytes at `pos` hold.
struct Utf8Scan {
  enum Kind {
    kComplete,    // a well-formed character of `length` bytes; `codepoint` set
    kIncomplete,  // a well-formed prefix running to the end of the input (`length` bytes)
    kInvalid,     // `length` bytes (the maximal ill-formed subpart, >= 1) that never form one
  };
  Kind kind;
  int length;
  uint32_t codepoint;
};
Utf8Scan ScanUtf8(std::string_view text, size_t pos);

// Appends the UTF-8 encoding of `cp` (U+FFFD for surrogates and values above U+10FFFF).
void AppendUtf8(uint32_t cp, std::string* out);

// Copies `text`, replacing each maximal ill-formed subpart (including a truncated final
// sequence) with U+FFFD.
std::string SanitizeUtf8(std::string_view text);

}  // namespace thermocline
