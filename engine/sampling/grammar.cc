// Compiling a GBNF syntax tree to the byte-level grammar the matcher runs: literals and
// character classes to byte sets (multi-byte characters through helper rules of UTF-8
// alternatives), groups and repetitions to helper rules, then the checks that need the whole
// grammar (undefined rules, start rule, left recursion) and the byte classes.
#include "engine/sampling/grammar.h"

#include <algorithm>
#include <map>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/sampling/grammar_parser.h"
#include "engine/sampling/utf8_ranges.h"
#include "engine/tokenizer/utf8.h"

namespace thermocline {

class GrammarCompiler {
 public:
  explicit GrammarCompiler(std::string_view text) : text_(text) {}

  absl::StatusOr<std::shared_ptr<const Grammar>> Compile(const std::vector<GbnfRule>& parsed,
                                                         std::string_view root) {
    for (const GbnfRule& r : parsed) {
      auto [it, inserted] = rule_ids_.emplace(r.name, static_cast<int32_t>(rules_.size()));
      if (!inserted) {
        return Error(r.offset, absl::StrCat("rule '", r.name, "' is defined twice (first at ",
                                            GbnfLocation(text_, rules_[it->second].offset), ")"));
      }
      rules_.push_back({r.name, {}, r.offset, /*repeat_helper=*/false});
    }
    for (const GbnfRule& r : parsed) {
      current_ = rule_ids_[r.name];
      helpers_of_current_ = 0;
      // The body's top-level alternatives become the rule's own alternatives.
      const bool alts = r.body.kind == GbnfExpr::Kind::kAlternatives;
      const std::vector<GbnfExpr> single = alts ? std::vector<GbnfExpr>{} : std::vector{r.body};
      for (const GbnfExpr& alt : alts ? r.body.children : single) {
        Seq seq;
        if (absl::Status s = Lower(alt, &seq); !s.ok()) return s;
        rules_[current_].alts.push_back(std::move(seq));
      }
    }
    auto root_it = rule_ids_.find(std::string(root));
    if (root_it == rule_ids_.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "grammar: there is no rule '", std::string(root), "' (the start rule) to begin with"));
    }
    if (absl::Status s = CheckLeftRecursion(); !s.ok()) return s;
    return Build(root_it->second);
  }

 private:
  using Sym = Grammar::Element;
  using Seq = std::vector<Sym>;
  struct Rule {
    std::string name;
    std::vector<Seq> alts;
    size_t offset;
    bool repeat_helper;  // made for a repetition (for the left-recursion message)
  };

  absl::Status Error(size_t offset, std::string_view message) const {
    return absl::InvalidArgumentError(
        absl::StrCat("grammar: ", GbnfLocation(text_, offset), ": ", AbslView(message)));
  }

  int32_t NewHelper(size_t offset, bool repeat) {
    const int32_t id = static_cast<int32_t>(rules_.size());
    rules_.push_back(
        {absl::StrCat(rules_[current_].name, "~", ++helpers_of_current_), {}, offset, repeat});
    return id;
  }

  Sym ByteSetSym(const Grammar::ByteSet& set) {
    auto [it, inserted] = set_ids_.emplace(set, static_cast<int32_t>(sets_.size()));
    if (inserted) sets_.push_back(set);
    return {Sym::kBytes, it->second};
  }

  static Grammar::ByteSet RangesToSet(const std::vector<ByteRange>& ranges) {
    Grammar::ByteSet set{};
    for (const ByteRange& r : ranges) {
      for (int b = r.lo; b <= r.hi; ++b) set[b >> 6] |= uint64_t{1} << (b & 63);
    }
    return set;
  }

  // A character class: one byte set when all its characters are ASCII, else a helper rule of
  // its UTF-8 alternatives (shared by every class with the same characters).
  Sym ClassSym(const GbnfExpr& e) {
    const std::vector<std::pair<char32_t, char32_t>> ranges =
        NormalizeCodePointRanges(e.ranges, e.negated);
    if (ranges.empty() || ranges.back().second < 0x80) {
      std::vector<ByteRange> bytes;
      for (const auto& [lo, hi] : ranges) {
        bytes.push_back({static_cast<uint8_t>(lo), static_cast<uint8_t>(hi)});
      }
      return ByteSetSym(RangesToSet(bytes));
    }
    auto it = class_rules_.find(ranges);
    if (it != class_rules_.end()) return {Sym::kRule, it->second};
    const int32_t rule = NewHelper(e.offset, /*repeat=*/false);
    class_rules_.emplace(ranges, rule);
    for (const Utf8Alternative& alt : Utf8Alternatives(ranges)) {
      Seq seq{ByteSetSym(RangesToSet(alt.first))};
      for (const ByteRange& r : alt.rest) seq.push_back(ByteSetSym(RangesToSet({r})));
      rules_[rule].alts.push_back(std::move(seq));
    }
    return {Sym::kRule, rule};
  }

  absl::Status Lower(const GbnfExpr& e, Seq* out) {
    switch (e.kind) {
      case GbnfExpr::Kind::kSequence:
        for (const GbnfExpr& child : e.children) {
          if (absl::Status s = Lower(child, out); !s.ok()) return s;
        }
        return absl::OkStatus();
      case GbnfExpr::Kind::kAlternatives: {
        const int32_t rule = NewHelper(e.offset, /*repeat=*/false);
        for (const GbnfExpr& child : e.children) {
          Seq seq;
          if (absl::Status s = Lower(child, &seq); !s.ok()) return s;
          rules_[rule].alts.push_back(std::move(seq));
        }
        out->push_back({Sym::kRule, rule});
        return absl::OkStatus();
      }
      case GbnfExpr::Kind::kLiteral: {
        std::string bytes;
        for (char32_t cp : e.text) AppendUtf8(cp, &bytes);
        for (char c : bytes) {
          const auto b = static_cast<uint8_t>(c);
          Grammar::ByteSet set{};
          set[b >> 6] = uint64_t{1} << (b & 63);
          out->push_back(ByteSetSym(set));
        }
        return absl::OkStatus();
      }
      case GbnfExpr::Kind::kCharClass:
        out->push_back(ClassSym(e));
        return absl::OkStatus();
      case GbnfExpr::Kind::kRuleRef: {
        auto it = rule_ids_.find(e.name);
        if (it == rule_ids_.end()) {
          return Error(e.offset, absl::StrCat("undefined rule '", e.name, "'"));
        }
        out->push_back({Sym::kRule, it->second});
        return absl::OkStatus();
      }
      case GbnfExpr::Kind::kRepeat:
        return LowerRepeat(e, out);
    }
    return absl::InternalError("grammar: unknown expression kind");
  }

  // item{min,max}: min copies of the item, then for no maximum a helper R ::= item R | "",
  // else a chain of max - min nested optional copies R_k ::= item R_(k-1) | "". The helper's
  // reference comes last in its alternative, so the matcher's stacks do not grow with it.
  absl::Status LowerRepeat(const GbnfExpr& e, Seq* out) {
    Seq item;
    if (absl::Status s = Lower(e.children[0], &item); !s.ok()) return s;
    for (int32_t i = 0; i < e.min; ++i) out->insert(out->end(), item.begin(), item.end());
    if (e.max < 0) {
      const int32_t rule = NewHelper(e.offset, /*repeat=*/true);
      Seq loop = item;
      loop.push_back({Sym::kRule, rule});
      rules_[rule].alts = {std::move(loop), Seq{}};
      out->push_back({Sym::kRule, rule});
    } else if (e.max > e.min) {
      int32_t prev = -1;
      for (int32_t k = 0; k < e.max - e.min; ++k) {
        const int32_t rule = NewHelper(e.offset, /*repeat=*/true);
        Seq once = item;
        if (prev >= 0) once.push_back({Sym::kRule, prev});
        rules_[rule].alts = {std::move(once), Seq{}};
        prev = rule;
      }
      out->push_back({Sym::kRule, prev});
    }
    return absl::OkStatus();
  }

  // A rule is left-recursive when it can reach itself through the leading part of an
  // alternative that can match the empty string; the matcher's expansion would never end.
  absl::Status CheckLeftRecursion() const {
    const size_t n = rules_.size();
    std::vector<bool> nullable(n, false);
    for (bool changed = true; changed;) {
      changed = false;
      for (size_t r = 0; r < n; ++r) {
        if (nullable[r]) continue;
        for (const Seq& alt : rules_[r].alts) {
          const bool all = std::all_of(alt.begin(), alt.end(), [&](const Sym& s) {
            return s.kind == Sym::kRule && nullable[s.value];
          });
          if (all) {
            nullable[r] = changed = true;
            break;
          }
        }
      }
    }
    std::vector<std::vector<int32_t>> left(n);
    for (size_t r = 0; r < n; ++r) {
      for (const Seq& alt : rules_[r].alts) {
        for (const Sym& s : alt) {
          if (s.kind != Sym::kRule) break;
          left[r].push_back(s.value);
          if (!nullable[s.value]) break;
        }
      }
    }
    // Depth-first search for a cycle; `path` holds the rules on the current branch.
    std::vector<uint8_t> state(n, 0);  // 0 new, 1 on the path, 2 done
    std::vector<std::pair<int32_t, size_t>> stack;
    std::vector<int32_t> path;
    for (size_t start = 0; start < n; ++start) {
      if (state[start] != 0) continue;
      stack.push_back({static_cast<int32_t>(start), 0});
      path.push_back(static_cast<int32_t>(start));
      state[start] = 1;
      while (!stack.empty()) {
        auto& [r, next] = stack.back();
        if (next == left[r].size()) {
          state[r] = 2;
          path.pop_back();
          stack.pop_back();
          continue;
        }
        const int32_t to = left[r][next++];
        if (state[to] == 1) return LeftRecursionError(path, to);
        if (state[to] == 0) {
          state[to] = 1;
          stack.push_back({to, 0});
          path.push_back(to);
        }
      }
    }
    return absl::OkStatus();
  }

  absl::Status LeftRecursionError(const std::vector<int32_t>& path, int32_t to) const {
    const auto from = std::find(path.begin(), path.end(), to);
    std::vector<std::string> names;
    for (auto it = from; it != path.end(); ++it) names.push_back(rules_[*it].name);
    names.push_back(rules_[to].name);
    // Report a repetition helper in the cycle as what it is; otherwise the first user rule.
    for (auto it = from; it != path.end(); ++it) {
      if (rules_[*it].repeat_helper) {
        return Error(rules_[*it].offset,
                     "this repeated item can match the empty string, so the repetition could "
                     "go on forever without matching anything (left recursion); make the item "
                     "non-empty");
      }
    }
    return Error(rules_[to].offset,
                 absl::StrCat("rule '", rules_[to].name, "' is left-recursive (",
                              absl::StrJoin(names, " -> "),
                              " without matching a character), which this engine does not "
                              "support; rewrite it with a repetition, e.g. "
                              "expr ::= term (\"+\" term)*"));
  }

  absl::StatusOr<std::shared_ptr<const Grammar>> Build(int32_t root) {
    std::shared_ptr<Grammar> g(new Grammar());
    g->root_ = root;
    for (Rule& rule : rules_) {
      std::vector<int32_t> starts;
      for (const Seq& alt : rule.alts) {
        starts.push_back(static_cast<int32_t>(g->elements_.size()));
        g->elements_.insert(g->elements_.end(), alt.begin(), alt.end());
        g->elements_.push_back({Sym::kEnd, 0});
      }
      g->rule_alts_.push_back(std::move(starts));
      g->rule_names_.push_back(std::move(rule.name));
    }
    g->byte_sets_ = sets_;

    // Byte classes: refine one class of all bytes by each byte set in turn.
    std::array<int32_t, 256> cls{};
    int32_t n_classes = 1;
    std::vector<int32_t> remap;
    for (const Grammar::ByteSet& set : sets_) {
      remap.assign(static_cast<size_t>(n_classes) * 2, -1);
      int32_t next = 0;
      for (int b = 0; b < 256; ++b) {
        const int in = static_cast<int>((set[b >> 6] >> (b & 63)) & 1);
        int32_t& to = remap[cls[b] * 2 + in];
        if (to < 0) to = next++;
        cls[b] = to;
      }
      n_classes = next;
    }
    g->num_classes_ = n_classes;
    g->class_rep_.assign(n_classes, 0);
    std::vector<bool> seen(n_classes, false);
    for (int b = 0; b < 256; ++b) {
      g->byte_class_[b] = static_cast<uint8_t>(cls[b]);
      if (!seen[cls[b]]) {
        seen[cls[b]] = true;
        g->class_rep_[cls[b]] = static_cast<uint8_t>(b);
      }
    }
    return std::shared_ptr<const Grammar>(std::move(g));
  }

  std::string_view text_;
  std::vector<Rule> rules_;
  absl::flat_hash_map<std::string, int32_t> rule_ids_;
  std::map<Grammar::ByteSet, int32_t> set_ids_;
  std::vector<Grammar::ByteSet> sets_;
  std::map<std::vector<std::pair<char32_t, char32_t>>, int32_t> class_rules_;
  int32_t current_ = 0;
  int helpers_of_current_ = 0;
};

absl::StatusOr<std::shared_ptr<const Grammar>> Grammar::FromGbnf(std::string_view text,
                                                                 std::string_view root) {
  absl::StatusOr<std::vector<GbnfRule>> parsed = ParseGbnf(text);
  if (!parsed.ok()) return parsed.status();
  return GrammarCompiler(text).Compile(*parsed, root);
}

}  // namespace thermocline
