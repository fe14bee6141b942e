// Session: what a decode step costs besides its arithmetic.
#include "engine/model/session.h"

#include <sys/resource.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <string>

#include "bench/synth.h"
#include "engine/model/llama_model.h"
#include "model_fixtures.h"
#include "test_util.h"

namespace thermocline {
namespace {

int64_t MinorFaults() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_minflt;
}

// Whether the kernel gives transparent huge pages to memory advised MADV_HUGEPAGE.
bool HugePagesOnAdvice() {
  std::ifstream in("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string modes;
  std::getline(in, modes);
  return modes.find("[always]") != std::string::npos ||
         modes.find("[madvise]") != std::string::npos;
}

TEST_CASE("decode steps write the KV cache without page faults", "[session]") {
  SynthOptions o;
  o.n_layer = 2;
  o.n_embd = 256;
  o.n_head = 4;
  o.n_head_kv = 4;  // a row of K is 1 KB: on 4 KB pages, a fault every fourth position
  o.n_ctx = 2048;   // 2 MB of K per layer
  o.n_ff = 512;
  o.type = GgmlType::kQ8_0;
  ThreadPool pool(2);
  const std::string path = (testing::TempDir() / "session-kv.gguf").string();
  const absl::Status made = SynthesizeModel(o, path, pool);
  INFO(made.ToString());
  REQUIRE(made.ok());
  auto model = LlamaModel::Load(path);
  REQUIRE(model.ok());
  auto session = Session::Create(**model, &pool);
  REQUIRE(session.ok());
  if (!HugePagesOnAdvice()) THERMOCLINE_SKIP("transparent huge pages are off on this machine");
#if defined(__SANITIZE_ADDRESS__)
  // ASan's allocator and shadow memory fault pages of their own.
  THERMOCLINE_SKIP("page faults are not the program's own under AddressSanitizer");
#endif
  int32_t token = 7;
  REQUIRE((*session)->Eval({&token, 1}).ok());
  const int64_t before = MinorFaults();
  constexpr int kSteps = 64;
  for (int i = 0; i < kSteps; ++i) {
    token = static_cast<int32_t>((token * 31 + 11) % o.n_vocab);
    REQUIRE((*session)->Eval({&token, 1}).ok());
  }
  // 4 KB pages: 64 rows of 1 KB in K and V of 2 layers, 64 faults.
  CHECK(MinorFaults() - before < 8);
}

// The F16 cache holds half the bytes and computes what the F32 one does within half's rounding.
TEST_CASE("an F16 KV cache decodes as the F32 one does", "[session]") {
  const LlamaModel& model = testing::CachedModel(testing::TestModelPath("stories260K.gguf"));
  const LlamaHparams& h = model.hparams();
  CHECK(KvCacheBytes(h, 256, KvType::kF16) * 2 == KvCacheBytes(h, 256, KvType::kF32));
  CHECK(KvCacheBytes(h, 256, KvType::kF32) ==
        static_cast<uint64_t>(h.n_layer) * 256 * (h.kv_dim() + h.v_dim()) * sizeof(float));
  ThreadPool pool(2);
  SessionOptions o;
  o.n_ctx = 256;
  o.kv_type = KvType::kF16;
  auto half = Session::Create(model, &pool, o);
  o.kv_type = KvType::kF32;
  auto full = Session::Create(model, &pool, o);
  REQUIRE(half.ok());
  REQUIRE(full.ok());
  CHECK((*half)->kv_type() == KvType::kF16);
  CHECK((*full)->kv_type() == KvType::kF32);
  const std::vector<int32_t> prompt = model.tokenizer().Encode("Once upon a time", true);
  REQUIRE((*half)->Eval(prompt).ok());
  REQUIRE((*full)->Eval(prompt).ok());
  const int64_t n_vocab = h.n_vocab;
  double max_diff = 0;
  for (int step = 0; step < 64; ++step) {
    const float* a = (*half)->logits();
    const float* b = (*full)->logits();
    for (int64_t i = 0; i < n_vocab; ++i)
      max_diff = std::max(max_diff, double{std::fabs(a[i] - b[i])});
    // The F32 cache's greedy token fed to both, so that one near-tie cannot part them.
    const int32_t next = static_cast<int32_t>(std::max_element(b, b + n_vocab) - b);
    REQUIRE((*half)->Eval({&next, 1}).ok());
    REQUIRE((*full)->Eval({&next, 1}).ok());
  }
  WARN("F16 vs F32 KV cache, 64 positions: max logit difference " << max_diff);
  // stories260K's weights are F32 (no activation quantization): half's 2^-11 relative rounding
  // of q, K, V and the weights moves its logits (spread over about 20) by hundredths.
  CHECK(max_diff > 0);  // the F16 cache is in use
  CHECK(max_diff < 0.1);
}

}  // namespace
}  // namespace thermocline
