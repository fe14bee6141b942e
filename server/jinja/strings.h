// Python's str operations over UTF-8 text, as chat templates use them: lengths and indices count
// code points, whitespace is Python's str.isspace() set, and case mapping covers ASCII, Latin-1,
// Latin Extended-A, Greek and Cyrillic (other scripts pass through unchanged).
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace thermocline::server::jinja {

// Code points of UTF-8 text; a byte that starts no valid sequence stands for itself.
std::u32string DecodeUtf8(std::string_view s);
void AppendUtf8(char32_t c, std::string* out);
std::string EncodeUtf8(std::u32string_view s);
size_t CodePointCount(std::string_view s);
bool IsAscii(std::string_view s);

bool IsSpace(char32_t c);      // str.isspace()
bool IsLineBreak(char32_t c);  // the boundaries of str.splitlines()
bool IsWordChar(char32_t c);   // regex \w (non-ASCII letters approximated)
char32_t ToUpper(char32_t c);
char32_t ToLower(char32_t c);
bool IsCased(char32_t c);

// `chars`: nullopt strips whitespace, else the set of code points to strip.
std::string Strip(std::string_view s, const std::optional<std::string>& chars, bool left,
                  bool right);
std::string Upper(std::string_view s);
std::string Lower(std::string_view s);
std::string PyTitle(std::string_view s);     // str.title()
std::string Capitalize(std::string_view s);  // str.capitalize()
std::string SwapCase(std::string_view s);
// str.split(sep, maxsplit) / str.rsplit; sep nullopt splits on whitespace runs.
std::vector<std::string> Split(std::string_view s, const std::optional<std::string>& sep,
                               int64_t maxsplit, bool from_right);
std::vector<std::string> SplitLines(std::string_view s, bool keepends);
// str.replace(old, new, count); count < 0 replaces all.
std::string Replace(std::string_view s, std::string_view old_text, std::string_view new_text,
                    int64_t count);
// str.find / str.rfind in code points; -1 when absent.
int64_t Find(std::string_view s, std::string_view sub, bool from_right);
int64_t Count(std::string_view s, std::string_view sub);
// The indices s[start:stop:step] selects from a sequence of `length` items, with Python's
// clamping of negative and out-of-range bounds. Throws a render error for step 0.
std::vector<int64_t> SliceIndices(int64_t length, std::optional<int64_t> start,
                                  std::optional<int64_t> stop, std::optional<int64_t> step);
// s[start:stop:step] with Python's clamping of negative and out-of-range bounds.
std::string SliceString(std::string_view s, std::optional<int64_t> start,
                        std::optional<int64_t> stop, std::optional<int64_t> step);
// The code point at Python index i (negative counts from the end); nullopt when out of range.
std::optional<std::string> CharAt(std::string_view s, int64_t i);
std::string Center(std::string_view s, int64_t width, std::string_view fill);
bool IsAllOf(std::string_view s, bool (*pred)(char32_t));  // false for ""

}  // namespace thermocline::server::jinja
