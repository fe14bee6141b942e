// Micro-benchmarks of grammar-constrained decoding (Google Benchmark) on a synthetic 32,000-token
// BPE-like vocabulary (byte tokens, words with and without a leading space, digits, JSON
// punctuation runs, multi-byte characters):
//   grammar/<g>/decode        one request: a fresh matcher, then ComputeMask + AcceptToken for
//                             each token of a ~400-byte JSON document; 1 / items_per_second is
//                             the cost per decode step, memo warm-up included
//   grammar/json/string_cold  the first mask inside a string value with empty memo tables (most
//                             tokens allowed: the whole trie is walked)
//   grammar/bounded_string    a mask per character of a maxLength-500 string: every state is new
//                             (no mask cache hit), the memoized steps mostly warm
//   grammar/apply_mask        ApplyMask on 32,000 logits with a cached mask
#include <benchmark/benchmark.h>

#include <algorithm>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "engine/sampling/grammar.h"
#include "engine/sampling/grammar_matcher.h"
#include "engine/sampling/token_trie.h"

namespace thermocline {
namespace {

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

// The shape the JSON-schema compiler writes for {name, age, tags[], bio (maxLength 300)}.
constexpr char kSchemaGbnf[] =
    R"(root ::= "{" ws name-kv "," ws age-kv "," ws tags-kv "," ws bio-kv "}"
name-kv ::= "\"name\"" ws ":" ws string ws
age-kv ::= "\"age\"" ws ":" ws ( [1-9] [0-9]? | "1" [0-4] [0-9] ) ws
tags-kv ::= "\"tags\"" ws ":" ws "[" ws ( string ws ( "," ws string ws ){0,9} )? "]" ws
bio-kv ::= "\"bio\"" ws ":" ws "\"" char{0,300} "\"" ws
string ::= "\"" char* "\""
char ::= [^"\\\x00-\x1F] | "\\" ( ["\\/bfnrt] | "u" [0-9a-fA-F]{4} )
ws ::= ( " " | "\n" [ \t]{0,20} )?
)";

constexpr char kBoundedStringGbnf[] = R"(root ::= "\"" char{0,500} "\""
char ::= [^"\\\x00-\x1F] | "\\" ( ["\\/bfnrt] | "u" [0-9a-fA-F]{4} )
)";

constexpr char kDocument[] =
    "{\"name\": \"Lily Montgomery\", \"age\": 34, \"tags\": [\"reader\", \"hiker\", "
    "\"caf\xC3\xA9 owner\"],\n  \"bio\": \"Lily grew up by the sea and now runs a small "
    "caf\xC3\xA9 "
    "where she bakes bread every morning. She likes long walks, old books and \\\"quiet\\\" "
    "evenings; her dog Max follows her everywhere.\"}";

std::shared_ptr<const TokenTrie> Vocabulary() {
  static const std::shared_ptr<const TokenTrie> trie = [] {
    constexpr int kVocab = 32000;
    std::set<std::string> seen;
    std::vector<std::string> pieces;
    const auto add = [&](const std::string& p) {
      if (!p.empty() && seen.insert(p).second) pieces.push_back(p);
    };
    for (int b = 0; b < 256; ++b) add(std::string(1, static_cast<char>(b)));
    for (const char* p :
         {"{\"", "\":",         "\",",      "\"}",      "\": \"",       "\", \"",
          " \"", "\n",          "\n  ",     "\n    ",   "  ",           "    ",
          "\"]", "[\"",         "},",       "],",       ".\"",          "\\\"",
          "\\n", "caf\xC3\xA9", "\xC3\xA9", "\xC3\xBC", "\xE4\xB8\xAD", "\xF0\x9F"}) {
      add(p);
    }
    for (int n = 0; n < 1000; ++n) add(std::to_string(n));
    for (const char* w : {"Lily", " Lily", " Montgomery", " reader", " hiker", " owner", " bio",
                          "name", "age", "tags", " grew", " sea", " bakes", " bread"}) {
      add(w);
    }
    // Words from English-like letter frequencies, with and without a leading space.
    const std::string letters = "eeeeeeettttaaaooooiiinnnsssshhhrrrddllcumwfgypbvk";
    std::mt19937 rng(42);
    while (static_cast<int>(pieces.size()) < kVocab) {
      const int len = 1 + static_cast<int>(rng() % 9);
      std::string w = rng() % 10 < 6 ? " " : "";
      for (int i = 0; i < len; ++i) w.push_back(letters[rng() % letters.size()]);
      if (rng() % 8 == 0) w[w.size() - len] = static_cast<char>(w[w.size() - len] - 'a' + 'A');
      add(w);
    }
    return TokenTrie::FromPieces(pieces, {});
  }();
  return trie;
}

