// Sparse inference quality on relu-tiny with a sidecar the offline pipeline makes here: perplexity
// on held-out text (sampled from the model, not the profile corpus) within 2% of dense, greedy
// continuations of the reference prompts equal to dense for 32 tokens, and --oracle logits equal
// to dense within float tolerance.
#include <algorithm>
#include <cmath>
#include <filesystem>

#include "engine/model/session.h"
#include "engine/runtime/generate.h"
#include "engine/runtime/perplexity.h"
#include "model_fixtures.h"
#include "offline/pipeline.h"
#include "offline/sparse_source.h"

namespace thermocline {
namespace {

using testing::CachedModel;
using testing::LoadReference;
using testing::TempDir;
using testing::TestModelPath;

std::vector<int32_t> Greedy(Session& session, const std::vector<int32_t>& prompt, int n) {
  return testing::GreedyIds(session, prompt, n);
}

TEST_CASE("relu-tiny sparse: perplexity, greedy continuations, oracle", "[sparse]") {
  const std::string path = TestModelPath("relu-tiny.f32.gguf");
  if (!std::filesystem::exists(path)) THERMOCLINE_SKIP("relu-tiny.f32.gguf not found");
  const LlamaModel& model = CachedModel(path);
  ThreadPool pool(2);

  offline::PipelineOptions o;  // a short profile keeps the test under a minute
  o.run.corpus_path = TestModelPath("tinystories-profile.txt");
  o.run.tokens = 3072;
  o.profiler.max_samples = 3072;
  auto r = offline::RunProfilePipeline(model, "relu-tiny.f32.gguf", pool, o, nullptr);
  REQUIRE(r.ok());
  const std::string sidecar = (TempDir() / "sparse-relu-tiny.thermo.gguf").string();
  REQUIRE(offline::WriteSidecar(r->sidecar, sidecar).ok());

  // Every session through the front door, as `generate` builds its own.
  auto dense_engine = testing::NewEngineSession(model, std::nullopt, pool);
  auto plan = offline::LoadSparsePlan(sidecar, model);
  INFO(plan.status().ToString());
  REQUIRE(plan.ok());
  SparsePlan oracle_plan = *offline::LoadSparsePlan(sidecar, model);
  oracle_plan.oracle = true;
  EngineOptions every_token;  // perplexity's windows through the sparse FFN too
  every_token.dense_prefill = false;
  auto sparse_engine = testing::NewEngineSession(model, *std::move(plan), pool, every_token);
  auto oracle_engine = testing::NewEngineSession(model, std::move(oracle_plan), pool, every_token);
  REQUIRE(sparse_engine->sparse() != nullptr);
  REQUIRE(oracle_engine->sparse()->options().oracle);
  Session* const dense = &dense_engine->session();
  Session* const sparse_session = &sparse_engine->session();
  Session* const oracle_session = &oracle_engine->session();
  const SparseFfn* const sparse = sparse_engine->sparse();

  // Held-out text: sampled from the model (temperature 1) after a few short prompts.
  std::string text;
  GenerateOptions g;
  g.max_tokens = 200;
  g.sampling.temperature = 1.0f;
  g.sampling.top_k = 0;
  g.sampling.top_p = 1.0f;
  g.sampling.min_p = 0.0f;
  g.stop_at_end_of_generation = false;
  const std::vector<std::string> starts = {"The dog", "One day, a girl", "Tom and Sam",
                                           "In the park"};
  for (size_t i = 0; i < starts.size(); ++i) {
    g.sampling.seed = 100 + i;
    dense->Reset();
    std::vector<int32_t> prompt = model.tokenizer().Encode(starts[i], /*add_bos=*/true);
    auto out = Generate(*dense, prompt, g);
    REQUIRE(out.ok());
    text += starts[i] + out->text + "\n";
  }
  dense->Reset();
  auto ppl_dense = ComputePerplexity(*dense, text, 128);
  REQUIRE(ppl_dense.ok());
  auto ppl_sparse = ComputePerplexity(*sparse_session, text, 128);
  REQUIRE(ppl_sparse.ok());
  const SparseFfnStats& st = sparse->stats();
  const double n_ff = model.hparams().n_ff;
  WARN("ppl dense " << ppl_dense->ppl << " sparse " << ppl_sparse->ppl << " predicted "
                    << st.predicted / st.layer_tokens / n_ff << " fired "
                    << st.fired / st.layer_tokens / n_ff);
  CHECK(ppl_sparse->ppl <= ppl_dense->ppl * 1.02);
  CHECK(ppl_sparse->ppl >= ppl_dense->ppl * 0.98);
  CHECK(st.predicted / st.layer_tokens < 0.9 * n_ff);  // it did skip work

  // Greedy continuations of the reference prompts: equal to dense for 32 tokens.
  const nlohmann::json ref = LoadReference("relu-tiny.reference.json");
  for (const nlohmann::json& p : ref["prompts"]) {
    const std::vector<int32_t> prompt = p["prompt_ids"];
    const std::vector<int32_t> want = Greedy(*dense, prompt, 32);
    CHECK(Greedy(*sparse_session, prompt, 32) == want);
    // Oracle: the exact active set, so the logits equal dense up to summation order.
    Greedy(*oracle_session, prompt, 1);
    Greedy(*dense, prompt, 1);
    const int64_t n_vocab = model.hparams().n_vocab;
    double diff = 0, scale = 0;
    for (int64_t i = 0; i < n_vocab; ++i) {
      diff = std::max<double>(diff, std::fabs(oracle_session->logits()[i] - dense->logits()[i]));
      scale = std::max<double>(scale, std::fabs(dense->logits()[i]));
    }
    // Float sums reordered across ~n_ff terms per layer: relative 1e-4 is ~1000 ε.
    CHECK(diff <= 1e-4 * scale);
  }
}

}  // namespace
}  // namespace thermocline
