// Grammar token masks against a brute-force reference: for every token, a slow independent
// recognizer (explicit stacks, copied per token) tries the token's bytes from the current
// state. On stories260K's SentencePiece vocabulary (byte-fallback tokens carry the multi-byte
// characters) and on a synthetic byte-level vocabulary whose tokens cut characters anywhere.
// Also: the bounded tables (compaction) change nothing, and ApplyMask.
#include <catch2/catch.hpp>
#include <cmath>
#include <filesystem>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "engine/sampling/grammar.h"
#include "engine/sampling/grammar_matcher.h"
#include "engine/sampling/token_trie.h"
#include "model_fixtures.h"
#include "test_util.h"

namespace thermocline {
namespace {

// A JSON grammar of the shape the JSON-schema compiler writes.
constexpr char kJsonGbnf[] = R"(root   ::= object
value  ::= object | array | string | number | "true" | "false" | "null"
object ::= "{" ws ( member ( "," ws member )* )? "}"
member ::= string ws ":" ws value ws
array  ::= "[" ws ( value ws ( "," ws value ws )* )? "]"
string ::= "\"" char* "\""
char   ::= [^"\\\x00-\x1F] | "\\" ( ["\\/bfnrt] | "u" [0-9a-fA-F]{4} )
number ::= "-"? ( "0" | [1-9] [0-9]{0,15} ) ( "." [0-9]{1,16} )? ( [eE] [-+]? [0-9]{1,3} )?
ws     ::= ( " " | "\n" [ \t]{0,20} )?
)";

std::shared_ptr<const Grammar> JsonGrammar() {
  static const std::shared_ptr<const Grammar> g = [] {
    auto compiled = Grammar::FromGbnf(kJsonGbnf);
    INFO(compiled.status().ToString());
    REQUIRE(compiled.ok());
    return *compiled;
  }();
  return g;
}

// The reference: stacks of resume positions over the compiled grammar, expanded eagerly and
// copied on every step; no sharing, interning, memo or trie.
class NaiveMatcher {
 public:
  explicit NaiveMatcher(const Grammar& g) : g_(&g) {
    for (int32_t start : g.alternatives(g.root_rule())) Expand({start}, &stacks_);
  }
  bool AcceptBytes(std::string_view bytes) {
    for (char c : bytes) {
      std::set<Stack> next;
      for (const Stack& s : stacks_) {
        if (s.empty()) continue;
        const Grammar::Element& e = g_->element(s.back());
        if (g_->ByteInSet(e.value, static_cast<uint8_t>(c))) {
          Stack t = s;
          ++t.back();
          Expand(std::move(t), &next);
        }
      }
      stacks_ = std::move(next);
      if (stacks_.empty()) return false;
    }
    return true;
  }
  bool CanEnd() const { return stacks_.count(Stack{}) > 0; }

 private:
  using Stack = std::vector<int32_t>;  // top at the back
  void Expand(Stack s, std::set<Stack>* out) const {
    if (s.empty()) {
      out->insert(std::move(s));
      return;
    }
    const Grammar::Element& e = g_->element(s.back());
    if (e.kind == Grammar::Element::kEnd) {
      s.pop_back();
      Expand(std::move(s), out);
    } else if (e.kind == Grammar::Element::kBytes) {
      out->insert(std::move(s));
    } else {
      ++s.back();
      for (int32_t start : g_->alternatives(e.value)) {
        Stack t = s;
        t.push_back(start);
        Expand(std::move(t), out);
      }
    }
  }
  const Grammar* g_;
  std::set<Stack> stacks_;
};