std::shared_ptr<const Grammar> Compile(const char* gbnf) {
  absl::StatusOr<std::shared_ptr<const Grammar>> g = Grammar::FromGbnf(gbnf);
  if (!g.ok()) std::abort();
  return *g;
}

// The document as tokens: at each step the longest allowed token that spells what comes next.
std::vector<int32_t> Tokenize(const std::shared_ptr<const Grammar>& g, const std::string& text) {
  const TokenTrie& trie = *Vocabulary();
  GrammarMatcher m(g, Vocabulary());
  std::vector<int32_t> ids;
  for (size_t done = 0; done < text.size();) {
    const TokenMask& mask = m.ComputeMask();
    int32_t best = -1;
    for (int32_t id = 0; id < trie.vocab_size(); ++id) {
      const std::string_view p = trie.piece(id);
      if (mask.allowed(id) && text.compare(done, p.size(), p) == 0 &&
          (best < 0 || p.size() > trie.piece(best).size())) {
        best = id;
      }
    }
    if (best < 0 || !m.AcceptToken(best)) std::abort();
    ids.push_back(best);
    done += trie.piece(best).size();
  }
  return ids;
}

void Decode(benchmark::State& state, const char* gbnf) {
  const std::shared_ptr<const Grammar> g = Compile(gbnf);
  const std::vector<int32_t> ids = Tokenize(g, kDocument);
  for (auto _ : state) {
    GrammarMatcher m(g, Vocabulary());
    for (int32_t id : ids) {
      benchmark::DoNotOptimize(m.ComputeMask().words().data());
      m.AcceptToken(id);
    }
  }
  state.counters["tokens"] = static_cast<double>(ids.size());
  state.SetItemsProcessed(static_cast<int64_t>(ids.size()) * state.iterations());
}

void StringCold(benchmark::State& state) {
  const std::shared_ptr<const Grammar> g = Compile(kJsonGbnf);
  for (auto _ : state) {
    state.PauseTiming();
    GrammarMatcher m(g, Vocabulary());
    m.AcceptBytes("{\"bio\": \"Lily");
    state.ResumeTiming();
    benchmark::DoNotOptimize(m.ComputeMask().words().data());
  }
}

void BoundedString(benchmark::State& state) {
  const std::shared_ptr<const Grammar> g = Compile(kBoundedStringGbnf);
  GrammarMatcher m(g, Vocabulary());
  m.AcceptBytes("\"");
  int written = 0;
  for (auto _ : state) {
    benchmark::DoNotOptimize(m.ComputeMask().words().data());
    m.AcceptBytes("a");
    if (++written == 400) {
      m.Reset();
      m.AcceptBytes("\"");
      written = 0;
    }
  }
  state.counters["states"] = m.num_states();
}

void ApplyMask(benchmark::State& state) {
  GrammarMatcher m(Compile(kJsonGbnf), Vocabulary());
  m.AcceptBytes("{\"a\": \"");
  std::vector<float> logits(Vocabulary()->vocab_size(), 1.0f);
  for (auto _ : state) {
    m.ApplyMask(logits.data());
    benchmark::DoNotOptimize(logits.data());
  }
}

BENCHMARK_CAPTURE(Decode, json, kJsonGbnf)
    ->Name("grammar/json/decode")
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(Decode, schema, kSchemaGbnf)
    ->Name("grammar/schema/decode")
    ->Unit(benchmark::kMillisecond);
BENCHMARK(StringCold)->Name("grammar/json/string_cold")->Unit(benchmark::kMicrosecond);
BENCHMARK(BoundedString)->Name("grammar/bounded_string")->Unit(benchmark::kMicrosecond);
BENCHMARK(ApplyMask)->Name("grammar/apply_mask")->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace thermocline
