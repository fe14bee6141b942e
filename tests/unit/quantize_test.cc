// Models converted by our quantizer keep the F32 model's behaviour within the bounds of each
// type: greedy tokens (f16, q8_0) and perplexity (f16 1%, q8_0 3%, q4_0 10%).
#include "engine/model/quantize.h"

#include <algorithm>
#include <cmath>

#include "engine/model/session.h"
#include "engine/runtime/perplexity.h"
#include "model_fixtures.h"

namespace thermocline {
namespace {

using testing::LoadReference;
using testing::TestModelPath;

std::unique_ptr<LlamaModel> QuantizedCopy(const std::string& model_file, GgmlType type) {
  ThreadPool pool(2);
  const std::string out =
      (testing::TempDir() / (model_file + "." + TypeName(type) + ".gguf")).string();
  auto stats = QuantizeModel(TestModelPath(model_file), out, type, pool);
  INFO(stats.status().ToString());
  REQUIRE(stats.ok());
  CHECK(stats->tensors_converted > 0);
  auto model = LlamaModel::Load(out);
  INFO(model.status().ToString());
  REQUIRE(model.ok());
  return std::move(*model);
}

std::vector<int32_t> Greedy(const LlamaModel& model, const std::vector<int32_t>& prompt, int n,
                            ThreadPool& pool) {
  auto session = Session::Create(model, &pool);
  REQUIRE(session.ok());
  REQUIRE((*session)->Eval(prompt).ok());
  std::vector<int32_t> out;
  for (int i = 0; i < n; ++i) {
    const float* l = (*session)->logits();
    const int32_t next = static_cast<int32_t>(std::max_element(l, l + model.hparams().n_vocab) - l);
    out.push_back(next);
    REQUIRE((*session)->Eval({&next, 1}).ok());
  }
  return out;
}

double Perplexity(const LlamaModel& model, ThreadPool& pool) {
  SessionOptions so;
  so.n_ctx = 128;
  so.max_batch = 128;
  auto session = Session::Create(model, &pool, so);
  REQUIRE(session.ok());
  auto r = ComputePerplexity(
      **session, testing::ReadTextFile(TestModelPath("stories260K.ppl-sample.txt")), 128);
  REQUIRE(r.ok());
  return r->ppl;
}

void CheckQuantized(const std::string& model_file, const std::string& reference_file) {
  ThreadPool pool(2);
  auto f32 = LlamaModel::Load(TestModelPath(model_file));
  REQUIRE(f32.ok());
  const double ppl_f32 = Perplexity(**f32, pool);
  const nlohmann::json ref = LoadReference(reference_file);
  struct Case {
    GgmlType type;
    double ppl_bound;
    bool greedy_equal;
  };
  for (Case c : {Case{GgmlType::kF16, 0.01, true}, Case{GgmlType::kQ8_0, 0.03, true},
                 Case{GgmlType::kQ4_0, 0.10, false}}) {
    INFO(model_file << " as " << TypeName(c.type));
    auto model = QuantizedCopy(model_file, c.type);
    const double ppl = Perplexity(*model, pool);
    INFO("ppl " << ppl << " vs f32 " << ppl_f32);
    CHECK(std::abs(ppl / ppl_f32 - 1) < c.ppl_bound);
    if (!c.greedy_equal) continue;
    for (const nlohmann::json& p : ref["prompts"]) {
      const std::vector<int32_t> expected = p["greedy_ids"];
      const std::vector<int32_t> got =
          Greedy(*model, p["prompt_ids"].get<std::vector<int32_t>>(), 16, pool);
      CHECK(std::equal(got.begin(), got.end(), expected.begin()));
    }
  }
}

TEST_CASE("quantized stories260K stays close to F32", "[quantize]") {
  CheckQuantized("stories260K.gguf", "stories260K.reference.json");
}

TEST_CASE("quantized relu-tiny stays close to F32", "[quantize]") {
  CheckQuantized("relu-tiny.f32.gguf", "relu-tiny.reference.json");
}

TEST_CASE("quantize refuses types it cannot write and missing inputs", "[quantize]") {
  ThreadPool pool(1);
  const std::string out = (testing::TempDir() / "never.gguf").string();
  auto r = QuantizeModel(TestModelPath("stories260K.gguf"), out, GgmlType::kQ4_K, pool);
  CHECK(r.status().code() == absl::StatusCode::kInvalidArgument);
  r = QuantizeModel("/nonexistent/model.gguf", out, GgmlType::kF16, pool);
  CHECK(!r.ok());
}

}  // namespace
}  // namespace thermocline
