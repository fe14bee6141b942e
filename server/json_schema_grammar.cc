// JSON schema to GBNF: one rule per subschema (named after its path), written with
// GbnfBuilder; keywords are consumed as they are compiled and any left over is an error.
#include "server/json_schema_grammar.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/tokenizer/utf8.h"
#include "server/gbnf_builder.h"
#include "server/regex_grammar.h"

namespace thermocline::server {
namespace {

using Json = nlohmann::ordered_json;

// Keywords that say nothing about which values are valid.
const std::set<std::string> kAnnotations = {
    "title",    "description", "default",   "examples",    "$schema", "$id",
    "$comment", "deprecated",  "readOnly",  "writeOnly",   "$defs",   "definitions",
};

// The most a length or count bound may be: the grammar repeats its item that many times (the
// GBNF compiler's limit).
constexpr int64_t kMaxBound = 10000;

std::string Dump(const Json& v) {
  return v.dump(-1, ' ', false, nlohmann::detail::error_handler_t::replace);
}

// "~" and "/" escaped as a JSON pointer token.
std::string PointerToken(const std::string& key) {
  std::string out;
  for (char c : key) {
    if (c == '~') {
      out += "~0";
    } else if (c == '/') {
      out += "~1";
    } else {
      out.push_back(c);
    }
  }
  return out;
}

// Which keywords of one schema object have been compiled.
class Keys {
 public:
  explicit Keys(const Json& schema) {
    for (const auto& item : schema.items()) all_.push_back(item.key());
    for (const std::string& k : all_) {
      if (kAnnotations.count(k)) used_.insert(k);
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
  // `document` resolves $ref; `where` prefixes error locations (e.g. a tool's parameters);
  // `hint` prefixes rule names.
  SchemaCompiler(GbnfBuilder& b, const Json& document, const JsonGrammarOptions& options,
                 std::string where)
      : b_(b), document_(document), options_(options), where_(std::move(where)) {}

  absl::StatusOr<std::string> Visit(const Json& s, const std::string& path,
                                    const std::string& hint) {
    if (s.is_boolean()) {
      if (s.get<bool>()) return b_.Primitive("json-value");
      return Invalid(path, "the schema is false, so no value can match it");
    }
    if (!s.is_object()) return Invalid(path, "a schema must be an object or a boolean");
    if (++depth_ > kMaxDepth) return Invalid(path, "the schema nests too deeply");
    absl::StatusOr<std::string> out = VisitObject(s, path, hint);
    --depth_;
    return out;
  }

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
                                          const std::string& hint) {
    Keys keys(s);
    if (s.contains("$ref")) {
      keys.Use("$ref");
      if (absl::Status st = Finish(keys, path, " beside '$ref'"); !st.ok()) return st;
      return Ref(s["$ref"], path);
    }
    if (s.contains("const") || s.contains("enum")) return Enum(s, keys, path, hint);
    for (const char* key : {"anyOf", "oneOf"}) {
      if (!s.contains(key)) continue;
      keys.Use(key);
      const Json& branches = s[key];
      if (!branches.is_array() || branches.empty()) {
        return Invalid(path, absl::StrCat("'", key, "' must be a non-empty array of schemas"));
      }
      if (absl::Status st = Finish(keys, path, absl::StrCat(" beside '", key, "'")); !st.ok()) {
        return st;
      }
      std::vector<std::string> alts;
      for (size_t i = 0; i < branches.size(); ++i) {
        absl::StatusOr<std::string> alt = Visit(branches[i], absl::StrCat(path, "/", key, "/", i),
                                                absl::StrCat(hint, "-", i));
        if (!alt.ok()) return alt.status();
        alts.push_back(*alt);
      }
      return alts.size() == 1 ? alts[0] : b_.Add(hint, absl::StrJoin(alts, " | "));
    }
    if (s.contains("allOf")) {
      keys.Use("allOf");
      const Json& all = s["allOf"];
      if (!all.is_array() || all.size() != 1) {
        return Unsupported(path, "'allOf' with other than exactly one schema");
      }
      if (absl::Status st = Finish(keys, path, " beside 'allOf'"); !st.ok()) return st;
      return Visit(all[0], path + "/allOf/0", hint);
    }

    absl::StatusOr<std::vector<std::string>> types = Types(s, keys, path);
    if (!types.ok()) return types.status();
    if (types->empty()) {
      if (absl::Status st = Finish(keys, path, ""); !st.ok()) return st;
      return b_.Primitive("json-value");
    }
    std::vector<std::string> alts;
    for (const std::string& type : *types) {
      absl::StatusOr<std::string> alt = Typed(type, s, keys, path, types->size() == 1 ? hint : absl::StrCat(hint, "-", type));
      if (!alt.ok()) return alt.status();
      alts.push_back(*alt);
    }
    if (absl::Status st = Finish(keys, path, absl::StrCat(" with type ", absl::StrJoin(*types, ", ")));
        !st.ok()) {
      return st;
    }
    return alts.size() == 1 ? alts[0] : b_.Add(hint, absl::StrJoin(alts, " | "));
  }

  // The types `type` names, or those the keywords imply when it is absent (none: any value).
  absl::StatusOr<std::vector<std::string>> Types(const Json& s, Keys& keys,
                                                 const std::string& path) {
    static const std::set<std::string> kKnown = {"object",  "array",   "string", "number",
                                                 "integer", "boolean", "null"};
    std::vector<std::string> types;
    if (s.contains("type")) {
      keys.Use("type");
      const Json& t = s["type"];
      if (t.is_string()) {
        types.push_back(t.get<std::string>());
      } else if (t.is_array() && !t.empty()) {
        for (const Json& e : t) {
          if (!e.is_string()) return Invalid(path, "'type' must be a string or strings");
          types.push_back(e.get<std::string>());
        }
      } else {
        return Invalid(path, "'type' must be a string or a non-empty array of strings");
      }
      for (const std::string& type : types) {
        if (!kKnown.count(type)) return Invalid(path, absl::StrCat("unknown type '", type, "'"));
      }
      return types;
    }
    const auto any = [&](std::initializer_list<const char*> ks) {
      return std::any_of(ks.begin(), ks.end(), [&](const char* k) { return s.contains(k); });
    };
    if (any({"properties", "required", "additionalProperties"})) types.push_back("object");
    if (any({"items", "prefixItems", "minItems", "maxItems"})) types.push_back("array");
    if (any({"minLength", "maxLength", "pattern", "format"})) types.push_back("string");
    if (any({"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"})) {
      types.push_back("integer");  // bounds are supported on integers only
    }
    return types;
  }

  absl::StatusOr<std::string> Typed(const std::string& type, const Json& s, Keys& keys,
                                    const std::string& path, const std::string& hint) {
    if (type == "object") return Object(s, keys, path, hint);
    if (type == "array") return Array(s, keys, path, hint);
    if (type == "string") return String(s, keys, path, hint);
    if (type == "integer") return Integer(s, keys, path, hint);
    if (type == "number") {
      for (const char* k : {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}) {
        if (s.contains(k)) {
          return Unsupported(path, absl::StrCat("'", k, "' on type number (bounds work on ",
                                                "type integer)"));
        }
      }
      return b_.Primitive("json-number");
    }
    if (type == "boolean") return b_.Primitive("json-boolean");
    return b_.Primitive("json-null");
  }

  absl::StatusOr<std::string> Ref(const Json& ref, const std::string& path) {
    if (!ref.is_string()) return Invalid(path, "'$ref' must be a string");
    const std::string r = ref.get<std::string>();
    if (auto it = refs_.find(r); it != refs_.end()) return it->second;
    if (r.empty() || r[0] != '#') {
      return Unsupported(path, absl::StrCat("$ref '", r,
                                            "' (only references into this schema, starting "
                                            "with '#', can be resolved)"));
    }
    const Json* target = nullptr;
    try {
      target = &document_.at(Json::json_pointer(r.substr(1)));
    } catch (const Json::exception&) {
      return Invalid(path, absl::StrCat("$ref '", r, "' does not resolve in this schema"));
    }
    const size_t slash = r.rfind('/');
    const std::string name = b_.Reserve(
        absl::StrCat("ref-", slash == std::string::npos ? "root" : r.substr(slash + 1)));
    refs_[r] = name;
    absl::StatusOr<std::string> body = Visit(*target, r.substr(1), name);
    if (!body.ok()) return body.status();
    b_.Define(name, *body);
    return name;
  }

  absl::StatusOr<std::string> Enum(const Json& s, Keys& keys, const std::string& path,
                                   const std::string& hint) {
    std::vector<const Json*> values;
    if (s.contains("const")) {
      keys.Use("const");
      values.push_back(&s["const"]);
    } else {
      keys.Use("enum");
      if (!s["enum"].is_array() || s["enum"].empty()) {
        return Invalid(path, "'enum' must be a non-empty array");
      }
      for (const Json& v : s["enum"]) values.push_back(&v);
    }
    // A `type` beside them keeps the values of that type.
    std::optional<std::vector<std::string>> types;
    if (s.contains("type")) {
      absl::StatusOr<std::vector<std::string>> t = Types(s, keys, path);
      if (!t.ok()) return t.status();
      types = *t;
    }
    std::vector<std::string> alts;
    for (const Json* v : values) {
      if (types && std::none_of(types->begin(), types->end(),
                                [&](const std::string& t) { return HasType(*v, t); })) {
        continue;
      }
      alts.push_back(GbnfLiteral(Dump(*v)));
    }
    if (alts.empty()) return Invalid(path, "no value of 'enum' / 'const' has the schema's type");
    if (absl::Status st = Finish(keys, path, " beside 'enum' / 'const'"); !st.ok()) return st;
    return b_.Add(hint, absl::StrJoin(alts, " | "));
  }

  static bool HasType(const Json& v, const std::string& type) {
    if (type == "integer") {
      return v.is_number_integer() ||
             (v.is_number_float() && std::floor(v.get<double>()) == v.get<double>());
    }
    if (type == "number") return v.is_number();
    if (type == "string") return v.is_string();
    if (type == "boolean") return v.is_boolean();
    if (type == "null") return v.is_null();
    if (type == "object") return v.is_object();
    return v.is_array();
  }

  // A non-negative integer keyword, or nullopt when absent.
  absl::StatusOr<std::optional<int64_t>> Count(const Json& s, Keys& keys, const char* key,
                                               const std::string& path) {
    if (!s.contains(key)) return std::nullopt;
    keys.Use(key);
    const Json& v = s[key];
    if (!v.is_number_integer() || v.get<int64_t>() < 0) {
      return Invalid(path, absl::StrCat("'", key, "' must be a non-negative integer"));
    }
    if (v.get<int64_t>() > kMaxBound) {
      return Unsupported(path, absl::StrCat("'", key, "' above ", kMaxBound));
    }
    return v.get<int64_t>();
  }

  absl::StatusOr<std::string> String(const Json& s, Keys& keys, const std::string& path,
                                     const std::string& hint) {
    absl::StatusOr<std::optional<int64_t>> min = Count(s, keys, "minLength", path);
    if (!min.ok()) return min.status();
    absl::StatusOr<std::optional<int64_t>> max = Count(s, keys, "maxLength", path);
    if (!max.ok()) return max.status();
    if (*min && *max && **min > **max) return Invalid(path, "minLength is above maxLength");
    const bool lengths = min->has_value() || max->has_value();
    const std::string quote = GbnfLiteral("\"");
    if (s.contains("pattern")) {
      keys.Use("pattern");
      if (lengths || s.contains("format")) {
        return Unsupported(path, "'pattern' together with 'minLength', 'maxLength' or 'format'");
      }
      if (!s["pattern"].is_string()) return Invalid(path, "'pattern' must be a string");
      absl::StatusOr<std::string> content =
          RegexToJsonStringGbnf(s["pattern"].get<std::string>(), b_, hint);
      if (!content.ok()) {
        return absl::Status(content.status().code(),
                            absl::StrCat(content.status().message(), " (at ", where_, "#", path,
                                         "/pattern)"));
      }
      return b_.Add(hint, GbnfSeq({quote, *content, quote}));
    }
    if (s.contains("format")) {
      keys.Use("format");
      if (lengths) return Unsupported(path, "'format' together with 'minLength' or 'maxLength'");
      const std::string format = s["format"].is_string() ? s["format"].get<std::string>() : "";
      const std::string date =
          "[0-9]{4} \"-\" ( \"0\" [1-9] | \"1\" [0-2] ) \"-\" ( \"0\" [1-9] | [12] [0-9] | \"3\" "
          "[01] )";
      const std::string time =
          "( [01] [0-9] | \"2\" [0-3] ) \":\" [0-5] [0-9] \":\" [0-5] [0-9] ( \".\" [0-9]{1,9} )? "
          "( \"Z\" | [+-] ( [01] [0-9] | \"2\" [0-3] ) \":\" [0-5] [0-9] )";
      std::string body;
      if (format == "date") {
        body = date;
      } else if (format == "time") {
        body = time;
      } else if (format == "date-time") {
        body = GbnfSeq({b_.Add("format-date", date), "\"T\"", b_.Add("format-time", time)});
      } else if (format == "uuid") {
        body =
            "[0-9a-fA-F]{8} \"-\" [0-9a-fA-F]{4} \"-\" [0-9a-fA-F]{4} \"-\" [0-9a-fA-F]{4} \"-\" "
            "[0-9a-fA-F]{12}";
      } else {
        return Unsupported(path, absl::StrCat("format '",
                                              s["format"].is_string() ? format : Dump(s["format"]),
                                              "' (date, time, date-time and uuid are)"));
      }
      return b_.Add(absl::StrCat("format-", format), GbnfSeq({quote, b_.Add(hint + "-value", body), quote}));
    }
    if (!lengths) return b_.Primitive("json-string");
    return b_.Add(hint, GbnfSeq({quote, GbnfRepeat(b_.Primitive("json-char"), min->value_or(0), *max),
                             quote}));
  }

  // An integer bound from `value` (rounded inwards), `exclusive` moving it one further.
  static std::optional<int64_t> Bound(const Json& value, bool lower, bool exclusive) {
    double v;
    if (value.is_number_integer()) {
      const int64_t i = value.get<int64_t>();
      if (!exclusive) return i;
      if (lower ? i == INT64_MAX : i == INT64_MIN) return std::nullopt;
      return lower ? i + 1 : i - 1;
    }
    v = value.get<double>();
    double r = lower ? std::ceil(v) : std::floor(v);
    if (exclusive && r == v) r += lower ? 1 : -1;
    if (!(std::fabs(r) < 9.0e18)) return std::nullopt;
    return static_cast<int64_t>(r);
  }

  absl::StatusOr<std::string> Integer(const Json& s, Keys& keys, const std::string& path,
                                      const std::string& hint) {
    std::optional<int64_t> lo, hi;
    // minimum / maximum, and exclusiveMinimum / exclusiveMaximum as numbers (draft 6 on) or
    // as booleans that make minimum / maximum exclusive (draft 4).
    const auto flag = [&](const char* key) {
      return s.contains(key) && s[key].is_boolean() && s[key].get<bool>();
    };
    struct BoundKey {
      const char* key;
      bool lower;
      bool exclusive;
    };
    const BoundKey bound_keys[] = {
        {"minimum", true, flag("exclusiveMinimum")},
        {"exclusiveMinimum", true, true},
        {"maximum", false, flag("exclusiveMaximum")},
        {"exclusiveMaximum", false, true},
    };
    for (const BoundKey& k : bound_keys) {
      if (!s.contains(k.key)) continue;
      keys.Use(k.key);
      const Json& v = s[k.key];
      if (v.is_boolean() && k.exclusive) continue;  // the draft-4 flag, applied above
      if (!v.is_number()) return Invalid(path, absl::StrCat("'", k.key, "' must be a number"));
      const std::optional<int64_t> b = Bound(v, k.lower, k.exclusive);
      if (!b) return Unsupported(path, absl::StrCat("'", k.key, "' beyond the 64-bit integers"));
      if (k.lower) {
        lo = lo ? std::max(*lo, *b) : *b;
      } else {
        hi = hi ? std::min(*hi, *b) : *b;
      }
    }
    if (!lo && !hi) return b_.Primitive("json-integer");
    if (lo && hi && *lo > *hi) return Invalid(path, "no integer lies within the bounds");
    return b_.Add(hint, IntegerRangeGbnf(lo, hi));
  }

  // A JSON key (no escapes inside) that is none of `names`: a trie of the names' characters,
  // where the key may stop only off a name's end and may leave the trie at any character.
  std::string KeyNotIn(const std::vector<std::string>& names, const std::string& hint) {
    struct Node {
      std::map<char32_t, int> next;
      bool end = false;
    };
    std::vector<Node> trie(1);
    for (const std::string& name : names) {
      std::vector<char32_t> cps;
      bool writable = true;
      for (size_t i = 0; i < name.size();) {
        const Utf8Scan scan = ScanUtf8(name, i);
        if (scan.kind != Utf8Scan::kComplete || scan.codepoint < 0x20 || scan.codepoint == '"' ||
            scan.codepoint == '\\') {
          writable = false;  // a key without escapes can never equal this name
          break;
        }
        cps.push_back(scan.codepoint);
        i += scan.length;
      }
      if (!writable) continue;
      int n = 0;
      for (char32_t cp : cps) {
        auto it = trie[n].next.find(cp);
        if (it == trie[n].next.end()) {
          trie.emplace_back();
          it = trie[n].next.emplace(cp, static_cast<int>(trie.size()) - 1).first;
        }
        n = it->second;
      }
      trie[n].end = true;
    }
    const std::string quote = GbnfLiteral("\"");
    const std::string key_char = b_.Primitive("json-key-char");
    const std::string free = GbnfSeq({absl::StrCat("( ", key_char, " )*"), quote});
    std::vector<std::string> rule_names(trie.size());
    for (size_t n = 0; n < trie.size(); ++n) rule_names[n] = b_.Reserve(hint + "-extra-key");
    for (size_t n = 0; n < trie.size(); ++n) {
      std::vector<std::string> alts;
      if (!trie[n].end) alts.push_back(quote);
      std::string other = "[^\"\\\\\\x00-\\x1F";
      for (const auto& [cp, child] : trie[n].next) {
        std::string c;
        AppendUtf8(cp, &c);
        alts.push_back(GbnfSeq({GbnfLiteral(c), rule_names[child]}));
        other += GbnfClassChar(cp);
      }
      alts.push_back(GbnfSeq({other + "]", free}));
      b_.Define(rule_names[n], absl::StrJoin(alts, " | "));
    }
    return GbnfSeq({quote, rule_names[0]});
  }

  absl::StatusOr<std::string> Object(const Json& s, Keys& keys, const std::string& path,
                                     const std::string& hint) {
    keys.Use("properties");
    keys.Use("required");
    keys.Use("additionalProperties");
    static const Json kAny = true;
    std::vector<std::string> names;
    std::vector<const Json*> schemas;
    if (s.contains("properties")) {
      if (!s["properties"].is_object()) return Invalid(path, "'properties' must be an object");
      for (const auto& item : s["properties"].items()) {
        names.push_back(item.key());
        schemas.push_back(&item.value());
      }
    }
    std::set<std::string> required;
    if (s.contains("required")) {
      if (!s["required"].is_array()) return Invalid(path, "'required' must be an array");
      for (const Json& r : s["required"]) {
        if (!r.is_string()) return Invalid(path, "'required' must hold property names");
        const std::string name = r.get<std::string>();
        required.insert(name);
        if (std::find(names.begin(), names.end(), name) == names.end()) {
          names.push_back(name);  // required but not described: any value
          schemas.push_back(&kAny);
        }
      }
    }
    const Json* extra = s.contains("additionalProperties") ? &s["additionalProperties"] : nullptr;
    if (extra && !extra->is_boolean() && !extra->is_object()) {
      return Invalid(path, "'additionalProperties' must be a boolean or a schema");
    }
    const bool allow_extra = extra && !(extra->is_boolean() && !extra->get<bool>());
    if (options_.strict) {
      for (const std::string& name : names) {
        if (!required.count(name)) {
          return Invalid(path, absl::StrCat("strict mode needs every property in 'required', "
                                            "and '", name, "' is not (list it, or turn strict "
                                            "off)"));
        }
      }
      if (allow_extra) {
        return Invalid(path, "strict mode needs 'additionalProperties' to be false or absent");
      }
    }

    const std::string ws = b_.Primitive("ws");
    const std::string comma = GbnfSeq({GbnfLiteral(","), ws});
    std::vector<std::string> members;  // one rule per property: "name" : value
    for (size_t i = 0; i < names.size(); ++i) {
      absl::StatusOr<std::string> value =
          Visit(*schemas[i], absl::StrCat(path, "/properties/", PointerToken(names[i])),
                absl::StrCat(hint, "-", names[i]));
      if (!value.ok()) return value.status();
      members.push_back(b_.Add(absl::StrCat(hint, "-", names[i], "-kv"),
                               GbnfSeq({GbnfLiteral(Dump(Json(names[i]))), ws, GbnfLiteral(":"), ws,
                                    *value, ws})));
    }
    std::string extra_member;
    if (allow_extra) {
      std::string value = b_.Primitive("json-value");
      if (extra->is_object()) {
        absl::StatusOr<std::string> v =
            Visit(*extra, path + "/additionalProperties", hint + "-extra");
        if (!v.ok()) return v.status();
        value = *v;
      }
      extra_member = b_.Add(hint + "-extra-kv", GbnfSeq({KeyNotIn(names, hint), ws, GbnfLiteral(":"),
                                                     ws, value, ws}));
    }

    // Properties in order, the optional ones skippable, commas only between written ones;
    // other properties (when allowed) after them.
    const size_t n = names.size();
    const auto is_req = [&](size_t i) { return required.count(names[i]) > 0; };
    // after[i]: what may follow once something was written, from property i on.
    std::vector<std::string> after(n + 1);
    after[n] = allow_extra ? GbnfRepeat(GbnfSeq({comma, extra_member}), 0, std::nullopt) : "";
    for (size_t i = n; i-- > 0;) {
      const std::string one = GbnfSeq({comma, members[i]});
      after[i] = GbnfSeq({is_req(i) ? one : absl::StrCat("( ", one, " )?"), after[i + 1]});
    }
    // first: the members from property i on when nothing was written yet.
    std::string first =
        allow_extra ? absl::StrCat("( ", GbnfSeq({extra_member, after[n]}), " )?") : "";
    for (size_t i = n; i-- > 0;) {
      const std::string here = GbnfSeq({members[i], after[i + 1]});
      if (is_req(i)) {
        first = here;
      } else {
        first = b_.Add(absl::StrCat(hint, "-from-", names[i]),
                       first.empty() ? absl::StrCat("( ", here, " )?")
                                     : absl::StrCat(here, " | ", first));
      }
    }
    return b_.Add(hint, GbnfSeq({GbnfLiteral("{"), ws, first, GbnfLiteral("}")}));
  }

  absl::StatusOr<std::string> Array(const Json& s, Keys& keys, const std::string& path,
                                    const std::string& hint) {
    absl::StatusOr<std::optional<int64_t>> min = Count(s, keys, "minItems", path);
    if (!min.ok()) return min.status();
    absl::StatusOr<std::optional<int64_t>> max = Count(s, keys, "maxItems", path);
    if (!max.ok()) return max.status();
    if (s.contains("uniqueItems") && s["uniqueItems"].is_boolean() &&
        !s["uniqueItems"].get<bool>()) {
      keys.Use("uniqueItems");  // false asks for nothing
    }
    std::vector<std::string> prefix;
    if (s.contains("prefixItems")) {
      keys.Use("prefixItems");
      const Json& p = s["prefixItems"];
      if (!p.is_array()) return Invalid(path, "'prefixItems' must be an array of schemas");
      for (size_t i = 0; i < p.size(); ++i) {
        absl::StatusOr<std::string> item =
            Visit(p[i], absl::StrCat(path, "/prefixItems/", i), absl::StrCat(hint, "-", i));
        if (!item.ok()) return item.status();
        prefix.push_back(*item);
      }
    }
    std::optional<std::string> tail;  // the schema of the items after the prefix
    if (s.contains("items")) {
      keys.Use("items");
      const Json& items = s["items"];
      if (items.is_array()) {
        return Unsupported(path, "'items' as an array (draft-4 tuples; use 'prefixItems')");
      }
      if (!(items.is_boolean() && !items.get<bool>())) {
        absl::StatusOr<std::string> item = Visit(items, path + "/items", hint + "-item");
        if (!item.ok()) return item.status();
        tail = *item;
      }
    } else if (prefix.empty() || (*min && **min > static_cast<int64_t>(prefix.size()))) {
      tail = b_.Primitive("json-value");
    }
    const int64_t lo = min->value_or(0);
    if (*max && lo > **max) return Invalid(path, "minItems is above maxItems");
    const int64_t k = *max ? std::min<int64_t>(prefix.size(), **max) : prefix.size();
    if (!tail && lo > k) {
      return Invalid(path, "minItems asks for more items than 'prefixItems' allows");
    }

    const std::string ws = b_.Primitive("ws");
    const std::string comma = GbnfSeq({GbnfLiteral(","), ws});
    // The items after the prefix: tail_lo..tail_hi of them.
    std::string rest;
    if (tail && (!*max || **max > k)) {
      const int64_t tail_lo = std::max<int64_t>(0, lo - k);
      std::optional<int64_t> tail_hi;
      if (*max) tail_hi = **max - k;
      const std::string item = GbnfSeq({*tail, ws});
      if (k > 0) {
        rest = GbnfRepeat(GbnfSeq({comma, item}), tail_lo, tail_hi);
      } else {
        const std::optional<int64_t> more_hi =
            tail_hi ? std::optional<int64_t>(*tail_hi - 1) : std::nullopt;
        const std::string list =
            GbnfSeq({item, GbnfRepeat(GbnfSeq({comma, item}), std::max<int64_t>(0, tail_lo - 1), more_hi)});
        rest = tail_lo >= 1 ? list : absl::StrCat("( ", list, " )?");
      }
    }
    // The prefix items from the back, optional from index lo on.
    for (int64_t i = k; i-- > 0;) {
      const std::string here = GbnfSeq({i == 0 ? "" : comma, prefix[i], ws, rest});
      rest = i >= lo ? absl::StrCat("( ", here, " )?") : here;
    }
    return b_.Add(hint, GbnfSeq({GbnfLiteral("["), ws, rest, GbnfLiteral("]")}));
  }

  GbnfBuilder& b_;
  const Json& document_;
  const JsonGrammarOptions& options_;
  const std::string where_;
  std::map<std::string, std::string> refs_;
  int depth_ = 0;
};

}  // namespace

absl::StatusOr<std::string> JsonSchemaToGbnf(const nlohmann::ordered_json& schema,
                                             const JsonGrammarOptions& options) {
  GbnfBuilder b(options.compact);
  SchemaCompiler compiler(b, schema, options, "");
  absl::StatusOr<std::string> root = compiler.Visit(schema, "", "root");
  if (!root.ok()) return root.status();
  return b.Text(*root);
}

absl::StatusOr<std::string> JsonSchemaTextToGbnf(std::string_view schema_json,
                                                 const JsonGrammarOptions& options) {
  const Json schema = Json::parse(schema_json, nullptr, /*allow_exceptions=*/false);
  if (schema.is_discarded()) {
    return absl::InvalidArgumentError("json_schema: the schema is not valid JSON");
  }
  return JsonSchemaToGbnf(schema, options);
}

std::string JsonObjectGbnf(const JsonGrammarOptions& options) {
  GbnfBuilder b(options.compact);
  return b.Text(b.Primitive("json-object"));
}

absl::StatusOr<std::string> ToolCallGbnf(const nlohmann::ordered_json& tools,
                                         const ToolCallGrammarOptions& options) {
  if (!tools.is_array() || tools.empty()) {
    return absl::InvalidArgumentError("tools: must be a non-empty array of functions");
  }
  GbnfBuilder b(options.json.compact);
  const std::string ws = b.Primitive("ws");
  static const Json kNoParameters = {{"type", "object"}, {"properties", Json::object()}};
  std::vector<std::string> calls;
  std::set<std::string> seen;
  for (size_t i = 0; i < tools.size(); ++i) {
    const std::string where = absl::StrCat("tools[", i, "]");
    const Json& tool = tools[i];
    if (!tool.is_object() || tool.value("type", "") != "function" || !tool.contains("function") ||
        !tool["function"].is_object()) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": must be {\"type\": \"function\", \"function\": {...}}"));
    }
    const Json& fn = tool["function"];
    if (!fn.contains("name") || !fn["name"].is_string() || fn["name"].get<std::string>().empty()) {
      return absl::InvalidArgumentError(absl::StrCat(where, ".function.name: must be a non-empty string"));
    }
    const std::string name = fn["name"].get<std::string>();
    if (!options.only.empty() &&
        std::find(options.only.begin(), options.only.end(), name) == options.only.end()) {
      continue;
    }
    seen.insert(name);
    const Json& params = fn.contains("parameters") ? fn["parameters"] : kNoParameters;
    JsonGrammarOptions json = options.json;
    if (fn.contains("strict") && fn["strict"].is_boolean() && fn["strict"].get<bool>()) {
      json.strict = true;
    }
    SchemaCompiler compiler(b, params, json, where + ".function.parameters");
    absl::StatusOr<std::string> args =
        compiler.Visit(params, "", absl::StrCat("tool-", name, "-args"));
    if (!args.ok()) return args.status();
    calls.push_back(b.Add(
        absl::StrCat("tool-", name),
        GbnfSeq({GbnfLiteral("{"), ws, GbnfLiteral("\"name\""), ws, GbnfLiteral(":"), ws,
             GbnfLiteral(Dump(Json(name))), ws, GbnfLiteral(","), ws,
             GbnfLiteral(Dump(Json(options.arguments_key))), ws, GbnfLiteral(":"), ws, *args, ws,
             GbnfLiteral("}")})));
  }
  for (const std::string& name : options.only) {
    if (!seen.count(name)) {
      return absl::InvalidArgumentError(
          absl::StrCat("tool_choice: function '", name, "' is not among the tools"));
    }
  }
  const std::string call = b.Add(
      "tool-call", GbnfSeq({options.prefix.empty() ? "" : GbnfLiteral(options.prefix),
                        absl::StrCat("( ", absl::StrJoin(calls, " | "), " )"),
                        options.suffix.empty() ? "" : GbnfLiteral(options.suffix)}));
  if (!options.parallel) return b.Text(call);
  return b.Text(GbnfSeq({call, GbnfRepeat(GbnfSeq({GbnfLiteral(options.separator), call}), 0, std::nullopt)}));
}

}  // namespace thermocline::server
