// A sparse model holds its FFN once: the sparse copies replace the file's mapped gate, up and
// down (their pages released once copied), and prefill reads the copies, so the file's FFN pages
// stay out of the process while it decodes. Residency is read from /proc/self/smaps (the Rss of
// the model file's mapping), so this checks what the kernel counts, not our bookkeeping.
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>

#include "engine/runtime/engine.h"
#include "engine/sparse/sparse_ops.h"
#include "model_fixtures.h"

namespace thermocline {
namespace {

using testing::MappingRss;

using testing::NewEngineSession;
using testing::TestModelPath;

uint64_t FfnFileBytes(const LlamaModel& model) {
  uint64_t total = 0;
  for (const LayerWeights& L : model.layers()) {
    for (const WeightView* v : {&L.ffn_gate, &L.ffn_up, &L.ffn_down}) {
      total += v->rows * v->row_bytes;
    }
  }
  return total;
}

SparsePlan Oracle(const LlamaModel& model) {
  SparsePlan plan;
  plan.source = SparsePlan::Source::kOracle;
  plan.oracle = true;
  plan.layers.resize(model.hparams().n_layer);
  return plan;
}

const std::vector<int32_t> kPrompt = {1, 403, 261, 290, 7, 45, 300, 41, 17, 260, 33};

TEST_CASE("a sparse model holds its FFN once: the file's FFN pages leave the process", "[sparse]") {
  const std::string path = TestModelPath("relu-tiny.f32.gguf");
  if (!std::filesystem::exists(path)) THERMOCLINE_SKIP("relu-tiny.f32.gguf not found");
  auto model = LlamaModel::Load(path);  // its own mapping: no other test touches its pages
  REQUIRE(model.ok());
  const LlamaModel& m = **model;
  const void* file_data = m.layers()[0].ffn_gate.data;
  ThreadPool pool(2);
  EngineOptions o;
  o.n_ctx = 64;
  o.max_batch = 8;  // the prompt is prefilled in chunks of 8 and 3
  std::vector<int32_t> dense_ids;
  {
    // Dense from the file's mapping (no copies), so that its FFN pages are in the process.
    EngineOptions rows = o;
    rows.repack = false;
    auto dense = NewEngineSession(m, std::nullopt, pool, rows);
    dense_ids = testing::GreedyIds(dense->session(), kPrompt, 16);
  }
  const int64_t rss_dense = MappingRss(file_data);
  REQUIRE(rss_dense > 0);
  const uint64_t ffn = FfnFileBytes(m);
  INFO("file mapping Rss after dense decode " << rss_dense << ", FFN " << ffn << " bytes");
  REQUIRE(static_cast<double>(ffn) > 0.5 * rss_dense);  // the check below has room to fail

  auto sparse = NewEngineSession(m, Oracle(m), pool, o);
  const Engine& engine = sparse->engine();
  // All of it but the partial pages at tensor ends (the file is 32-byte aligned).
  const double pages_slack = 2.0 * 4096 * 3 * m.hparams().n_layer;
  const uint64_t released = engine.sparse_weights()->released_file_bytes();
  CHECK(released + pages_slack >= ffn);
  CHECK(released <= ffn);
  CHECK(engine.host_bytes() >= ffn);  // the copies (down_t F32 here: the same bytes)
  // Prefill (two chunks) and decode on the copies alone: greedy tokens of the exact (oracle)
  // sparse path equal dense, and the file's FFN pages stay out.
  CHECK(testing::GreedyIds(sparse->session(), kPrompt, 16) == dense_ids);
  const int64_t rss_sparse = MappingRss(file_data);
  INFO("file mapping Rss after sparse prefill and decode " << rss_sparse);
  CHECK(rss_sparse + static_cast<double>(ffn) <= rss_dense + pages_slack);
}

TEST_CASE("sparse prefill over the copies equals the dense prefill", "[sparse]") {
  for (const char* name : {"relu-tiny.f32.gguf", "relu-tiny.f16.gguf"}) {
    const std::string path = TestModelPath(name);
    if (!std::filesystem::exists(path)) THERMOCLINE_SKIP(std::string(name) + " not found");
    INFO(name);
    const LlamaModel& m = testing::CachedModel(path);
    ThreadPool pool(2);
    EngineOptions o;
    o.n_ctx = 64;
    o.max_batch = 8;
    auto dense = NewEngineSession(m, std::nullopt, pool, o);
    auto sparse = NewEngineSession(m, Oracle(m), pool, o);
    const int64_t n_vocab = m.hparams().n_vocab;
    std::vector<float> want(kPrompt.size() * n_vocab), got(kPrompt.size() * n_vocab);
    REQUIRE(dense->session().Eval(kPrompt, want.data()).ok());
    REQUIRE(sparse->session().Eval(kPrompt, got.data()).ok());
    double diff = 0, scale = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      diff = std::max(diff, std::fabs(double{got[i]} - want[i]));
      scale = std::max(scale, std::fabs(double{want[i]}));
    }
    // The same neurons (every one) summed in another order, and for F16 the dense path's
    // activations rounded to F16 where the axpy keeps them F32: 1e-5 relative per F32 layer,
    // F16's 2^-11 rounding of the FFN input (relative 5e-4) through 4 layers: 5e-3. A wrong row,
    // slot or token moves logits by O(1).
    const bool f16 = std::string(name).find("f16") != std::string::npos;
    CHECK(diff / scale <= (f16 ? 5e-3 : 1e-4));
  }
}

// out = act · w_t token by token, against the scalar reference of the one-token axpy.
void CheckAxpyTokens(GgmlType type, int64_t n_embd, int64_t n_ff, int64_t n, ThreadPool& pool) {
  std::mt19937 rng(5);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> dense(n_ff * n_embd);
  float wmax = 0;
  for (float& v : dense) {
    v = dist(rng);
    wmax = std::max(wmax, std::fabs(v));
  }
  const TypeKernels* k = KernelsFor(type, Isa::kScalar);
  REQUIRE(k != nullptr);
  const size_t row_bytes = RowBytes(type, n_embd);
  std::vector<uint8_t> data(row_bytes * n_ff);
  for (int64_t r = 0; r < n_ff; ++r) {
    k->from_float(dense.data() + r * n_embd, data.data() + r * row_bytes, n_embd);
  }
  const WeightView w_t{type, n_ff, n_embd, data.data(), row_bytes};
  std::vector<float> act(n * n_ff);
  for (int64_t i = 0; i < n * n_ff; ++i) act[i] = i % 3 == 0 ? 0.0f : std::max(0.0f, dist(rng));
  std::vector<int32_t> all(n_ff);
  for (int32_t i = 0; i < n_ff; ++i) all[i] = i;
  AxpyTokensScratch scratch;
  scratch.Reserve(n + 2, n_ff);
  for (Isa isa : AvailableIsas()) {
    std::vector<float> out(n * n_embd, 77.0f);
    SparseAxpyTokens(pool, isa, w_t, act.data(), n, out.data(), scratch);
    for (int64_t t = 0; t < n; ++t) {
      std::vector<float> ref(n_embd);
      SparseAxpyReference(w_t, all.data(), act.data() + t * n_ff, n_ff, ref.data());
      double mag = 0;
      for (int64_t i = 0; i < n_ff; ++i) mag += std::fabs(act[t * n_ff + i]);
      for (int64_t i = 0; i < n_embd; ++i) {
        INFO(TypeName(type) << " " << IsaName(isa) << " n_embd " << n_embd << " n_ff " << n_ff
                            << " token " << t << " of " << n << " column " << i);
        // Float sums of n_ff terms against the reference's double sum of the same dequantized
        // weights: within n_ff float roundings of Σ|act|·max|w| (a block scale can round a
        // weight a little past the largest input).
        REQUIRE(std::fabs(out[t * n_embd + i] - ref[i]) <= n_ff * 1.2e-7 * mag * 1.1 * wmax + 1e-6);
      }
    }
  }
}

TEST_CASE("the prefill axpy over down_t equals the one-token reference", "[sparse]") {
  for (int threads : {1, 2, 3}) {
    ThreadPool pool(threads);
    for (GgmlType type :
         {GgmlType::kF32, GgmlType::kF16, GgmlType::kBF16, GgmlType::kQ8_0, GgmlType::kQ4_0}) {
      const bool blocked = TypeInfo(type).block_size > 1;
      CheckAxpyTokens(type, blocked ? 96 : 37, 67, 5, pool);
      // A slice narrower than the rows: 4096 rows of 2048 columns (slices of cache size).
      CheckAxpyTokens(type, blocked ? 2048 : 2051, blocked ? 4096 : 1031, 3, pool);
    }
  }
}

}  // namespace
}  // namespace thermocline