// Checks the matcher's mask (and CanAcceptToken) against the reference for every token.
void CheckMask(GrammarMatcher& m, const NaiveMatcher& ref, const TokenTrie& trie) {
  const TokenMask& mask = m.ComputeMask();
  int32_t wrong = 0;
  for (int32_t id = 0; id < trie.vocab_size(); ++id) {
    bool want;
    if (trie.is_end(id)) {
      want = ref.CanEnd();
    } else {
      NaiveMatcher copy = ref;
      want = !trie.piece(id).empty() && copy.AcceptBytes(trie.piece(id));
    }
    if (mask.allowed(id) != want || m.CanAcceptToken(id) != want) {
      if (++wrong <= 5) {
        UNSCOPED_INFO("token " << id << " '" << trie.piece(id) << "': mask " << mask.allowed(id)
                               << ", reference " << want);
      }
    }
  }
  CHECK(wrong == 0);
}

TEST_CASE("grammar mask equals brute force on stories260K's vocabulary", "[grammar][mask]") {
  const std::string path = testing::TestModelPath("stories260K.gguf");
  if (!std::filesystem::exists(path)) THERMOCLINE_SKIP("stories260K.gguf not found");
  const Tokenizer& tok = testing::CachedModel(path).tokenizer();
  const std::shared_ptr<const TokenTrie> trie = TokenTrie::FromTokenizer(tok);
  REQUIRE(trie->is_end(tok.eos_id()));
  REQUIRE(trie->piece(tok.bos_id()).empty());

  GrammarMatcher m(JsonGrammar(), trie);
  NaiveMatcher ref(*JsonGrammar());
  // The path: the longest allowed token that spells the next bytes of the target.
  const std::string target =
      "{\"name\": \"Lily\", \"age\": 3, \"pets\": [\"cat\", \"dog\"],\n  \"happy\": true, "
      "\"note\": \"na\xC3\xAFve \\\"quote\\\" \\u00e9\", \"x\": -1.5e3}";
  size_t done = 0;
  int steps = 0;
  while (done < target.size()) {
    INFO("after '" << target.substr(0, done) << "'");
    CheckMask(m, ref, *trie);
    const TokenMask& mask = m.ComputeMask();
    int32_t best = -1;
    for (int32_t id = 0; id < trie->vocab_size(); ++id) {
      const std::string_view p = trie->piece(id);
      if (mask.allowed(id) && !p.empty() && target.compare(done, p.size(), p) == 0 &&
          (best < 0 || p.size() > trie->piece(best).size())) {
        best = id;
      }
    }
    REQUIRE(best >= 0);
    REQUIRE(m.AcceptToken(best));
    REQUIRE(ref.AcceptBytes(trie->piece(best)));
    done += trie->piece(best).size();
    ++steps;
  }
  CHECK(steps > 20);
  CHECK(m.IsComplete());
  const TokenMask& last = m.ComputeMask();
  CHECK(last.count() == static_cast<int32_t>(trie->end_ids().size()));
  CHECK(last.allowed(tok.eos_id()));
  CHECK(m.AcceptToken(tok.eos_id()));
  CHECK(m.ended());
}

// Byte-level pieces: every single byte, plus fragments of JSON-ish text (ASCII, 2-, 3- and
// 4-byte characters) cut at random byte offsets.
std::vector<std::string> SyntheticPieces(int n, uint32_t seed) {
  std::vector<std::string> pieces;
  for (int b = 0; b < 256; ++b) pieces.push_back(std::string(1, static_cast<char>(b)));
  const std::string text =
      "{\"name\": \"caf\xC3\xA9\", \"tags\": [\"\xE6\xBC\xA2\xE5\xAD\x97\", \"\xF0\x9F\x98\x80\"], "
      "\"n\": -12.5e3, \"ok\": true, \"none\": null, \"esc\": \"a\\\"b\\\\c\\u00e9\\n\"}\n  ";
  std::mt19937 rng(seed);
  while (static_cast<int>(pieces.size()) < n) {
    const size_t start = rng() % text.size();
    const size_t len = 1 + rng() % 8;
    pieces.push_back(text.substr(start, len));
  }
  return pieces;
}

