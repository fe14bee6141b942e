// Fixtures of the sparse-method tests: a sidecar from a short profile of a test model, cached
// for the test binary's life, and perplexity measured as `perplexity` does.
#pragma once

#include <map>
#include <string>
#include <tuple>

#include "engine/runtime/perplexity.h"
#include "model_fixtures.h"
#include "offline/pipeline.h"

namespace thermocline::testing {

struct ShortProfile {
  int64_t tokens = 2048;
  int64_t samples = 1024;
  int epochs = 2;
};

// A sidecar of `file` (under the test models) from a profile on the profile corpus, never the
// perplexity text.
inline const offline::Sidecar& ProfiledSidecar(const std::string& file,
                                               const ShortProfile& p = {}) {
  static std::map<std::tuple<std::string, int64_t, int64_t, int>, offline::Sidecar> cache;
  const auto key = std::make_tuple(file, p.tokens, p.samples, p.epochs);
  auto it = cache.find(key);
  if (it != cache.end()) return it->second;
  const LlamaModel& model = CachedModel(TestModelPath(file));
  ThreadPool pool(2);
  offline::PipelineOptions o;
  o.run.corpus_path = TestModelPath("tinystories-profile.txt");
  o.run.tokens = p.tokens;
  o.profiler.max_samples = p.samples;
  o.predictors.train.epochs = p.epochs;
  auto r = offline::RunProfilePipeline(model, file, pool, o, nullptr);
  INFO(r.status().ToString());
  REQUIRE(r.ok());
  return cache.emplace(key, std::move(r->sidecar)).first->second;
}

// Every layer of `model` input-sparse, every threshold `threshold`.
inline SparsePlan InputSparsePlan(const LlamaModel& model, float threshold) {
  SparsePlan plan;
  plan.layers.resize(model.hparams().n_layer);
  for (SparseLayerPlan& p : plan.layers) {
    p.method = SparseMethod::kInputSparse;
    p.attn_in_threshold = p.ffn_in_threshold = p.magnitude_threshold = threshold;
  }
  return plan;
}

// Engine options under which perplexity's windows go through the sparse path too, not dense
// prefill.
inline EngineOptions EveryToken() {
  EngineOptions o;
  o.dense_prefill = false;
  return o;
}

// Perplexity of stories260K.ppl-sample.txt at context 128.
inline double SamplePerplexity(Session& session) {
  const std::string text = ReadTextFile(TestModelPath("stories260K.ppl-sample.txt"));
  auto r = ComputePerplexity(session, text, 128);
  INFO(r.status().ToString());
  REQUIRE(r.ok());
  return r->ppl;
}

// How many of stories260K.reference.json's prompts keep dense's first n greedy tokens.
inline int PromptsKeepingGreedy(Session& sparse, Session& dense, int n) {
  const nlohmann::json ref = LoadReference("stories260K.reference.json");
  int equal = 0;
  for (const nlohmann::json& p : ref["prompts"]) {
    const std::vector<int32_t> prompt = p["prompt_ids"];
    equal += GreedyIds(sparse, prompt, n) == GreedyIds(dense, prompt, n);
  }
  return equal;
}

}  // namespace thermocline::testing
