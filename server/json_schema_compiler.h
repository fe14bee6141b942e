// The JSON-schema compiler behind json_schema_grammar.h: a SchemaCompiler per schema document
// writes one rule per subschema (named after its path) into a shared GbnfBuilder; keywords are
// marked as they are compiled (Keys) and any left over is an error. Scalars, $ref and the
// combinators are compiled in json_schema_compiler.cc, objects and arrays in
// json_schema_containers.cc.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "engine/tokenizer/utf8.h"
#include "server/gbnf_builder.h"
#include "server/json_schema_grammar.h"

namespace thermocline::server::schema_internal {

using Json = nlohmann::ordered_json;

// The most a length or count bound may be: the grammar repeats its item that many times (the
// GBNF compiler's limit).
inline constexpr int64_t kMaxBound = 10000;

// Compact JSON text (invalid UTF-8 replaced).
std::string Dump(const Json& v);
// "~" and "/" escaped as a JSON pointer token.
std::string PointerToken(const std::string& key);
// Keywords that say nothing about which values are valid (title, description, ...).
bool IsAnnotation(const std::string& key);

// Which keywords of one schema object have been compiled.
class Keys {
 public:
  explicit Keys(const Json& schema) {
    for (const auto& item : schema.items()) all_.push_back(item.key());
    for (const std::string& k : all_) {
      if (IsAnnotation(k)) used_.insert(k);
    }
  }
  void Use(const std::string& key) { used_.insert(key); }
  // The first keyword not compiled, or "".
  std::string Unused() const {
    for (const std::string& k : all_) {
      if (!used_.count(k)) return k;
    }
    return "";
  }

 private:
  std::vector<std::string> all_;
  std::set<std::string> used_;
};

class SchemaCompiler {
 public:
  // `document` resolves $ref; `where` prefixes error locations (e.g. a tool's parameters).
  SchemaCompiler(GbnfBuilder& b, const Json& document, const JsonGrammarOptions& options,
                 std::string where)
      : b_(b), document_(document), options_(options), where_(std::move(where)) {}

  // A GBNF expression (usually a rule name) for the values `s` allows; `path` is its JSON
  // pointer for error messages, `hint` names its rules.
  absl::StatusOr<std::string> Visit(const Json& s, const std::string& path,
                                    const std::string& hint);

 private:
  static constexpr int kMaxDepth = 64;

  absl::Status Invalid(const std::string& path, std::string_view message) const {
    return absl::InvalidArgumentError(
        absl::StrCat("json_schema: ", AbslView(message), " (at ", where_, "#", path, ")"));
  }
  absl::Status Unsupported(const std::string& path, std::string_view what) const {
    return absl::UnimplementedError(absl::StrCat("json_schema: ", AbslView(what), " (at ", where_,
                                                 "#", path, ") is not supported"));
  }
  // Everything compiled, or the first keyword that was not.
  absl::Status Finish(const Keys& keys, const std::string& path, std::string_view context) const {
    const std::string unused = keys.Unused();
    if (unused.empty()) return absl::OkStatus();
    return Unsupported(path, absl::StrCat("keyword '", unused, "'", AbslView(context)));
  }

  absl::StatusOr<std::string> VisitObject(const Json& s, const std::string& path,
                                          const std::string& hint);

  // The types `type` names, or those the keywords imply when it is absent (none: any value).
  absl::StatusOr<std::vector<std::string>> Types(const Json& s, Keys& keys,
                                                 const std::string& path);

  absl::StatusOr<std::string> Typed(const std::string& type, const Json& s, Keys& keys,
                                    const std::string& path, const std::string& hint);

  absl::StatusOr<std::string> Ref(const Json& ref, const std::string& path);

  absl::StatusOr<std::string> Enum(const Json& s, Keys& keys, const std::string& path,
                                   const std::string& hint);

  static bool HasType(const Json& v, const std::string& type);

  // A non-negative integer keyword, or nullopt when absent.
  absl::StatusOr<std::optional<int64_t>> Count(const Json& s, Keys& keys, const char* key,
                                               const std::string& path);

  absl::StatusOr<std::string> String(const Json& s, Keys& keys, const std::string& path,
                                     const std::string& hint);

  // An integer bound from `value` (rounded inwards), `exclusive` moving it one further.
  static std::optional<int64_t> Bound(const Json& value, bool lower, bool exclusive);

  absl::StatusOr<std::string> Integer(const Json& s, Keys& keys, const std::string& path,
                                      const std::string& hint);

  // A JSON key (no escapes inside) that is none of `names`: a trie of the names' characters,
  // where the key may stop only off a name's end and may leave the trie at any character.
  std::string KeyNotIn(const std::vector<std::string>& names, const std::string& hint);

  absl::StatusOr<std::string> Object(const Json& s, Keys& keys, const std::string& path,
                                     const std::string& hint);

  absl::StatusOr<std::string> Array(const Json& s, Keys& keys, const std::string& path,
                                    const std::string& hint);

  GbnfBuilder& b_;
  const Json& document_;
  const JsonGrammarOptions& options_;
  const std::string where_;
  std::map<std::string, std::string> refs_;
  int depth_ = 0;
};

}  // namespace thermocline::server::schema_internal
