// The schema compiler's objects (properties in order, optional ones skippable, extra keys that
// repeat no declared name) and arrays (items, prefixItems, minItems / maxItems).
#include <algorithm>

#include "absl/strings/str_join.h"
#include "server/json_schema_compiler.h"

namespace thermocline::server::schema_internal {

std::string SchemaCompiler::KeyNotIn(const std::vector<std::string>& names,
                                     const std::string& hint) {
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

absl::StatusOr<std::string> SchemaCompiler::Object(const Json& s, Keys& keys,
                                                   const std::string& path,
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
                                          "and '",
                                          name,
                                          "' is not (list it, or turn strict "
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
    members.push_back(
        b_.Add(absl::StrCat(hint, "-", names[i], "-kv"),
               GbnfSeq({GbnfLiteral(Dump(Json(names[i]))), ws, GbnfLiteral(":"), ws, *value, ws})));
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
    extra_member = b_.Add(hint + "-extra-kv",
                          GbnfSeq({KeyNotIn(names, hint), ws, GbnfLiteral(":"), ws, value, ws}));
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
      first = b_.Add(
          absl::StrCat(hint, "-from-", names[i]),
          first.empty() ? absl::StrCat("( ", here, " )?") : absl::StrCat(here, " | ", first));
    }
  }
  return b_.Add(hint, GbnfSeq({GbnfLiteral("{"), ws, first, GbnfLiteral("}")}));
}

absl::StatusOr<std::string> SchemaCompiler::Array(const Json& s, Keys& keys,
                                                  const std::string& path,
                                                  const std::string& hint) {
  absl::StatusOr<std::optional<int64_t>> min = Count(s, keys, "minItems", path);
  if (!min.ok()) return min.status();
  absl::StatusOr<std::optional<int64_t>> max = Count(s, keys, "maxItems", path);
  if (!max.ok()) return max.status();
  if (s.contains("uniqueItems") && s["uniqueItems"].is_boolean() && !s["uniqueItems"].get<bool>()) {
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
      const std::string list = GbnfSeq(
          {item, GbnfRepeat(GbnfSeq({comma, item}), std::max<int64_t>(0, tail_lo - 1), more_hi)});
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
}  // namespace thermocline::server::schema_internal
