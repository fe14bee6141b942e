// Models converted by our quantizer keep the F32 model's behaviour within the bounds of each
// type: greedy tokens (f16, q8_0) and perplexity (f16 1%, q8_0 3%, q4_0 10%); and every mix of
// llama-quantize writes the tensors llama-quantize writes (../shared/models/kquants/).
#include "engine/model/quantize.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>

#include "engine/gguf/gguf.h"
#include "engine/model/session.h"
#include "engine/runtime/perplexity.h"
#include "kquants_fixtures.h"
#include "model_fixtures.h"

namespace thermocline {
namespace {

using testing::LoadReference;
using testing::TestModelPath;

std::string QuantizedPath(const std::string& model_file, const std::string& mix) {
  std::string base = std::filesystem::path(model_file).filename().string();
  return (testing::TempDir() / (base + "." + mix + ".gguf")).string();
}

std::unique_ptr<LlamaModel> QuantizedCopy(const std::string& model_file, const std::string& mix) {
  ThreadPool pool(2);
  const std::string out = QuantizedPath(model_file, mix);
  REQUIRE(FindQuantMix(mix) != nullptr);
  auto stats = QuantizeModel(TestModelPath(model_file), out, *FindQuantMix(mix), pool);
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
    const char* mix;
    double ppl_bound;
    bool greedy_equal;
  };
  for (Case c : {Case{"f16", 0.01, true}, Case{"q8_0", 0.03, true}, Case{"q4_0", 0.10, false}}) {
    INFO(model_file << " as " << c.mix);
    auto model = QuantizedCopy(model_file, c.mix);
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

// The kit's files were made by llama-quantize (no importance matrix) from stories-wide.f32.gguf:
// our quantize of the same input gives every tensor the same type and the same bytes (the mix
// rules and the quantizers are llama.cpp's), so the files load and score alike.
TEST_CASE("quantize writes llama-quantize's tensors for every mix", "[quantize][kquants]") {
  const std::string f32 = "kquants/stories-wide.f32.gguf";
  if (!std::filesystem::exists(TestModelPath(f32))) THERMOCLINE_SKIP("kquants/ not found");
  ThreadPool pool(2);
  for (const char* mix :
       {"q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q2_k", "q3_k_s", "q3_k_m", "q3_k_l", "q4_k_s",
        "q4_k_m", "q5_k_s", "q5_k_m", "q6_k", "iq4_nl", "iq4_xs"}) {
    INFO("mix " << mix);
    auto ours = QuantizedCopy(f32, mix);
    auto theirs =
        GgufFile::Open(TestModelPath(std::string("kquants/stories-wide.") + mix + ".gguf"));
    REQUIRE(theirs.ok());
    const GgufFile& mine = ours->gguf();
    REQUIRE(mine.tensors().size() == (*theirs)->tensors().size());
    for (const GgufTensorInfo& t : (*theirs)->tensors()) {
      INFO("tensor " << t.name);
      const GgufTensorInfo* m = mine.FindTensor(t.name);
      REQUIRE(m != nullptr);
      CHECK(TypeName(m->type) == std::string(TypeName(t.type)));
      REQUIRE(m->size_bytes == t.size_bytes);
      CHECK(std::memcmp(m->data, t.data, t.size_bytes) == 0);
    }
    CHECK(mine.GetInt("general.file_type").value_or(-1) ==
          (*theirs)->GetInt("general.file_type").value_or(-2));
    // Within 1% of llama.cpp's perplexity on its file of the same mix (the same tensors; what
    // is left is the two engines' arithmetic, kquants_reference_test.cc).
    const double llama_ppl = testing::LlamaCppStoriesWidePerplexity().at(mix);
    CHECK(std::abs(Perplexity(*ours, pool) / llama_ppl - 1) < 0.01);
  }
}

TEST_CASE("quantize refuses mixes it cannot write and missing inputs", "[quantize]") {
  CHECK(FindQuantMix("q4_k") == nullptr);
  CHECK(FindQuantMix("iq2_xxs") == nullptr);
  CHECK(FindQuantMix("q4_k_m") != nullptr);
  CHECK(FindQuantMix("Q4_K_M") == FindQuantMix("q4_k_m"));  // as llama-quantize's users write it
  ThreadPool pool(1);
  const std::string out = (testing::TempDir() / "never.gguf").string();
  auto r = QuantizeModel("/nonexistent/model.gguf", out, *FindQuantMix("f16"), pool);
  CHECK(!r.ok());
  // Not over the input, named directly or through a link: it would replace the model it reads.
  const auto [copy, link] = testing::ScratchModelCopy("stories260K.gguf", "quantize-input");
  const auto size = std::filesystem::file_size(copy);
  for (const std::filesystem::path& target : {copy, link}) {
    auto over = QuantizeModel(copy.string(), target.string(), *FindQuantMix("q4_0"), pool);
    INFO(target.string());
    REQUIRE(absl::IsInvalidArgument(over.status()));
    CHECK(over.status().message().find("is the input file") != std::string::npos);
  }
  CHECK(std::filesystem::file_size(copy) == size);
}

TEST_CASE("mix rules match llama-quantize's tensor types", "[quantize]") {
  // stories-wide: 5 layers, 32 heads over 16 KV heads (n_gqa 2); use_more_bits picks layers
  // 2 and 4 of 5. The kit's README lists what llama-quantize wrote.
  MixContext ctx;
  ctx.n_layer = 5;
  ctx.n_gqa = 2;
  ctx.n_attention_wv = 5;
  auto types = [&](const char* mix, const char* tensor) {
    MixCounters c;
    std::string out;
    for (int l = 0; l < 5; ++l) {
      c.i_attention_wv = c.i_ffn_down = l;
      out += TypeName(TensorTypeFor(*FindQuantMix(mix), ctx, c,
                                    "blk." + std::to_string(l) + "." + tensor, 256));
      out += l < 4 ? " " : "";
    }
    return out;
  };
  CHECK(types("q4_k_m", "attn_v.weight") == "q4_K q4_K q6_K q4_K q6_K");
  CHECK(types("q4_k_m", "ffn_down.weight") == "q4_K q4_K q6_K q4_K q6_K");
  CHECK(types("q4_k_s", "attn_v.weight") == "q5_K q5_K q5_K q5_K q4_K");
  CHECK(types("q3_k_m", "attn_v.weight") == "q5_K q5_K q4_K q4_K q4_K");
  CHECK(types("q3_k_m", "attn_output.weight") == "q4_K q4_K q4_K q4_K q4_K");
  CHECK(types("q2_k", "ffn_down.weight") == "q3_K q3_K q3_K q3_K q3_K");
  CHECK(types("q2_k", "ffn_gate.weight") == "q2_K q2_K q2_K q2_K q2_K");
  MixCounters c;
  CHECK(TensorTypeFor(*FindQuantMix("q4_0"), ctx, c, "output.weight", 256) == GgmlType::kQ6_K);
  CHECK(TensorTypeFor(*FindQuantMix("q8_0"), ctx, c, "output.weight", 256) == GgmlType::kQ8_0);
  // Rows a K-quant's super-blocks do not divide fall back as llama-quantize's do.
  bool fallback = false;
  CHECK(TensorTypeFor(*FindQuantMix("q4_k_m"), ctx, c, "blk.0.ffn_up.weight", 160, &fallback) ==
        GgmlType::kQ5_0);
  CHECK(fallback);
  CHECK(TensorTypeFor(*FindQuantMix("q6_k"), ctx, c, "blk.0.ffn_up.weight", 160) ==
        GgmlType::kQ8_0);
  CHECK(TensorTypeFor(*FindQuantMix("q4_k_m"), ctx, c, "blk.0.ffn_up.weight", 172) ==
        GgmlType::kF16);
  CHECK(!QuantizedByMix("blk.0.attn_norm.weight", 1));
  CHECK(!QuantizedByMix("blk.0.ffn_gate_inp.weight", 2));
  CHECK(QuantizedByMix("blk.0.ffn_up.weight", 2));
}

}  // namespace
}  // namespace thermocline
