// The SwiGLU sparse methods in whole GPU layers: input-sparse (docs/sparse.md "Input-sparse"):
// the column-sparse mat-vec the device runs, against the CPU's reference, for every layout form;
// the device memory an input-sparse layer takes; the front door's placement of an input-sparse
// plan, whose tokens must be the CPU input-sparse path's; and gate-first layers likewise. The
// front-door cases run on the CPU stand-in device ([gpu], every machine) and on CUDA ([cuda],
// where a device exists).
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <iterator>
#include <random>

#include "bench/cpu_device.h"
#include "cuda_test_util.h"
#include "engine/gpu/gpu_backend.h"
#include "engine/gpu/gpu_layers.h"
#include "engine/runtime/engine.h"
#include "engine/sparse/column_sparse.h"
#include "model_fixtures.h"
#include "offline/sparse_source.h"
#include "sparse_fixtures.h"

namespace thermocline {
namespace {

using testing::CachedModel;
using testing::GreedyIds;
using testing::InputSparsePlan;
using testing::NewEngineSession;
using testing::TestModelPath;

const std::vector<int32_t> kPrompt = {1, 403, 261, 290, 7, 45, 300};

// A file of each layout form: Q4_0 (4-bit), Q8_0 (8-bit), Q4_K_M (4-bit with mins, and 8-bit
// requantized Q6_K), F32 (the float form, W's columns as rows).
const char* const kFiles[] = {"kquants/stories-wide.q4_0.gguf", "kquants/stories-wide.q8_0.gguf",
                              "kquants/stories-wide.q4_k_m.gguf", "stories260K.gguf"};

// F32 KV caches on both sides and a prompt that crosses the batch's chunks, as engine_test.cc.
EngineOptions Options(const gpu::Device* device) {
  EngineOptions o;
  o.kv_type = KvType::kF32;
  o.n_ctx = 96;
  o.max_batch = 4;
  o.device = device;
  return o;
}

std::vector<float> PromptLogits(Session& s) {
  std::vector<float> all(kPrompt.size() * s.model().hparams().n_vocab);
  s.Reset();
  REQUIRE(s.Eval(kPrompt, all.data()).ok());
  return all;
}

double MaxRelDiff(const float* got, const float* want, size_t n) {
  double diff = 0, scale = 0;
  for (size_t i = 0; i < n; ++i) {
    diff = std::max(diff, std::fabs(double{got[i]} - want[i]));
    scale = std::max(scale, std::fabs(double{want[i]}));
  }
  return diff / std::max(scale, 1e-6);
}

// The kept entries of x (|x_i| > threshold, x_i != 0) as the CPU's input-sparse path takes them.
struct Kept {
  std::vector<int32_t> idx;
  std::vector<float> val;
  ColumnInput input;
};
void Keep(const std::vector<float>& x, float threshold, Kept* k) {
  k->idx.clear();
  k->val.clear();
  for (size_t i = 0; i < x.size(); ++i) {
    if (std::fabs(x[i]) > threshold && x[i] != 0.0f) {
      k->idx.push_back(static_cast<int32_t>(i));
      k->val.push_back(x[i]);
    }
  }
  k->input.Reserve(static_cast<int64_t>(x.size()));
  k->input.Set(k->idx.data(), k->val.data(), static_cast<int64_t>(k->idx.size()));
}

struct Matrix {
  GgmlType type;
  int64_t out, in;
};
// Every form and its odd sizes: outputs under one line (72), several lines with a partial one
// (200, 4-bit: 2 lines), inputs of three blocks; for the float form, inputs that are not
// whole blocks. The last three take the device's kernel past one tile of outputs and one block
// per range of inputs (several of each, the last tile partial).
const Matrix kMatrices[] = {
    {GgmlType::kQ4_0, 200, 96},    {GgmlType::kQ4_0, 72, 96},     {GgmlType::kQ8_0, 200, 96},
    {GgmlType::kQ8_0, 72, 64},     {GgmlType::kQ4_K, 200, 256},   {GgmlType::kQ6_K, 72, 256},
    {GgmlType::kQ5_0, 200, 96},    {GgmlType::kF16, 200, 96},     {GgmlType::kF32, 72, 50},
    {GgmlType::kQ8_0, 1100, 4096}, {GgmlType::kQ4_0, 2100, 1024}, {GgmlType::kQ4_K, 1100, 4096},
};

TEST_CASE("the stand-in's column mat-vec is the CPU reference's, every layout form", "[gpu]") {
  ThreadPool pool(1);
  for (const Matrix& m : kMatrices) {
    INFO(TypeName(m.type) << " " << m.out << " x " << m.in);
    const OwnedWeight w = cuda_test::RandomWeight(m.type, m.out, m.in, 11);
    // The integer form (a CPU with AVX2 or more; F16 and F32 always take the float one) and the
    // float form (the scalar ISA's).
    for (Isa isa : {BestIsa(), Isa::kScalar}) {
      absl::StatusOr<ColumnWeight> c = ColumnWeight::Build(pool, w.view, isa);
      REQUIRE(c.ok());
      const gpu::ColumnLayout layout = c->layout();
      REQUIRE(layout.in == m.in);
      REQUIRE(layout.out == m.out);
      for (float threshold : {-1.0f, 0.0f, 0.5f, 0.97f, 2.0f}) {
        INFO("ISA " << IsaName(isa) << ", threshold " << threshold);
        const std::vector<float> x = cuda_test::RandomFloats(m.in, 5);
        Kept kept;
        Keep(x, threshold, &kept);
        std::vector<float> want(m.out, 0.0f), got(m.out, -1.0f);
        if (c->form() == ColumnWeight::Form::kFloat) {
          ColumnSparseAdd(Isa::kScalar, *c, kept.input, 0, m.out, want.data());
        } else {
          ColumnSparseAddReference(*c, kept.input, 0, m.out, want.data());
        }
        ColumnMatVecOnHost(layout, x.data(), threshold, got.data());
        if (c->form() == ColumnWeight::Form::kFloat) {
          // The same products summed in the same order; the scalar axpy may fuse them.
          for (int64_t o = 0; o < m.out; ++o) CHECK(std::fabs(got[o] - want[o]) <= 1e-5);
        } else {
          // The same integer sums, scaled and added block by block in the same order.
          CHECK(got == want);
        }
        if (kept.idx.empty()) {
          CHECK(std::all_of(got.begin(), got.end(), [](float v) { return v == 0.0f; }));
        }
      }
      // Entries so small that a block's int8 scale (its largest / 127) is under FLT_MIN: the
      // block counts as zero on both sides, rather than quantizing by an infinite 1 / scale.
      if (c->form() != ColumnWeight::Form::kFloat) {
        std::vector<float> tiny = cuda_test::RandomFloats(m.in, 6);
        for (float& v : tiny) v *= 1e-37f;
        Kept kept;
        Keep(tiny, -1.0f, &kept);
        REQUIRE_FALSE(kept.idx.empty());
        std::vector<float> want(m.out, 0.0f), got(m.out, -1.0f);
        ColumnSparseAddReference(*c, kept.input, 0, m.out, want.data());
        ColumnMatVecOnHost(layout, tiny.data(), -1.0f, got.data());
        CHECK(got == want);
        CHECK(std::all_of(got.begin(), got.end(), [](float v) { return v == 0.0f; }));
      }
    }
  }
}

TEST_CASE("the device's column grid covers every output and input once", "[gpu]") {
  using F = gpu::ColumnLayout::Form;
  for (F form : {F::kInt4, F::kInt8, F::kRows}) {
    for (int64_t out : {1, 72, 200, 2560, 11008}) {
      for (int64_t in : {32, 96, 2048, 11008}) {
        gpu::ColumnLayout c;
        c.form = form;
        c.in = in;
        c.out = out;
        const int64_t line = form == F::kInt4 ? 128 : 64;
        c.out_pad = (out + line - 1) / line * line;
        c.row_bytes = static_cast<size_t>(form == F::kInt4 ? c.out_pad / 2 : c.out_pad);
        const gpu::ColumnGrid g = gpu::ColumnGridOf(c);
        INFO(static_cast<int>(form) << " " << out << " x " << in);
        const int64_t units = form == F::kRows ? out : static_cast<int64_t>(c.row_bytes / 4);
        const int64_t blocks = (in + 31) / 32;
        CHECK(g.tiles * gpu::kColumnThreads >= units);
        CHECK((g.tiles - 1) * gpu::kColumnThreads < units);
        CHECK(g.splits * g.blocks_per_split >= blocks);
        CHECK((g.splits - 1) * g.blocks_per_split < blocks);  // no range without blocks
        // About 256 thread blocks: at most a range per tile more, or one range.
        CHECK((g.tiles * g.splits < 256 + g.tiles || g.splits == 1));
      }
    }
  }
}

TEST_CASE("CUDA column-sparse mat-vec against the CPU reference, every layout form", "[cuda]") {
  REQUIRE_GPU_OPS(ops);
  ThreadPool pool(1);
  for (const Matrix& m : kMatrices) {
    INFO(TypeName(m.type) << " " << m.out << " x " << m.in);
    const OwnedWeight w = cuda_test::RandomWeight(m.type, m.out, m.in, 11);
    for (Isa isa : {BestIsa(), Isa::kScalar}) {  // the integer form (AVX2 and up), the float one
      absl::StatusOr<ColumnWeight> c = ColumnWeight::Build(pool, w.view, isa);
      REQUIRE(c.ok());
      for (float threshold : {-1.0f, 0.5f, 0.97f, 2.0f}) {
        INFO("ISA " << IsaName(isa) << ", threshold " << threshold);
        const std::vector<float> x = cuda_test::RandomFloats(m.in, 5);
        std::vector<float> want(m.out), got(m.out, -1.0f);
        ColumnMatVecOnHost(c->layout(), x.data(), threshold, want.data());
        REQUIRE_OK(ops->ColumnMatVec(c->layout(), x.data(), threshold, got.data()));
        // The device adds its ranges' partial sums after each range's blocks, the host block by
        // block: the same terms in another order. A few float roundings of the largest term.
        double scale = 1e-6;
        for (float v : want) scale = std::max(scale, std::fabs(double{v}));
        for (int64_t o = 0; o < m.out; ++o) CHECK(std::fabs(got[o] - want[o]) <= 1e-5 * scale);
      }
      if (c->form() != ColumnWeight::Form::kFloat) {  // blocks too small to quantize: zero
        std::vector<float> tiny = cuda_test::RandomFloats(m.in, 6);
        for (float& v : tiny) v *= 1e-37f;
        std::vector<float> got(m.out, -1.0f);
        REQUIRE_OK(ops->ColumnMatVec(c->layout(), tiny.data(), -1.0f, got.data()));
        CHECK(std::all_of(got.begin(), got.end(), [](float v) { return v == 0.0f; }));
      }
    }
  }
}

TEST_CASE("CUDA gate-first compaction lists the slots the CPU's score keeps", "[cuda]") {
  REQUIRE_GPU_OPS(ops);
  // Sizes under, at and past the kernel's one block of 1024 threads, and a 7B-class n_ff.
  for (int64_t n : {1, 1000, 1025, 5632, 14336}) {
    std::vector<float> gate = cuda_test::RandomFloats(n, 21, -4.0f, 4.0f);
    gate[0] = -100.0f;  // exp(100) overflows: silu is -0, a score of 0
    const std::vector<float> scale = cuda_test::RandomFloats(n, 22, 0.5f, 2.0f);
    for (bool scaled : {false, true}) {
      for (float threshold : {-1.0f, 0.1f, 0.5f}) {
        INFO(n << " slots, " << (scaled ? "scaled" : "unscaled") << ", threshold " << threshold);
        std::vector<int32_t> want;
        std::vector<double> score(n);
        for (int64_t k = 0; k < n; ++k) {
          const double g = gate[k];
          score[k] = std::fabs(g / (1.0 + std::exp(-g))) * (scaled ? scale[k] : 1.0);
          if (score[k] > threshold) want.push_back(static_cast<int32_t>(k));
        }
        absl::StatusOr<gpu::GpuOps::GateFirstList> got = ops->GateFirstCompact(
            gate, scaled ? absl::Span<const float>(scale) : absl::Span<const float>(), threshold);
        REQUIRE_OK(got.status());
        REQUIRE(got->idx.size() == got->gate.size());
        CHECK(std::is_sorted(got->idx.begin(), got->idx.end()));
        CHECK(std::adjacent_find(got->idx.begin(), got->idx.end()) == got->idx.end());
        for (size_t j = 0; j < got->idx.size(); ++j) {
          REQUIRE(got->idx[j] >= 0);
          REQUIRE(got->idx[j] < n);
          CHECK(got->gate[j] == gate[got->idx[j]]);
        }
        // The same slots, but for a score within float rounding of the threshold (the device's
        // expf is not the host's exp).
        std::vector<int32_t> differ;
        std::set_symmetric_difference(want.begin(), want.end(), got->idx.begin(), got->idx.end(),
                                      std::back_inserter(differ));
        for (int32_t k : differ) CHECK(std::fabs(score[k] - threshold) <= 1e-5);
        CHECK(differ.size() <= 2);
      }
    }
  }
}

TEST_CASE("GPU layers: an input-sparse layer takes its layouts' bytes, not the matrices'",
          "[gpu]") {
  const std::string path = TestModelPath("kquants/stories-wide.q4_0.gguf");
  if (!std::filesystem::exists(path)) THERMOCLINE_SKIP("stories-wide.q4_0.gguf not found");
  const LlamaModel& model = CachedModel(path);
  const LlamaHparams& h = model.hparams();
  ThreadPool pool(1);
  auto engine = Engine::Create(model, InputSparsePlan(model, 0.3f), Options(nullptr), pool);
  REQUIRE(engine.ok());
  const std::vector<gpu::InputSparseLayer> layouts =
      DeviceInputSparse(*(*engine)->sparse_weights());
  REQUIRE(static_cast<int64_t>(layouts.size()) == h.n_layer);
  auto dense = gpu::PlanWholeLayers(model, 1, 96, 4, gpu::MemoryBudget::kUnlimited, KvType::kF32);
  auto sparse =
      gpu::PlanWholeLayers(model, 1, 96, 4, gpu::MemoryBudget::kUnlimited, KvType::kF32, layouts);
  REQUIRE(dense.ok());
  REQUIRE(sparse.ok());
  const gpu::GpuLayersMemory d = gpu::ComputeGpuLayersMemory(*dense);
  const gpu::GpuLayersMemory s = gpu::ComputeGpuLayersMemory(*sparse);
  const LayerWeights& L = model.layers()[0];
  const gpu::InputSparseLayer& y = layouts[0];
  auto rounded = [](uint64_t b) { return gpu::MemoryBudget::Rounded(b); };
  uint64_t matrices = 0, columns = 0;
  for (const WeightView* w : {&L.wq, &L.wk, &L.wv, &L.ffn_gate, &L.ffn_up, &L.ffn_down}) {
    matrices += rounded(w->rows * RowBytes(w->type, w->cols));
  }
  for (const gpu::ColumnLayout* c : {&y.qkv, &y.q, &y.k, &y.v, &y.gate, &y.up, &y.down}) {
    if (c->empty()) continue;
    REQUIRE(c->form == gpu::ColumnLayout::Form::kInt4);  // Q4_0 keeps its quants and scales
    const uint64_t scales = (c->in / 32) * c->out_pad * 2;
    columns += rounded(c->in * c->row_bytes) + rounded(scales);
  }
  CHECK(s.layer[0] == d.layer[0] - matrices + columns);
  // Its partial sums, and q | k | v landing in gate's scratch.
  CHECK(gpu::ScratchOf(*sparse).column_partial > 0);
  CHECK(gpu::ScratchOf(*sparse).gate >= h.q_dim() + h.kv_dim() + h.v_dim());
  CHECK(s.scratch > d.scratch);
  // The plan sizes the scratch of the layers it puts on, input-sparse ones included: a cap one
  // byte under what every layer and the head take gives up the head, and a count that does not
  // fit is refused rather than failing at allocation.
  auto all = gpu::PlanWholeLayers(model, gpu::kAutoLayers, 96, 4, gpu::MemoryBudget::kUnlimited,
                                  KvType::kF32, layouts);
  REQUIRE(all.ok());
  REQUIRE(all->output);
  const uint64_t need = gpu::ComputeGpuLayersMemory(*all).Total(*all);
  auto exact = gpu::PlanWholeLayers(model, gpu::kAutoLayers, 96, 4, need, KvType::kF32, layouts);
  REQUIRE(exact.ok());
  CHECK(exact->output);
  CHECK(std::count(exact->layers.begin(), exact->layers.end(), 1) == h.n_layer);
  auto under =
      gpu::PlanWholeLayers(model, gpu::kAutoLayers, 96, 4, need - 1, KvType::kF32, layouts);
  REQUIRE(under.ok());
  CHECK_FALSE(under->output);
  CHECK(gpu::ComputeGpuLayersMemory(*under).Total(*under) <= need - 1);
  auto forced = gpu::PlanWholeLayers(model, h.n_layer, 96, 4, need - 1, KvType::kF32, layouts);
  CHECK(absl::IsResourceExhausted(forced.status()));
  // Layouts of another layer's shape are refused, naming the layer.
  std::vector<gpu::InputSparseLayer> swapped = layouts;
  std::swap(swapped[1].qkv, swapped[1].gate);
  auto bad =
      gpu::PlanWholeLayers(model, 1, 96, 4, gpu::MemoryBudget::kUnlimited, KvType::kF32, swapped);
  CHECK(absl::IsInvalidArgument(bad.status()));
  CHECK_THAT(std::string(bad.status().message()), Catch::Contains("layer 1"));
  // So is a layout of the right shape whose rows are not what its form reads (the kernels would
  // read past them).
  std::vector<gpu::InputSparseLayer> torn = layouts;
  torn[1].gate.row_bytes += 64;
  bad = gpu::PlanWholeLayers(model, 1, 96, 4, gpu::MemoryBudget::kUnlimited, KvType::kF32, torn);
  CHECK(absl::IsInvalidArgument(bad.status()));
  CHECK_THAT(std::string(bad.status().message()), Catch::Contains("layer 1"));
  for (const gpu::ColumnLayout* c : {&y.qkv, &y.q, &y.k, &y.v, &y.gate, &y.up, &y.down}) {
    if (!c->empty()) CHECK(gpu::ColumnLayoutConsistent(*c));
  }
  CHECK_FALSE(gpu::ColumnLayoutConsistent(torn[1].gate));
}

// An input-sparse plan on `device`: all layers, half of them, and under --gpu-memory alone.
// Every token sparse (no dense prefill, as perplexity runs) gives the CPU input-sparse path's
// greedy tokens and logits: both drop the same entries and sum the same integers, in another
// order only. With dense prefill a prompt reads every column of the layouts, which is the CPU
// path with no threshold (the device holds no other copy of the matrices): within the int8
// rounding of the activations of the CPU's own dense matrices (on these 256-wide files F32 and
// Q8_0 weights part by 2.6% of the logits' range), so it is checked against the CPU's
// input-sparse path at threshold -1.
void InputSparseOnDevice(const gpu::Device* device, const LlamaModel& model) {
  const LlamaHparams& h = model.hparams();
  const size_t n_vocab = static_cast<size_t>(h.n_vocab);
  ThreadPool pool(2);
  constexpr float kThreshold = 0.3f;
  EngineOptions every = Options(nullptr);
  every.dense_prefill = false;
  auto cpu = NewEngineSession(model, InputSparsePlan(model, kThreshold), pool, every);
  const std::vector<int32_t> want = GreedyIds(cpu->session(), kPrompt, 16);
  const std::vector<float> want_decode(cpu->session().logits(), cpu->session().logits() + n_vocab);
  const SparseFfnStats& st = cpu->sparse()->stats();
  REQUIRE(st.attn_in_tokens > 0);
  // The threshold drops a good part of every input: a device that read every column would part.
  REQUIRE(st.attn_in_kept / st.attn_in_tokens < 0.8 * h.n_embd);
  REQUIRE(st.ffn_in_kept / st.ffn_in_tokens < 0.8 * h.n_embd);
  const std::vector<float> want_prompt = PromptLogits(cpu->session());

  struct Case {
    int64_t gpu_layers;
    uint64_t gpu_memory;
    int64_t on_device;
  };
  for (const Case& c : {Case{gpu::kAutoLayers, 0, h.n_layer}, Case{h.n_layer / 2, 0, h.n_layer / 2},
                        Case{kNoGpuLayers, uint64_t{1} << 30, h.n_layer}}) {
    EngineOptions o = every;
    o.device = device;
    o.gpu_layers = c.gpu_layers;
    o.gpu_memory = c.gpu_memory;
    SparsePlan plan = InputSparsePlan(model, kThreshold);
    if (c.gpu_memory > 0) {
      // A placement solved into the sidecar (as `profile` writes one) places nothing of an
      // input-sparse plan: its layers still go whole.
      plan.attention_gpu.assign(h.n_layer, 1);
      for (SparseLayerPlan& l : plan.layers) l.device_neurons = {0, 1, 2};
    }
    auto s = NewEngineSession(model, std::move(plan), pool, o);
    const EnginePlacement& p = s->placement();
    INFO(DescribePlacement(p));
    CHECK(p.note.empty());
    CHECK(p.gpu_layers == c.on_device);
    CHECK(p.gpu_input_sparse_layers == c.on_device);
    CHECK_THAT(DescribePlacement(p), Catch::Contains(" input-sparse)"));
    CHECK(p.gpu_bytes > 0);
    if (c.on_device == h.n_layer) {
      // What the device allocated is what the CUDA-free estimate counts (the stand-in reserves
      // exactly that; CUDA allocates it buffer by buffer).
      auto spec = gpu::PlanWholeLayers(model, gpu::kAutoLayers, o.n_ctx, o.max_batch,
                                       gpu::MemoryBudget::kUnlimited, o.kv_type,
                                       DeviceInputSparse(*s->sparse()->weights()));
      REQUIRE(spec.ok());
      CHECK(p.gpu_bytes == gpu::ComputeGpuLayersMemory(*spec).Total(*spec));
    }
    CHECK(GreedyIds(s->session(), kPrompt, 16) == want);
    // 1e-3 of the logits' range, as engine_test.cc's whole layers: room for the float order,
    // not for an entry kept on one side and dropped on the other.
    CHECK(MaxRelDiff(s->session().logits(), want_decode.data(), n_vocab) <= 1e-3);
    const std::vector<float> prompt = PromptLogits(s->session());
    CHECK(MaxRelDiff(prompt.data(), want_prompt.data(), prompt.size()) <= 1e-3);
  }

  // Dense prefill: every column of the layouts for a prompt of several tokens.
  auto cpu_all = NewEngineSession(model, InputSparsePlan(model, -1.0f), pool, every);
  const std::vector<float> want_all = PromptLogits(cpu_all->session());
  EngineOptions o = Options(device);
  o.gpu_layers = gpu::kAutoLayers;
  auto s = NewEngineSession(model, InputSparsePlan(model, kThreshold), pool, o);
  REQUIRE(s->placement().gpu_input_sparse_layers == h.n_layer);
  const std::vector<float> got_all = PromptLogits(s->session());
  CHECK(MaxRelDiff(got_all.data(), want_all.data(), got_all.size()) <= 1e-3);
  CHECK(MaxRelDiff(want_all.data(), want_prompt.data(), want_all.size()) > 1e-2);
}

// A gate-first plan from a profile of `file` at sparsity 0.5, on `device`: all layers and half of
// them give the CPU gate-first path's greedy tokens and logits (every token sparse, as there),
// and a prompt under dense prefill the CPU's dense-prefill logits.
void GateFirstOnDevice(const gpu::Device* device, const std::string& file) {
  const LlamaModel& model = CachedModel(TestModelPath(file));
  const LlamaHparams& h = model.hparams();
  const size_t n_vocab = static_cast<size_t>(h.n_vocab);
  auto plan = [&] {
    auto p = offline::SparsePlanFromSidecar(testing::ProfiledSidecar(file), model, 0.5,
                                            offline::MethodChoice::kGateFirst);
    INFO(p.status().ToString());
    REQUIRE(p.ok());
    return *std::move(p);
  };
  ThreadPool pool(2);
  EngineOptions every = Options(nullptr);
  every.dense_prefill = false;
  auto cpu = NewEngineSession(model, plan(), pool, every);
  const std::vector<int32_t> want = GreedyIds(cpu->session(), kPrompt, 16);
  const std::vector<float> want_decode(cpu->session().logits(), cpu->session().logits() + n_vocab);
  const SparseFfnStats& st = cpu->sparse()->stats();
  REQUIRE(st.layer_tokens > 0);
  REQUIRE(st.up_rows / st.layer_tokens < 0.8 * h.n_ff);  // up rows skipped: a dense FFN would part
  for (int64_t n : {gpu::kAutoLayers, h.n_layer / 2}) {
    EngineOptions o = every;
    o.device = device;
    o.gpu_layers = n;
    auto s = NewEngineSession(model, plan(), pool, o);
    const EnginePlacement& p = s->placement();
    INFO(DescribePlacement(p));
    const int64_t on = n == gpu::kAutoLayers ? h.n_layer : n;
    CHECK(p.note.empty());
    CHECK(p.gpu_layers == on);
    CHECK(p.gpu_gate_first_layers == on);
    CHECK_THAT(DescribePlacement(p), Catch::Contains(" gate-first)"));
    if (n == gpu::kAutoLayers) {
      auto spec = gpu::PlanWholeLayers(model, gpu::kAutoLayers, o.n_ctx, o.max_batch,
                                       gpu::MemoryBudget::kUnlimited, o.kv_type, {},
                                       DeviceGateFirst(*s->sparse()->weights()));
      REQUIRE(spec.ok());
      CHECK(p.gpu_bytes == gpu::ComputeGpuLayersMemory(*spec).Total(*spec));
    }
    CHECK(GreedyIds(s->session(), kPrompt, 16) == want);
    CHECK(MaxRelDiff(s->session().logits(), want_decode.data(), n_vocab) <= 1e-3);
  }
  // Dense prefill: every slot for a prompt, on both sides.
  auto cpu_dense = NewEngineSession(model, plan(), pool, Options(nullptr));
  const std::vector<float> want_prompt = PromptLogits(cpu_dense->session());
  EngineOptions o = Options(device);
  o.gpu_layers = gpu::kAutoLayers;
  auto s = NewEngineSession(model, plan(), pool, o);
  INFO(DescribePlacement(s->placement()));
  REQUIRE(s->placement().gpu_gate_first_layers == h.n_layer);
  const std::vector<float> got = PromptLogits(s->session());
  CHECK(MaxRelDiff(got.data(), want_prompt.data(), got.size()) <= 1e-3);
}

const char* const kGateFirstFiles[] = {"kquants/stories-wide.q4_0.gguf",
                                       "kquants/stories-wide.q8_0.gguf", "stories260K.gguf"};

TEST_CASE("front door, stand-in device: gate-first whole layers give the CPU's tokens", "[gpu]") {
  for (const char* name : kGateFirstFiles) {
    if (!std::filesystem::exists(TestModelPath(name))) {
      THERMOCLINE_SKIP(std::string(name) + " not found");
    }
    INFO(name);
    CpuStandInDevice device;
    GateFirstOnDevice(&device, name);
    CHECK(device.gate_first_tokens() > 0);
  }
}

TEST_CASE("front door, CUDA: gate-first whole layers give the CPU's tokens", "[cuda]") {
  if (!gpu::DeviceAvailable()) THERMOCLINE_SKIP("no CUDA device: [cuda] case skipped");
  for (const char* name : kGateFirstFiles) {
    if (!std::filesystem::exists(TestModelPath(name))) {
      THERMOCLINE_SKIP(std::string(name) + " not found");
    }
    INFO(name);
    GateFirstOnDevice(&gpu::CudaDevice(), name);
  }
}

TEST_CASE("front door, stand-in device: a mixed plan's input-sparse layer stays on the CPU",
          "[gpu]") {
  // Layer 0 input-sparse, the others every neuron through the predicted path with a few device
  // neurons, a placement solved with every layer's attention on the device: the hybrid
  // placement. The input-sparse layer's q/k/v are column-sparse and its prompt's FFN dense on
  // the CPU, which the hybrid device layer does not do: that layer stays on the CPU, and the
  // tokens and logits are the CPU engine's.
  const std::string path = TestModelPath("kquants/stories-wide.q4_0.gguf");
  if (!std::filesystem::exists(path)) THERMOCLINE_SKIP("stories-wide.q4_0.gguf not found");
  const LlamaModel& model = CachedModel(path);
  const LlamaHparams& h = model.hparams();
  REQUIRE(h.n_layer >= 2);
  auto plan = [&](bool placed) {
    SparsePlan p = InputSparsePlan(model, 0.3f);
    for (int64_t l = 1; l < h.n_layer; ++l) {
      p.layers[l] = SparseLayerPlan();
      if (placed) p.layers[l].device_neurons = {0, 1, 2};
    }
    if (placed) p.attention_gpu.assign(h.n_layer, 1);
    return p;
  };
  ThreadPool pool(2);
  auto cpu = NewEngineSession(model, plan(false), pool, Options(nullptr));
  const std::vector<float> want_prompt = PromptLogits(cpu->session());
  const std::vector<int32_t> want = GreedyIds(cpu->session(), kPrompt, 12);
  CpuStandInDevice device;
  EngineOptions o = Options(&device);
  o.gpu_memory = uint64_t{1} << 30;
  auto s = NewEngineSession(model, plan(true), pool, o);
  const EnginePlacement& p = s->placement();
  INFO(DescribePlacement(p));
  CHECK(p.note.empty());
  CHECK(p.gpu_layers == 0);  // hybrid, not whole layers
  CHECK(p.attention_gpu_layers == h.n_layer - 1);
  const std::vector<float> prompt = PromptLogits(s->session());
  CHECK(MaxRelDiff(prompt.data(), want_prompt.data(), prompt.size()) <= 1e-3);
  CHECK(GreedyIds(s->session(), kPrompt, 12) == want);
}

TEST_CASE("front door, stand-in device: input-sparse whole layers give the CPU's tokens", "[gpu]") {
  for (const char* name : kFiles) {
    const std::string path = TestModelPath(name);
    if (!std::filesystem::exists(path)) THERMOCLINE_SKIP(std::string(name) + " not found");
    INFO(name);
    CpuStandInDevice device;
    InputSparseOnDevice(&device, CachedModel(path));
    CHECK(device.input_sparse_tokens() > 0);
  }
}

TEST_CASE("front door, CUDA: input-sparse whole layers give the CPU's tokens", "[cuda]") {
  if (!gpu::DeviceAvailable()) THERMOCLINE_SKIP("no CUDA device: [cuda] case skipped");
  for (const char* name : kFiles) {
    const std::string path = TestModelPath(name);
    if (!std::filesystem::exists(path)) THERMOCLINE_SKIP(std::string(name) + " not found");
    INFO(name);
    InputSparseOnDevice(&gpu::CudaDevice(), CachedModel(path));
  }
}

}  // namespace
}  // namespace thermocline
