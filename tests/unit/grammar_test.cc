// GBNF grammars: the parser's accepts and rejects (with line:column), the compiled grammar's
// language (exact strings, UTF-8, repetition bounds, and every short string against std::regex
// or a hand-written recognizer), and UTF-8 range compilation against every code point.
#include "engine/sampling/grammar.h"

#include <catch2/catch.hpp>
#include <functional>
#include <regex>
#include <string>
#include <vector>

#include "engine/sampling/grammar_matcher.h"
#include "engine/sampling/token_trie.h"
#include "engine/sampling/utf8_ranges.h"
#include "engine/tokenizer/utf8.h"

namespace thermocline {
namespace {

std::shared_ptr<const Grammar> MustCompile(std::string_view gbnf) {
  absl::StatusOr<std::shared_ptr<const Grammar>> g = Grammar::FromGbnf(gbnf);
  INFO(gbnf << "\n-> " << g.status().ToString());
  REQUIRE(g.ok());
  return *g;
}

std::string CompileError(std::string_view gbnf) {
  absl::StatusOr<std::shared_ptr<const Grammar>> g = Grammar::FromGbnf(gbnf);
  INFO(gbnf);
  REQUIRE_FALSE(g.ok());
  CHECK(g.status().code() == absl::StatusCode::kInvalidArgument);
  return std::string(g.status().message());
}

std::shared_ptr<const TokenTrie> NoTokens() { return TokenTrie::FromPieces({}, {}); }

// Recognizes strings with one matcher, reset between strings.
class Recognizer {
 public:
  explicit Recognizer(std::string_view gbnf) : m_(MustCompile(gbnf), NoTokens()) {}
  bool Matches(std::string_view s) {
    m_.Reset();
    return m_.AcceptBytes(s) && m_.CanEnd();
  }
  bool IsPrefix(std::string_view s) {
    m_.Reset();
    return m_.AcceptBytes(s);
  }

