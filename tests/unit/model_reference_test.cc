// The dense CPU path against reference outputs computed outside this project
// (../shared/models/*.reference.json, llama.cpp's perplexity figures).
#include <algorithm>
#include <cmath>
#include <numeric>

#include "engine/model/session.h"
#include "engine/runtime/perplexity.h"
#include "model_fixtures.h"

namespace thermocline {
namespace {

using testing::CachedModel;
using testing::LoadReference;
using testing::TestModelPath;

using testing::GreedyIds;

void CheckAgainstReference(const std::string& model_file, const std::string& reference_file,
                           int threads) {
  const LlamaModel& model = CachedModel(TestModelPath(model_file));
  const nlohmann::json ref = LoadReference(reference_file);
  ThreadPool pool(threads);
  for (const nlohmann::json& p : ref["prompts"]) {
    const std::string prompt = p["prompt"];
    INFO(model_file << " prompt '" << prompt << "' threads " << threads);
    const std::vector<int32_t> ids = model.tokenizer().Encode(prompt, true);
    CHECK(ids == p["prompt_ids"].get<std::vector<int32_t>>());

    auto session = Session::Create(model, &pool);
    REQUIRE(session.ok());
    REQUIRE((*session)->Eval(ids).ok());
    // The reference is an fp32 PyTorch/llama.cpp forward pass; ours sums in another order.
    // Float32 rounding (eps 1.2e-7) over dot products of length <= 512 and 5-6 layers stays
    // far below 1e-3 absolute on logits of magnitude <= 20 (about 5e-5 relative); a wrong
    // RoPE, norm or activation moves logits by > 0.1.
    const std::vector<float> first = p["first_logits"];
    const float* logits = (*session)->logits();
    double max_err = 0;
    for (size_t i = 0; i < first.size(); ++i) {
      max_err = std::max(max_err, std::abs(static_cast<double>(logits[i]) - first[i]));
    }
    CHECK(max_err < 1e-3);
    for (const nlohmann::json& top : p["top5_first"]) {
      const int id = top[0];
      const double logit = top[1];
      CHECK(std::abs(logits[id] - logit) < 1e-3);
    }
    (*session)->Reset();
    const std::vector<int32_t> expected = p["greedy_ids"];
    CHECK(GreedyIds(**session, ids, static_cast<int>(expected.size())) == expected);
  }
}

TEST_CASE("stories260K (SwiGLU, GQA, tied head) matches the reference", "[model]") {
  CheckAgainstReference("stories260K.gguf", "stories260K.reference.json", 1);
  CheckAgainstReference("stories260K.gguf", "stories260K.reference.json", 2);
}

TEST_CASE("relu-tiny (ReGLU, untied head) matches the reference", "[model]") {
  const LlamaModel& model = CachedModel(TestModelPath("relu-tiny.f32.gguf"));
  CHECK(model.hparams().activation == FfnActivation::kRelu);
  CheckAgainstReference("relu-tiny.f32.gguf", "relu-tiny.reference.json", 2);
}

TEST_CASE("relu-tiny F16 gives the reference greedy tokens", "[model]") {
  const LlamaModel& model = CachedModel(TestModelPath("relu-tiny.f16.gguf"));
  const nlohmann::json ref = LoadReference("relu-tiny.reference.json");
  ThreadPool pool(2);
  for (const nlohmann::json& p : ref["prompts"]) {
    auto session = Session::Create(model, &pool);
    REQUIRE(session.ok());
    const std::vector<int32_t> expected = p["greedy_ids"];
    CHECK(GreedyIds(**session, p["prompt_ids"].get<std::vector<int32_t>>(),
                    static_cast<int>(expected.size())) == expected);
  }
}

TEST_CASE("prefill in chunks equals token-by-token evaluation", "[model]") {
  const LlamaModel& model = CachedModel(TestModelPath("stories260K.gguf"));
  ThreadPool pool(2);
  const std::vector<int32_t> ids = model.tokenizer().Encode(
      "Once upon a time, there was a little girl named Lily. She loved to play outside.", true);
  SessionOptions batched;
  batched.max_batch = 7;  // uneven chunks
  auto a = Session::Create(model, &pool, batched);
  SessionOptions single;
  single.max_batch = 1;
  auto b = Session::Create(model, &pool, single);
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  REQUIRE((*a)->Eval(ids).ok());
  REQUIRE((*b)->Eval(ids).ok());
  for (int64_t i = 0; i < model.hparams().n_vocab; ++i) {
    // Same arithmetic per token except the matmul grouping: float reassociation only.
    CHECK(std::abs((*a)->logits()[i] - (*b)->logits()[i]) < 1e-4f);
  }
}

TEST_CASE("stories260K perplexity matches llama.cpp", "[model][perplexity]") {
  const LlamaModel& model = CachedModel(TestModelPath("stories260K.gguf"));
  ThreadPool pool(2);
  SessionOptions so;
  so.n_ctx = 128;
  so.max_batch = 128;
  auto session = Session::Create(model, &pool, so);
  REQUIRE(session.ok());
  auto r = ComputePerplexity(
      **session, testing::ReadTextFile(TestModelPath("stories260K.ppl-sample.txt")), 128);
  REQUIRE(r.ok());
  // llama-perplexity -c 128 -b 128: chunks 1.7867, 1.7149, 2.0708, 2.2991; final 2.2991.
  REQUIRE(r->chunk_ppl.size() == 4);
  const double llama_cpp[] = {1.7867, 1.7149, 2.0708, 2.2991};
  for (int i = 0; i < 4; ++i) CHECK(std::abs(r->chunk_ppl[i] / llama_cpp[i] - 1) < 0.005);
  CHECK(std::abs(r->ppl / 2.2991 - 1) < 0.005);
}

TEST_CASE("a session refuses tokens past its context and bad ids", "[model]") {
  const LlamaModel& model = CachedModel(TestModelPath("stories260K.gguf"));
  ThreadPool pool(1);
  SessionOptions so;
  so.n_ctx = 8;
  auto session = Session::Create(model, &pool, so);
  REQUIRE(session.ok());
  std::vector<int32_t> nine(9, 5);
  absl::Status s = (*session)->Eval(nine);
  CHECK(s.code() == absl::StatusCode::kOutOfRange);
  CHECK_THAT(std::string(s.message()), Catch::Contains("context"));
  const int32_t bad = 100000;
  s = (*session)->Eval({&bad, 1});
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK((*session)->n_past() == 0);
}

}  // namespace
}  // namespace thermocline
