// The schema compiler's dispatch ($ref, enum / const, anyOf / oneOf / allOf, type) and the
// scalar types: strings (lengths, pattern, format), integers with bounds, the rest.
#include "server/json_schema_compiler.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_join.h"
#include "server/regex_grammar.h"

namespace thermocline::server::schema_internal {

std::string Dump(const Json& v) {
  return v.dump(-1, ' ', false, nlohmann::detail::error_handler_t::replace);
}

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

bool IsAnnotation(const std::string& key) {
  static const std::set<std::string> kAnnotations = {
      "title",    "description", "default",  "examples",  "$schema", "$id",
      "$comment", "deprecated",  "readOnly", "writeOnly", "$defs",   "definitions",
  };
  return kAnnotations.count(key) > 0;
}

absl::StatusOr<std::string> SchemaCompiler::Visit(const Json& s, const std::string& path,
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

absl::StatusOr<std::string> SchemaCompiler::VisitObject(const Json& s, const std::string& path,
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
      absl::StatusOr<std::string> alt =
          Visit(branches[i], absl::StrCat(path, "/", key, "/", i), absl::StrCat(hint, "-", i));
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
    absl::StatusOr<std::string> alt =
        Typed(type, s, keys, path, types->size() == 1 ? hint : absl::StrCat(hint, "-", type));
    if (!alt.ok()) return alt.status();
    alts.push_back(*alt);
  }
  if (absl::Status st =
          Finish(keys, path, absl::StrCat(" with type ", absl::StrJoin(*types, ", ")));
      !st.ok()) {
    return st;
  }
  return alts.size() == 1 ? alts[0] : b_.Add(hint, absl::StrJoin(alts, " | "));
}

absl::StatusOr<std::vector<std::string>> SchemaCompiler::Types(const Json& s, Keys& keys,
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

absl::StatusOr<std::string> SchemaCompiler::Typed(const std::string& type, const Json& s,
                                                  Keys& keys, const std::string& path,
                                                  const std::string& hint) {
  if (type == "object") return Object(s, keys, path, hint);
  if (type == "array") return Array(s, keys, path, hint);
  if (type == "string") return String(s, keys, path, hint);
  if (type == "integer") return Integer(s, keys, path, hint);
  if (type == "number") {
    for (const char* k : {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}) {
      if (s.contains(k)) {
        return Unsupported(
            path, absl::StrCat("'", k, "' on type number (bounds work on ", "type integer)"));
      }
    }
    return b_.Primitive("json-number");
  }
  if (type == "boolean") return b_.Primitive("json-boolean");
  return b_.Primitive("json-null");
}

absl::StatusOr<std::string> SchemaCompiler::Ref(const Json& ref, const std::string& path) {
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
  const std::string name =
      b_.Reserve(absl::StrCat("ref-", slash == std::string::npos ? "root" : r.substr(slash + 1)));
  refs_[r] = name;
  absl::StatusOr<std::string> body = Visit(*target, r.substr(1), name);
  if (!body.ok()) return body.status();
  b_.Define(name, *body);
  return name;
}

absl::StatusOr<std::string> SchemaCompiler::Enum(const Json& s, Keys& keys, const std::string& path,
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

bool SchemaCompiler::HasType(const Json& v, const std::string& type) {
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

absl::StatusOr<std::optional<int64_t>> SchemaCompiler::Count(const Json& s, Keys& keys,
                                                             const char* key,
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

absl::StatusOr<std::string> SchemaCompiler::String(const Json& s, Keys& keys,
                                                   const std::string& path,
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
      return absl::Status(content.status().code(), absl::StrCat(content.status().message(), " (at ",
                                                                where_, "#", path, "/pattern)"));
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
      return Unsupported(
          path, absl::StrCat("format '", s["format"].is_string() ? format : Dump(s["format"]),
                             "' (date, time, date-time and uuid are)"));
    }
    return b_.Add(absl::StrCat("format-", format),
                  GbnfSeq({quote, b_.Add(hint + "-value", body), quote}));
  }
  if (!lengths) return b_.Primitive("json-string");
  return b_.Add(
      hint, GbnfSeq({quote, GbnfRepeat(b_.Primitive("json-char"), min->value_or(0), *max), quote}));
}

std::optional<int64_t> SchemaCompiler::Bound(const Json& value, bool lower, bool exclusive) {
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

absl::StatusOr<std::string> SchemaCompiler::Integer(const Json& s, Keys& keys,
                                                    const std::string& path,
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
}  // namespace thermocline::server::schema_internal
