// Session: what a decode step costs besides its arithmetic.
#include "engine/model/session.h"

#include <sys/resource.h>

#include <fstream>
#include <string>

#include "bench/synth.h"
#include "engine/model/llama_model.h"
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

}  // namespace
}  // namespace thermocline
