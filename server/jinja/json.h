// JSON in and out of template values: FromJson turns request data (messages, tools) into
// values, keeping object key order; ToJson is Python's json.dumps as HF transformers' `tojson`
// filter calls it (ensure_ascii=False unless asked, optional indent and separators).
#pragma once

#include <optional>
#include <string>

#include "nlohmann/json.hpp"
#include "server/jinja/value.h"

namespace thermocline::server::jinja {

struct JsonOptions {
  bool ensure_ascii = false;
  std::optional<std::string> indent;          // the indent unit; nullopt: one line
  std::optional<std::string> item_separator;  // default ", " (one line) or "," (indented)
  std::optional<std::string> key_separator;   // default ": "
  bool sort_keys = false;
};

// Throws a render error for values JSON cannot hold (undefined, namespaces, macros).
std::string ToJson(const Value& v, const JsonOptions& options);

Value FromJson(const nlohmann::ordered_json& j);
Value FromJson(const nlohmann::json& j);

}  // namespace thermocline::server::jinja