 private:
  GrammarMatcher m_;
};

// Every string over `alphabet` of length <= max_len.
std::vector<std::string> AllStrings(std::string_view alphabet, int max_len) {
  std::vector<std::string> out = {""};
  for (size_t begin = 0, len = 0; len < static_cast<size_t>(max_len); ++len) {
    const size_t end = out.size();
    for (size_t i = begin; i < end; ++i) {
      for (char c : alphabet) out.push_back(out[i] + c);
    }
    begin = end;
  }
  return out;
}

TEST_CASE("GBNF: the parser accepts the syntax llama.cpp grammars use", "[grammar]") {
  const char* grammars[] = {
      "root ::= \"a\"",
      "root ::= \"a\" | \"b\" | \"\"",
      "root ::= ( \"a\" | )",
      "# a comment line\nroot ::= x # trailing comment\nx ::= [a-z]+\n\n",
      "root ::= \"a\"\r\nb ::= \"c\"\r\n",
      "root ::= (\n  \"a\"\n  # inside a group\n  | \"b\"\n)\n",
      "root ::=\n  \"a\"\n  | \"b\"\n",
      "root ::= [^\\n\\\\\"] . [\\x00-\\x1F\\u00e9\\U0001F600] [\\]\\-\\[]",
      "root ::= \"x\"? \"y\"* \"z\"+ \"w\"{2} \"v\"{2,} \"u\"{1,3} \"t\"{ 0 , 2 }",
      "root ::= (\"a\" \"b\")+?",
      "expr ::= term ((\"+\" | \"-\") term)*\nterm ::= [0-9]+\nroot ::= expr",
      "root ::= my-rule_2\nmy-rule_2 ::= \"é\" \"😀\"",
      "root ::= []",
  };
  for (const char* g : grammars) MustCompile(g);
}

TEST_CASE("GBNF: bad grammars are refused with the line and column at fault", "[grammar]") {
  CHECK(CompileError("root ::= \"abc") ==
        "grammar: 1:10: unterminated string literal (missing '\"')");
  CHECK(CompileError("root \"a\"") ==
        "grammar: 1:6: expected '::=' after the rule name 'root', "
        "found '\"'");
  CHECK(CompileError("root ::= \"a\"\nx ::= [a-") ==
        "grammar: 2:7: unterminated character class (missing ']')");
  CHECK(CompileError("root ::= \"\\q\"") == "grammar: 1:11: unknown escape '\\q'");
  CHECK(CompileError("root ::= \"\\x4\"") == "grammar: 1:11: escape '\\x' needs 2 hex digits");
  CHECK(CompileError("root ::= [z-a]") ==
        "grammar: 1:11: character range is reversed (its end is below its start)");
  CHECK(CompileError("root ::= (\"a\" | \"b\"") ==
        "grammar: 1:20: expected ')' to close the group opened at 1:10, found the end of the "
        "grammar");
  CHECK(CompileError("root ::= \"a\")") ==
        "grammar: 1:13: expected the end of the line after rule 'root', found an unmatched ')'");
  CHECK(CompileError("root ::= * \"a\"") == "grammar: 1:10: '*' has nothing to repeat");
  CHECK(CompileError("root ::= \"a\"{3,1}") ==
        "grammar: 1:13: repetition {3,1} has its maximum below its minimum");
  CHECK(CompileError("root ::= \"a\"{20000}").find("repetition bound above 10000") !=
        std::string::npos);
  CHECK(CompileError("root ::= \"a\"{2") ==
        "grammar: 1:15: expected '}' to close the repetition, found the end of the grammar");
  CHECK(CompileError("root ::= <|im_end|>") ==
        "grammar: 1:10: token references (<...>) are not supported");
  CHECK(CompileError("root ::= \"a\" b ::= \"b\"") ==
        "grammar: 1:14: rule 'b' starts in the middle of a line: put each rule on its own line");
  CHECK(CompileError("root ::= \"a\" @") == "grammar: 1:14: unexpected '@'");
  CHECK(CompileError("root ::= \"\xff\"") == "grammar: 1:11: the grammar is not valid UTF-8");
  // Whole-grammar checks.
  CHECK(CompileError("root ::= \"a\"\n  item ::= \"b\"\nroot ::= \"c\"") ==
        "grammar: 3:1: rule 'root' is defined twice (first at 1:1)");
  CHECK(CompileError("root ::= \"a\" missing") == "grammar: 1:14: undefined rule 'missing'");
  CHECK(CompileError("start ::= \"a\"") ==
        "grammar: there is no rule 'root' (the start rule) to begin with");
  CHECK(CompileError("root ::= root \"a\" | \"b\"")
            .find("grammar: 1:1: rule 'root' is left-recursive (root -> root without matching a "
                  "character)") == 0);
  // Indirect, through a rule that can match nothing.
  CHECK(CompileError("root ::= a\na ::= b \"x\"\nb ::= \"\" | a")
            .find("rule 'a' is left-recursive (a -> b -> a") != std::string::npos);
  CHECK(CompileError("root ::= (\"a\"?)*") ==
        "grammar: 1:10: this repeated item can match the empty string, so the repetition could "
        "go on forever without matching anything (left recursion); make the item non-empty");
  // Right recursion and recursion after a character are fine.
  MustCompile("root ::= \"a\" root | \"\"");
  MustCompile("root ::= \"(\" root \")\" root | \"\"");
  // Another start rule can be named.
  CHECK(Grammar::FromGbnf("start ::= \"a\"", "start").ok());
}

TEST_CASE("GBNF: literals, classes and escapes match exactly their strings", "[grammar]") {
  Recognizer lit("root ::= \"\\x41\\u00e9\\n\\t\\\"\\\\\" \"\"");
  CHECK(lit.Matches("A\xC3\xA9\n\t\"\\"));
  CHECK_FALSE(lit.Matches("A\xC3\xA9\n\t\""));
  CHECK_FALSE(lit.Matches("A\xC3\xA9\n\t\"\\x"));

  Recognizer cls("root ::= [\\]\\-\\\\a-c]");
  for (const char* s : {"]", "-", "\\", "a", "b", "c"}) CHECK(cls.Matches(s));
  for (const char* s : {"d", "[", "", "ab"}) CHECK_FALSE(cls.Matches(s));

  Recognizer neg("root ::= [^\"\\\\]*");
  CHECK(neg.Matches("h\xC3\xA9llo world"));
  CHECK(neg.Matches(""));
  CHECK_FALSE(neg.Matches("a\"b"));
  CHECK_FALSE(neg.Matches("a\\"));
  CHECK_FALSE(neg.Matches("\xC3"));  // half a character is a prefix, not a sentence
  CHECK(neg.IsPrefix("\xC3"));
}

TEST_CASE("GBNF: UTF-8 classes and '.' take whole, well-formed characters", "[grammar]") {
  Recognizer greek("root ::= [α-ω]+ \"!\"");  // U+03B1 .. U+03C9
  CHECK(greek.Matches("\xCE\xB1\xCE\xB2!"));  // αβ!
  CHECK(greek.Matches("\xCF\x89!"));          // ω!
  CHECK_FALSE(greek.Matches("a!"));
  CHECK_FALSE(greek.Matches("\xCE\xB0!"));  // U+03B0, just below α
  CHECK_FALSE(greek.Matches("\xCF\x8A!"));  // U+03CA, just above ω
  CHECK(greek.IsPrefix("\xCE"));
  CHECK_FALSE(greek.IsPrefix("\xCE\x80"));  // U+0380 is outside the class
  CHECK_FALSE(greek.IsPrefix("\xC3"));      // no character of the class starts with C3

  Recognizer any("root ::= .");
  CHECK(any.Matches("\xF0\x9F\x98\x80"));  // U+1F600
  CHECK(any.Matches("\xF4\x8F\xBF\xBF"));  // U+10FFFF
  CHECK(any.Matches("\n"));
  CHECK(any.Matches("\xEF\xBF\xBD"));
  CHECK_FALSE(any.IsPrefix("\xED\xA0"));  // a surrogate
  CHECK_FALSE(any.IsPrefix("\xC0"));      // overlong
  CHECK_FALSE(any.IsPrefix("\xE0\x80"));  // overlong
  CHECK_FALSE(any.IsPrefix("\xF4\x90"));  // above U+10FFFF
  CHECK_FALSE(any.IsPrefix("\xFF"));
  CHECK_FALSE(any.IsPrefix("\x80"));         // a lone continuation byte
  CHECK_FALSE(any.Matches("\xF0\x9F\x98"));  // cut short

  Recognizer not_e("root ::= [^é]");
  CHECK(not_e.Matches("e"));
  CHECK(not_e.Matches("\xC3\xA8"));  // è
  CHECK_FALSE(not_e.Matches("\xC3\xA9"));
}

TEST_CASE("GBNF: repetition bounds are exact", "[grammar]") {
  const auto count_a = [](const char* gbnf, std::vector<int> accepted) {
    Recognizer r(gbnf);
    for (int n = 0; n <= 8; ++n) {
      const bool want = std::find(accepted.begin(), accepted.end(), n) != accepted.end();
      INFO(gbnf << " with " << n << " repeats");
      CHECK(r.Matches(std::string(n, 'a') + "b") == want);
    }
  };
  count_a("root ::= \"a\"{3} \"b\"", {3});
  count_a("root ::= \"a\"{2,} \"b\"", {2, 3, 4, 5, 6, 7, 8});
  count_a("root ::= \"a\"{2,4} \"b\"", {2, 3, 4});
  count_a("root ::= \"a\"{0,2} \"b\"", {0, 1, 2});
  count_a("root ::= \"a\"{0} \"b\"", {0});
  count_a("root ::= \"a\"? \"b\"", {0, 1});
  count_a("root ::= \"a\"* \"b\"", {0, 1, 2, 3, 4, 5, 6, 7, 8});
  count_a("root ::= \"a\"+ \"b\"", {1, 2, 3, 4, 5, 6, 7, 8});
  count_a("root ::= (\"a\"{2}){1,2} \"b\"", {2, 4});
  count_a("root ::= (\"a\" | \"aa\"){3} \"b\"", {3, 4, 5, 6});

  Recognizer multi("root ::= \"ab\"{1,2}");  // the whole literal repeats
  CHECK(multi.Matches("ab"));
  CHECK(multi.Matches("abab"));
  CHECK_FALSE(multi.Matches("abb"));
  CHECK_FALSE(multi.Matches("ababab"));
}

TEST_CASE("GBNF: every short string is judged as std::regex judges it", "[grammar]") {
  struct Case {
    const char* gbnf;
    const char* regex;
  };
  const Case cases[] = {
      {"root ::= (\"a\" | \"b\"){2,3} \"c\"?", "(a|b){2,3}c?"},
      {"root ::= \"a\"* \"b\"+ \"c\"{0,2}", "a*b+c{0,2}"},
      {"root ::= x \"c\" | \"b\" x\nx ::= \"a\" [bc]*", "a[bc]*c|ba[bc]*"},
      {"root ::= ([ab] \"c\")+ | \"\"", "([ab]c)+|"},
      {"root ::= [^a]{1,3}", "[^a]{1,3}"},
      {"root ::= (\"a\" (\"b\" | \"c\")* \"a\")*", "(a[bc]*a)*"},
      {"root ::= \"ab\"{2}", "(ab){2}"},
      {"root ::= .{2,}", ".{2,}"},
      {"root ::= (\"a\" | \"ab\") (\"c\" | \"bc\")", "(a|ab)(c|bc)"},
  };
  const std::vector<std::string> strings = AllStrings("abc", 6);
  const std::vector<std::string> tails = AllStrings("abc", 4);
  for (const Case& c : cases) {
    Recognizer r(c.gbnf);
    const std::regex re(c.regex, std::regex::ECMAScript);
    for (const std::string& s : strings) {
      INFO(c.gbnf << " on '" << s << "'");
      CHECK(r.Matches(s) == std::regex_match(s, re));
      if (s.size() <= 4) {
        // A prefix is viable when some completion matches; each of these languages completes
        // any viable prefix within 4 characters.
        const bool viable = std::any_of(tails.begin(), tails.end(), [&](const std::string& t) {
          return std::regex_match(s + t, re);
        });
        CHECK(r.IsPrefix(s) == viable);
      }
    }
  }
}

TEST_CASE("GBNF: recursive (non-regular) grammars", "[grammar]") {
  const auto balanced = [](const std::string& s) {
    int depth = 0;
    for (char c : s) {
      depth += c == '(' ? 1 : -1;
      if (depth < 0) return false;
    }
    return depth == 0;
  };
  const auto anbn = [](const std::string& s) {
    const size_t n = s.size() / 2;
    return s.size() % 2 == 0 && s == std::string(n, 'a') + std::string(n, 'b');
  };
  struct Case {
    const char* gbnf;
    const char* alphabet;
    std::function<bool(const std::string&)> want;
  };
  const Case cases[] = {
      {"root ::= \"(\" root \")\" root | \"\"", "()", balanced},
      {"root ::= \"a\" root \"b\" | \"\"", "ab", anbn},
      {"root ::= item*\nitem ::= \"(\" item* \")\"", "()", balanced},
  };
  for (const Case& c : cases) {
    Recognizer r(c.gbnf);
    for (const std::string& s : AllStrings(c.alphabet, 10)) {
      INFO(c.gbnf << " on '" << s << "'");
      CHECK(r.Matches(s) == c.want(s));
    }
  }
}

TEST_CASE("GBNF: the end of the grammar and end tokens", "[grammar]") {
  // Tokens: 0 "a", 1 "b", 2 "ab", 3 end of generation, 4 a control token (no text).
  auto trie = TokenTrie::FromPieces({"a", "b", "ab", "</s>", ""}, {3});
  GrammarMatcher m(MustCompile("root ::= \"a\" \"b\"?"), trie);
  CHECK_FALSE(m.CanEnd());
  CHECK_FALSE(m.ComputeMask().allowed(3));
  CHECK_FALSE(m.AcceptToken(3));
  CHECK_FALSE(m.AcceptToken(4));
  CHECK_FALSE(m.AcceptToken(1));
  CHECK(m.AcceptToken(0));
  CHECK(m.CanEnd());
  CHECK_FALSE(m.IsComplete());
  const TokenMask& mask = m.ComputeMask();
  CHECK(mask.allowed(1));
  CHECK(mask.allowed(3));
  CHECK(mask.count() == 2);
  CHECK(m.AcceptToken(1));
  CHECK(m.IsComplete());
  CHECK(m.ComputeMask().count() == 1);  // only the end
  CHECK(m.ComputeMask().allowed(3));
  CHECK(m.AcceptToken(3));
  CHECK(m.ended());
  CHECK(m.ComputeMask().count() == 0);
  CHECK_FALSE(m.AcceptToken(0));
  m.Reset();
  CHECK_FALSE(m.ended());
  CHECK(m.ComputeMask().allowed(2));
}

TEST_CASE("UTF-8 ranges: the alternatives hold exactly the class's code points", "[grammar]") {
  using Ranges = std::vector<std::pair<char32_t, char32_t>>;
  const std::pair<Ranges, bool> cases[] = {
      {{{0x61, 0x7A}}, false},      {{{0x22, 0x22}, {0x5C, 0x5C}, {0x00, 0x1F}}, true},
      {{{0x3B1, 0x3C9}}, false},    {{{0x7F, 0x800}}, false},
      {{{0xD000, 0xE000}}, false},  // spans the surrogates
      {{{0x1234, 0x2FFFF}}, false}, {{}, true},
      {{{0x10, 0x10FFFF}}, false},
  };
  for (const auto& [input, negate] : cases) {
    const Ranges ranges = NormalizeCodePointRanges(input, negate);
    const std::vector<Utf8Alternative> alts = Utf8Alternatives(ranges);
    const auto matches = [&](const std::string& bytes) {
      for (const Utf8Alternative& a : alts) {
        if (bytes.size() != a.rest.size() + 1) continue;
        const auto b0 = static_cast<uint8_t>(bytes[0]);
        bool ok = std::any_of(a.first.begin(), a.first.end(),
                              [&](const ByteRange& r) { return b0 >= r.lo && b0 <= r.hi; });
        for (size_t k = 0; ok && k < a.rest.size(); ++k) {
          const auto b = static_cast<uint8_t>(bytes[k + 1]);
          ok = b >= a.rest[k].lo && b <= a.rest[k].hi;
        }
        if (ok) return true;
      }
      return false;
    };
    for (char32_t cp = 0; cp <= 0x10FFFF; ++cp) {
      if (cp >= 0xD800 && cp <= 0xDFFF) continue;
      bool in_input = false;
      for (const auto& [lo, hi] : input) in_input |= cp >= lo && cp <= hi;
      std::string bytes;
      AppendUtf8(cp, &bytes);
      if (matches(bytes) != (in_input != negate)) {
        FAIL("code point " << static_cast<uint32_t>(cp) << " judged wrongly");
      }
    }
    // Nothing else: every byte sequence an alternative allows is one well-formed character.
    for (const Utf8Alternative& a : alts) {
      for (const ByteRange& f : a.first) {
        for (int b0 : {static_cast<int>(f.lo), static_cast<int>(f.hi)}) {
          std::string lo(1, static_cast<char>(b0)), hi = lo;
          for (const ByteRange& r : a.rest) {
            lo.push_back(static_cast<char>(r.lo));
            hi.push_back(static_cast<char>(r.hi));
          }
          for (const std::string& s : {lo, hi}) {
            const Utf8Scan scan = ScanUtf8(s, 0);
            CHECK(scan.kind == Utf8Scan::kComplete);
            CHECK(scan.length == static_cast<int>(s.size()));
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace thermocline
