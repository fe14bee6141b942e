// Input-sparse (TEAL-style) sparsity on SwiGLU models: the inputs of q/k/v, gate/up and down
// thresholded by magnitude, the weight columns of the entries kept read over transposed copies.
// With no threshold it is dense (up to the copies' requantization); a prompt with dense prefill
// is dense's exactly; at target sparsities 0.3, 0.4 and 0.5 it keeps that share of the inputs,
// with perplexity on stories260K.ppl-sample.txt within stated bounds of dense and, at 0.3, the
// first 8 greedy tokens of the reference prompts compared with dense; decode does not allocate.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <random>

#include "allocation_count.h"
#include "engine/model/session.h"
#include "engine/runtime/perplexity.h"
#include "model_fixtures.h"
#include "offline/pipeline.h"
#include "offline/sparse_source.h"
#include "sparse_fixtures.h"

namespace thermocline {
namespace {

using testing::CachedModel;
using testing::EveryToken;
using testing::InputSparsePlan;
using testing::LoadReference;
using testing::ReadTextFile;
using testing::TestModelPath;

const offline::Sidecar& ProfiledSidecar(const std::string& file) {
  return testing::ProfiledSidecar(file, {.tokens = 2048, .samples = 1024, .epochs = 1});
}

double MaxRelativeDiff(const float* a, const float* b, int64_t n) {
  double diff = 0, scale = 0;
  for (int64_t i = 0; i < n; ++i) {
    diff = std::max<double>(diff, std::fabs(a[i] - b[i]));
    scale = std::max<double>(scale, std::fabs(b[i]));
  }
  return diff / scale;
}

TEST_CASE("input-sparse with no threshold reads every column: dense logits", "[sparse]") {
  const std::string path = TestModelPath("stories260K.gguf");
  if (!std::filesystem::exists(path)) THERMOCLINE_SKIP("stories260K.gguf not found");
  const LlamaModel& model = CachedModel(path);
  ThreadPool pool(2);
  EngineOptions f32 = EveryToken();
  f32.kv_type = KvType::kF32;
  auto dense = testing::NewEngineSession(model, std::nullopt, pool, f32);
  auto sparse = testing::NewEngineSession(model, InputSparsePlan(model, 0), pool, f32);
  const nlohmann::json ref = LoadReference("stories260K.reference.json");
  for (const nlohmann::json& p : ref["prompts"]) {
    const std::vector<int32_t> prompt = p["prompt_ids"];
    REQUIRE(testing::GreedyIds(sparse->session(), prompt, 16) ==
            testing::GreedyIds(dense->session(), prompt, 16));
    // The F32 copies transpose exactly; only the order of the float sums differs (axpy over
    // columns against dense dot products): relative 1e-4 is ~1000 ε over 16 positions.
    CHECK(MaxRelativeDiff(sparse->session().logits(), dense->session().logits(),
                          model.hparams().n_vocab) <= 1e-4);
  }
  const SparseFfnStats& st = sparse->sparse()->stats();
  const double n_embd = static_cast<double>(model.hparams().n_embd);
  REQUIRE(st.attn_in_tokens > 0);
  REQUIRE(st.ffn_in_tokens == st.attn_in_tokens);
  CHECK(st.attn_in_kept / st.attn_in_tokens >= 0.999 * n_embd);  // every column was read
  CHECK(st.ffn_in_kept / st.ffn_in_tokens >= 0.999 * n_embd);
  CHECK(st.layer_tokens == 0);  // nothing went through the predicted path
}

TEST_CASE("an input-sparse engine computes a prompt dense, and decodes without allocating",
          "[sparse]") {
  const std::string path = TestModelPath("kquants/stories-wide.q4_0.gguf");
  if (!std::filesystem::exists(path)) THERMOCLINE_SKIP("stories-wide.q4_0.gguf not found");
  const LlamaModel& model = CachedModel(path);
  ThreadPool pool(2);
  auto dense = testing::NewEngineSession(model, std::nullopt, pool);
  // A high threshold: decode keeps few columns, so its logits part from dense's at once.
  auto sparse = testing::NewEngineSession(model, InputSparsePlan(model, 0.5f), pool);
  const nlohmann::json ref = LoadReference("stories260K.reference.json");
  const std::vector<int32_t> prompt = ref["prompts"][0]["prompt_ids"];
  REQUIRE(dense->session().Eval(prompt).ok());
  REQUIRE(sparse->session().Eval(prompt).ok());
  const int64_t n_vocab = model.hparams().n_vocab;
  CHECK(std::equal(dense->session().logits(), dense->session().logits() + n_vocab,
                   sparse->session().logits()));
  CHECK(sparse->sparse()->stats().attn_in_tokens == 0);
  const int32_t next = 5;
  REQUIRE(dense->session().Eval({&next, 1}).ok());
  REQUIRE(sparse->session().Eval({&next, 1}).ok());
  CHECK(MaxRelativeDiff(sparse->session().logits(), dense->session().logits(), n_vocab) > 1e-3);
  CHECK(sparse->sparse()->stats().attn_in_tokens == model.hparams().n_layer);
#if THERMOCLINE_COUNT_ALLOCATIONS
  CHECK(testing::AllocationsOfGreedySteps(sparse->session(), 8) == 0);
#endif
}

TEST_CASE("input-sparse projections do not depend on the thread count", "[sparse]") {
  // The threads each take whole blocks of the kept inputs (ColumnSplit) through every output and
  // add their sums after: the integer sums are the same for any count, the float ones differ
  // in order only. Same inputs for every count (a whole decode would not do: an entry within a
  // float rounding of its threshold is kept under one order and dropped under another).
  const std::string path = TestModelPath("kquants/stories-wide.q4_0.gguf");
  if (!std::filesystem::exists(path)) THERMOCLINE_SKIP("stories-wide.q4_0.gguf not found");
  const LlamaModel& model = CachedModel(path);
  const LlamaHparams& h = model.hparams();
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> xn(h.n_embd), x(h.n_embd, 0.0f);
  for (float& v : xn) v = normal(rng);
  std::vector<float> base_out, base_qkv;
  double base_kept = 0, base_fired = 0;
  for (int threads : {1, 2, 3, 4}) {
    INFO(threads << " threads");
    ThreadPool pool(threads);
    // About half of xn's entries under the threshold, and some of the activations.
    SparsePlan plan = InputSparsePlan(model, 0.67f);
    for (SparseLayerPlan& p : plan.layers) p.magnitude_threshold = 0.01f;
    auto engine = testing::NewEngineSession(model, std::move(plan), pool, EveryToken());
    SparseFfn& ffn = *engine->sparse();
    std::vector<float> out(h.n_layer * h.n_embd), qkv;
    for (int l = 0; l < h.n_layer; ++l) {
      ffn.Forward(l, x.data(), xn.data(), 1, out.data() + l * h.n_embd);
      std::vector<float> q(h.q_dim()), k(h.kv_dim()), v(h.v_dim());
      REQUIRE(ffn.ProjectQkv(l, xn.data(), 1, q.data(), k.data(), v.data()));
      for (const auto* part : {&q, &k, &v}) qkv.insert(qkv.end(), part->begin(), part->end());
    }
    const SparseFfnStats& st = ffn.stats();
    REQUIRE(st.ffn_in_tokens == h.n_layer);
    if (threads == 1) {
      base_out = out;
      base_qkv = qkv;
      base_kept = st.ffn_in_kept;
      base_fired = st.ffn_in_fired;
      // Some of the activations dropped too (a third of the neurons are the widening's zeros).
      CHECK(base_fired < 0.6 * h.n_layer * h.n_ff);
      CHECK(base_fired > 0.3 * h.n_layer * h.n_ff);
      // Columns were skipped, not all read.
      CHECK(base_kept < 0.7 * h.n_layer * h.n_embd);
      CHECK(base_kept > 0.3 * h.n_layer * h.n_embd);
      continue;
    }
    CHECK(st.ffn_in_kept == base_kept);
    CHECK(st.ffn_in_fired == base_fired);
    // 1e-5: float sums of at most a few hundred terms per output, in another order.
    CHECK(MaxRelativeDiff(out.data(), base_out.data(), static_cast<int64_t>(out.size())) <= 1e-5);
    CHECK(MaxRelativeDiff(qkv.data(), base_qkv.data(), static_cast<int64_t>(qkv.size())) <= 1e-5);
  }
}

// Perplexity at each target against dense, the shares of inputs kept, and at 0.3 how many of
// the 4 reference prompts keep dense's first 8 greedy tokens (at least min_greedy).
void CheckQuality(const std::string& file, const std::map<double, double>& bound, int min_greedy) {
  const std::string path = TestModelPath(file);
  if (!std::filesystem::exists(path)) THERMOCLINE_SKIP(file + " not found");
  const LlamaModel& model = CachedModel(path);
  ThreadPool pool(2);
  const offline::Sidecar& sidecar = ProfiledSidecar(file);
  auto dense = testing::NewEngineSession(model, std::nullopt, pool, EveryToken());
  const double ppl_dense = testing::SamplePerplexity(dense->session());
  const double n_ff = static_cast<double>(model.hparams().n_ff);
  const double n_embd = static_cast<double>(model.hparams().n_embd);
  for (const auto& [target, max_increase] : bound) {
    auto plan =
        offline::SparsePlanFromSidecar(sidecar, model, target, offline::MethodChoice::kInputSparse);
    INFO(plan.status().ToString());
    REQUIRE(plan.ok());
    auto sparse = testing::NewEngineSession(model, *std::move(plan), pool, EveryToken());
    const double ppl = testing::SamplePerplexity(sparse->session());
    const SparseFfnStats& st = sparse->sparse()->stats();
    REQUIRE(st.ffn_in_tokens > 0);
    const double attn_kept = st.attn_in_kept / st.attn_in_tokens / n_embd;
    const double ffn_kept = st.ffn_in_kept / st.ffn_in_tokens / n_embd;
    const double fired = st.ffn_in_fired / st.ffn_in_tokens / n_ff;
    WARN(file << " input-sparse at " << target << ": ppl " << ppl << " (dense " << ppl_dense << ", "
              << 100 * (ppl / ppl_dense - 1) << "%), inputs kept: q/k/v " << 100 * attn_kept
              << "%, gate/up " << 100 * ffn_kept << "%, down " << 100 * fired << "%");
    CHECK(ppl <= ppl_dense * (1 + max_increase));
    // Calibrated on the profile corpus, measured on the perplexity text: each share dropped is
    // the target within 0.08 (the two texts' activations differ a little).
    CHECK(std::fabs((1 - attn_kept) - target) <= 0.08);
    CHECK(std::fabs((1 - ffn_kept) - target) <= 0.08);
    CHECK(std::fabs((1 - fired) - target) <= 0.08);
    if (target == 0.3) {
      const int equal = testing::PromptsKeepingGreedy(sparse->session(), dense->session(), 8);
      WARN(file << " input-sparse at 0.3: " << equal << " of 4 prompts keep 8 greedy tokens");
      CHECK(equal >= min_greedy);
    }
  }
}

// Bounds: the increases measured with these profiles (docs/sparse.md's table: +5.8–8.6% at 0.3,
// +22–28% at 0.4, +89–101% at 0.5 across the files) with about a quarter of headroom for other
// ISAs' roundings. These models are 64 wide: the 30% smallest entries of a 64-wide hidden state
// carry much of it, and every projection of every layer drops them, so the loss is far larger
// than on a wide model (TEAL's 7B+ figures); `profile --target-ppl-increase` finds the level
// that keeps it small (about 0.17 for +2% on stories260K). At 0.3 two of the four prompts part
// from dense within 8 tokens (three for Q4_0, whose copies are Q8_0: other roundings).
TEST_CASE("input-sparse quality on stories260K at 0.3, 0.4, 0.5", "[sparse][quality]") {
  CheckQuality("stories260K.gguf", {{0.3, 0.11}, {0.4, 0.35}, {0.5, 1.25}}, 2);
}

TEST_CASE("input-sparse quality on stories-wide files at 0.3, 0.4, 0.5", "[sparse][quality]") {
  for (const char* type : {"f32", "q8_0", "q4_k_m"}) {
    CheckQuality(std::string("kquants/stories-wide.") + type + ".gguf",
                 {{0.3, 0.11}, {0.4, 0.35}, {0.5, 1.25}}, 2);
  }
  CheckQuality("kquants/stories-wide.q4_0.gguf", {{0.3, 0.11}, {0.4, 0.35}, {0.5, 1.25}}, 1);
}

}  // namespace
}  // namespace thermocline
