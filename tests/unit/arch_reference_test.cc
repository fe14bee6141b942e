// Other families against llama.cpp's own outputs on the same files: stories260K rewritten as
// qwen2, gemma2, a llama mixture of experts and a llama with RoPE frequency factors
// ($THERMOCLINE_TEST_MODELS/arch/, its README says what each adds to stories260K).
#include <algorithm>
#include <cmath>

#include "engine/model/session.h"
#include "engine/runtime/perplexity.h"
#include "model_fixtures.h"

namespace thermocline {
namespace {

using testing::CachedModel;
using testing::GreedyIds;
using testing::LoadReference;
using testing::TestModelPath;

struct ArchCase {
  const char* file;
  // Largest |logit - llama.cpp's| at the first generated position, with its reason below.
  double logit_tolerance;
  // Prompts whose 48 greedy tokens must all equal llama.cpp's (16 on every prompt).
  int full_matches;
  double llama_cpp_ppl;  // README: llama-perplexity -c 128 on stories260K.ppl-sample.txt
};

// The tolerance on logits. llama.cpp (this CPU build) keeps the KV cache in f16 and converts Q
// and the softmax probabilities to f16 for the two attention products; we keep all of them in
// f32. f16 has 11 significant bits (relative error up to 2^-11 ~ 5e-4 per value), and over 5
// (gemma2: 26) layers that moves logits of magnitude <= 20 by up to 1.5e-2 on these files,
// against < 1e-3 from f32 reassociation alone (model_reference_test, against an f32 reference).
// Rounding exactly those values to f16 in our path brought every difference here under 2.5e-3,
// so what remains is that rounding. 2e-2 is far below what a missing bias, a wrong routing
// weight, a RoPE factor not applied or a wrong cap does (those change the perplexity by far
// more than the 0.5% checked below, e.g. rope_freqs ignored: 2.30 instead of 2.88).
constexpr ArchCase kCases[] = {
    {"stories260K-qwen2.gguf", 2e-2, 3, 2.3296},
    // Its text is poor by construction (the README): its logits decide, not its tokens.
    {"stories260K-gemma2.gguf", 2e-2, 0, 225.6949},
    {"stories260K-llama-moe.gguf", 2e-2, 3, 2.3838},
    {"stories260K-llama-ropefreqs.gguf", 2e-2, 3, 2.8811},
};

std::string Reference(const std::string& file) {
  return "arch/" + file.substr(0, file.size() - 5) + ".llama-cpp.json";
}

void CheckAgainstLlamaCpp(const ArchCase& c, int threads) {
  const std::string file = std::string("arch/") + c.file;
  const LlamaModel& model = CachedModel(TestModelPath(file));
  const nlohmann::json ref = LoadReference(Reference(c.file));
  ThreadPool pool(threads);
  int full = 0;
  for (const nlohmann::json& p : ref["prompts"]) {
    const std::string prompt = p["prompt"];
    INFO(c.file << " prompt '" << prompt << "' threads " << threads);
    const std::vector<int32_t> ids = model.tokenizer().Encode(prompt, true);
    CHECK(ids == p["prompt_ids"].get<std::vector<int32_t>>());

    auto session = Session::Create(model, &pool);
    REQUIRE(session.ok());
    REQUIRE((*session)->Eval(ids).ok());
    const std::vector<float> first = p["first_logits"];
    const float* logits = (*session)->logits();
    double max_err = 0;
    for (size_t i = 0; i < first.size(); ++i) {
      max_err = std::max(max_err, std::abs(static_cast<double>(logits[i]) - first[i]));
    }
    INFO("largest logit difference " << max_err);
    CHECK(max_err < c.logit_tolerance);
    for (const nlohmann::json& top : p["top5_first"]) {
      CHECK(std::abs(logits[top[0].get<int>()] - top[1].get<double>()) < c.logit_tolerance);
    }
    const std::vector<int32_t> expected = p["greedy_ids"];
    const std::vector<int32_t> got = GreedyIds(**session, ids, static_cast<int>(expected.size()));
    if (c.full_matches > 0) {
      CHECK(std::equal(expected.begin(), expected.begin() + 16, got.begin()));
    }
    full += got == expected;
  }
  CHECK(full >= c.full_matches);
}

TEST_CASE("qwen2, gemma2, llama MoE and llama rope_freqs match llama.cpp", "[model][arch]") {
  for (const ArchCase& c : kCases) {
    CheckAgainstLlamaCpp(c, 1);
    CheckAgainstLlamaCpp(c, 2);
  }
}

TEST_CASE("qwen2, gemma2, llama MoE and llama rope_freqs perplexity matches llama.cpp",
          "[model][arch][perplexity]") {
  const std::string text = testing::ReadTextFile(TestModelPath("stories260K.ppl-sample.txt"));
  for (const ArchCase& c : kCases) {
    INFO(c.file);
    const LlamaModel& model = CachedModel(TestModelPath(std::string("arch/") + c.file));
    ThreadPool pool(2);
    SessionOptions so;
    so.n_ctx = 128;
    so.max_batch = 128;
    auto session = Session::Create(model, &pool, so);
    REQUIRE(session.ok());
    auto r = ComputePerplexity(**session, text, 128);
    REQUIRE(r.ok());
    INFO("perplexity " << r->ppl << ", llama.cpp " << c.llama_cpp_ppl);
    CHECK(std::abs(r->ppl / c.llama_cpp_ppl - 1) < 0.005);
  }
}

}  // namespace
}  // namespace thermocline