TEST_CASE("grammar mask equals brute force on a byte-level vocabulary", "[grammar][mask]") {
  std::vector<std::string> pieces = SyntheticPieces(3000, 7);
  const int32_t eos = static_cast<int32_t>(pieces.size());
  pieces.push_back("");
  const std::shared_ptr<const TokenTrie> trie = TokenTrie::FromPieces(pieces, {eos});
  for (uint32_t seed : {1u, 2u, 3u}) {
    GrammarMatcher m(JsonGrammar(), trie);
    NaiveMatcher ref(*JsonGrammar());
    std::mt19937 rng(seed);
    for (int step = 0; step < 30 && !m.IsComplete(); ++step) {
      CheckMask(m, ref, *trie);
      // A random allowed token, preferring ones that close something so the walk ends.
      const TokenMask& mask = m.ComputeMask();
      std::vector<int32_t> allowed;
      for (int32_t id = 0; id < trie->vocab_size(); ++id) {
        if (mask.allowed(id) && id != eos) allowed.push_back(id);
      }
      if (allowed.empty()) break;
      const int32_t id = allowed[rng() % allowed.size()];
      REQUIRE(m.AcceptToken(id));
      REQUIRE(ref.AcceptBytes(trie->piece(id)));
    }
  }
}

TEST_CASE("grammar matcher: bounded tables give the same masks", "[grammar][mask]") {
  const std::vector<std::string> pieces = SyntheticPieces(2000, 11);
  const std::shared_ptr<const TokenTrie> trie = TokenTrie::FromPieces(pieces, {});
  GrammarMatcher free_run(JsonGrammar(), trie);
  GrammarMatcherLimits tight;
  tight.max_transitions = 50 * static_cast<size_t>(JsonGrammar()->num_byte_classes());
  tight.max_nodes = 100;
  GrammarMatcher bounded(JsonGrammar(), trie, tight);
  std::mt19937 rng(5);
  for (int step = 0; step < 40 && !free_run.IsComplete(); ++step) {
    const TokenMask& a = free_run.ComputeMask();
    std::vector<uint64_t> want(a.words().begin(), a.words().end());
    const TokenMask& b = bounded.ComputeMask();
    REQUIRE(std::equal(want.begin(), want.end(), b.words().begin()));
    std::vector<int32_t> allowed;
    for (int32_t id = 0; id < trie->vocab_size(); ++id) {
      if ((want[id >> 6] >> (id & 63)) & 1) allowed.push_back(id);
    }
    if (allowed.empty()) break;
    const int32_t id = allowed[rng() % allowed.size()];
    REQUIRE(free_run.AcceptToken(id));
    REQUIRE(bounded.AcceptToken(id));
    CHECK(bounded.CanEnd() == free_run.CanEnd());
  }
  CHECK(bounded.num_compactions() > 0);
  CHECK(free_run.num_compactions() == 0);
}

TEST_CASE("grammar matcher: ApplyMask sets exactly the disallowed logits to -inf",
          "[grammar][mask]") {
  const std::vector<std::string> pieces = SyntheticPieces(500, 3);
  const std::shared_ptr<const TokenTrie> trie = TokenTrie::FromPieces(pieces, {});
  GrammarMatcher m(JsonGrammar(), trie);
  REQUIRE(m.AcceptBytes("{\"a\": "));
  std::vector<float> logits(pieces.size());
  for (size_t i = 0; i < logits.size(); ++i) logits[i] = static_cast<float>(i % 17) - 8.0f;
  const std::vector<float> before = logits;
  m.ApplyMask(logits.data());
  const TokenMask& mask = m.ComputeMask();
  CHECK(mask.count() > 0);
  CHECK(mask.count() < static_cast<int32_t>(pieces.size()));
  for (int32_t id = 0; id < static_cast<int32_t>(pieces.size()); ++id) {
    if (mask.allowed(id)) {
      CHECK(logits[id] == before[id]);
    } else {
      CHECK(std::isinf(logits[id]));
      CHECK(logits[id] < 0);
    }
  }
}

}  // namespace
}  // namespace thermocline
