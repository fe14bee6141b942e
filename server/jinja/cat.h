// String concatenation for the engine's messages. (Debian's abseil has its own string_view
// type, so absl::StrCat does not take std::string_view; this does.)
#pragma once

#include <concepts>
#include <string>
#include <string_view>
#include <type_traits>

namespace thermocline::server::jinja {
namespace cat_internal {

template <typename T>
void Append(std::string* out, const T& v) {
  if constexpr (std::is_same_v<T, char>) {
    out->push_back(v);
  } else if constexpr (std::is_same_v<T, bool>) {
    out->append(v ? "true" : "false");
  } else if constexpr (std::is_integral_v<T>) {
    out->append(std::to_string(v));
  } else {
    out->append(std::string_view(v));
  }
}

}  // namespace cat_internal

template <typename... Args>
void CatTo(std::string* out, const Args&... args) {
  (cat_internal::Append(out, args), ...);
}

template <typename... Args>
std::string Cat(const Args&... args) {
  std::string out;
  CatTo(&out, args...);
  return out;
}

}  // namespace thermocline::server::jinja
