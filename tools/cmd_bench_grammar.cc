// thermocline bench --json-schema FILE: what grammar-constrained sampling costs decode. The
// same prompt is decoded greedily through the one generate loop, unconstrained and under the
// schema's grammar (a fresh matcher per run, as each request has), interleaved, and the median
// decode tokens/s of each is printed with their ratio. Decode time includes sampling and the
// mask, so the ratio is what a request sees.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "engine/runtime/generate.h"
#include "engine/sampling/grammar.h"
#include "engine/sampling/grammar_matcher.h"
#include "engine/sampling/token_trie.h"
#include "nlohmann/json.hpp"
#include "server/json_schema_grammar.h"
#include "tools/commands.h"

namespace thermocline::cli {
namespace {

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

}  // namespace

int RunBenchGrammar(const Args& args, const Engine& engine, ThreadPool& pool, int64_t gen_tokens,
                    int repetitions) {
  const std::string path = *args.Get("--json-schema");
  std::ifstream f(path);
  if (!f) return Fail("bench", absl::NotFoundError(absl::StrCat("cannot read ", path)));
  std::stringstream text;
  text << f.rdbuf();
  auto gbnf = server::JsonSchemaTextToGbnf(text.str());
  if (!gbnf.ok()) return Fail("bench", gbnf.status());
  auto grammar = Grammar::FromGbnf(*gbnf);
  if (!grammar.ok()) return Fail("bench", grammar.status());
  const Tokenizer& tok = engine.model().tokenizer();
  const std::shared_ptr<const TokenTrie> trie = TokenTrie::FromTokenizer(tok);
  const std::string prompt_text =
      args.Get("--prompt").value_or("A person, described as a JSON object:");
  const std::vector<int32_t> prompt = tok.Encode(prompt_text, tok.add_bos());
  if (static_cast<int64_t>(prompt.size()) + gen_tokens + 1 > engine.n_ctx()) {
    return Fail("bench", absl::InvalidArgumentError(
                             absl::StrCat("the prompt has ", prompt.size(),
                                          " tokens; raise --prompt-tokens to at least that")));
  }
  auto session = SessionFor(engine, &pool);
  if (!session.ok()) return Fail("bench", session.status());
  Session& s = (*session)->session();

  GenerateOptions options;
  options.max_tokens = static_cast<int32_t>(gen_tokens);
  options.sampling = SamplingParams::Greedy();
  options.stop_at_end_of_generation = false;  // both runs decode the same number of steps
  std::vector<double> free_runs, constrained_runs;
  int64_t constrained_tokens = 0;
  std::string sample;
  for (int rep = 0; rep <= std::max(1, repetitions); ++rep) {  // rep 0 warms up
    for (bool constrained : {false, true}) {
      std::optional<GrammarMatcher> matcher;
      options.grammar = constrained ? &matcher.emplace(*grammar, trie) : nullptr;
      s.Reset();
      auto r = Generate(s, prompt, options);
      if (!r.ok()) return Fail("bench", r.status());
      if (rep == 0) continue;
      (constrained ? constrained_runs : free_runs).push_back(r->decode_tokens_per_s());
      if (constrained) {
        constrained_tokens = static_cast<int64_t>(r->tokens.size());
        sample = r->text;
      }
    }
  }
  const double free_tps = Median(free_runs), constrained_tps = Median(constrained_runs);
  const double ratio = free_tps > 0 ? constrained_tps / free_tps : 0;
  if (args.Has("--json")) {
    nlohmann::json out = {{"model", *args.Get("--model")},
                          {"json_schema", path},
                          {"threads", pool.size()},
                          {"gen_tokens", gen_tokens},
                          {"constrained_tokens", constrained_tokens},
                          {"decode_tokens_per_s", free_tps},
                          {"constrained_decode_tokens_per_s", constrained_tps},
                          {"ratio", ratio},
                          {"free_runs", free_runs},
                          {"constrained_runs", constrained_runs},
                          {"constrained_output", sample}};
    std::cout << out.dump(2) << "\n";
  } else {
    std::printf(
        "threads %d | greedy decode, %lld tokens: %.2f tokens/s; with the JSON schema's grammar "
        "(%lld tokens until it was complete): %.2f tokens/s, %.1f%% of unconstrained\n"
        "constrained output: %s\n",
        pool.size(), static_cast<long long>(gen_tokens), free_tps,
        static_cast<long long>(constrained_tokens), constrained_tps, 100 * ratio, sample.c_str());
  }
  return 0;
}

}  // namespace thermocline::cli
