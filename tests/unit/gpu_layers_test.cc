// What whole GPU layers need without a GPU: --gpu-layers parsing, the device memory of a set of
// layers and how many whole layers fit under a cap (the -ngl plan), the Session's layer seam
// (driven by a CPU stand-in backend that owns some layers). Tagged [gpu]: they run everywhere
// (also in thermocline_cuda_tests on a GPU machine). The CLI cases: gpu_cli_test.cc.
#include "engine/gpu/gpu_layers.h"

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "engine/gpu/gpu_backend.h"
#include "engine/model/cpu_ops.h"
#include "engine/model/session.h"
#include "model_fixtures.h"

namespace thermocline {
namespace {

using testing::CachedModel;
using testing::TestModelPath;

TEST_CASE("GPU layers flag: --gpu-layers parses a count or auto", "[gpu]") {
  CHECK(*gpu::ParseGpuLayers("auto") == gpu::kAutoLayers);
  CHECK(*gpu::ParseGpuLayers("0") == 0);
  CHECK(*gpu::ParseGpuLayers("33") == 33);
  for (const char* bad : {"-1", "x", "", "1.5", "all"}) {
    INFO(bad);
    CHECK(gpu::ParseGpuLayers(bad).status().code() == absl::StatusCode::kInvalidArgument);
  }
}

TEST_CASE("whole GPU layers: memory and how many fit under a cap", "[gpu]") {
  const std::string path = TestModelPath("relu-tiny.f32.gguf");
  if (!std::filesystem::exists(path)) THERMOCLINE_SKIP("relu-tiny.f32.gguf not found");
  const LlamaModel& model = CachedModel(path);
  const LlamaHparams& h = model.hparams();
  const int64_t n_ctx = 64, batch = 8;
  auto all =
      gpu::PlanWholeLayers(model, gpu::kAutoLayers, n_ctx, batch, gpu::MemoryBudget::kUnlimited);
  REQUIRE(all.ok());
  CHECK(std::count(all->layers.begin(), all->layers.end(), 1) == h.n_layer);
  CHECK(all->output);
  const gpu::GpuLayersMemory mem = gpu::ComputeGpuLayersMemory(*all);
  REQUIRE(static_cast<int64_t>(mem.layer.size()) == h.n_layer);
  // One layer by hand: 7 F32 matrices, 2 norms, K and V of n_ctx positions (all multiples of 256).
  const LayerWeights& L = model.layers()[0];
  uint64_t want = 2 * h.n_embd * 4 + 2 * n_ctx * h.kv_dim() * 4;
  for (const WeightView* w : {&L.wq, &L.wk, &L.wv, &L.wo, &L.ffn_gate, &L.ffn_up, &L.ffn_down}) {
    want += gpu::MemoryBudget::Rounded(w->rows * w->cols * 4);
  }
  CHECK(mem.layer[0] == want);
  uint64_t total = mem.scratch + mem.output;
  for (uint64_t b : mem.layer) total += b;
  CHECK(mem.Total(*all) == total);

  // A cap of the scratch and exactly two layers holds two; a byte less holds one.
  const uint64_t two = mem.scratch + mem.layer[0] + mem.layer[1];
  auto fit2 = gpu::PlanWholeLayers(model, gpu::kAutoLayers, n_ctx, batch, two);
  REQUIRE(fit2.ok());
  CHECK(std::count(fit2->layers.begin(), fit2->layers.end(), 1) == 2);
  CHECK(fit2->layers[0] == 1);
  CHECK(fit2->layers[1] == 1);
  CHECK_FALSE(fit2->output);
  CHECK(gpu::ComputeGpuLayersMemory(*fit2).Total(*fit2) <= two);
  auto fit1 = gpu::PlanWholeLayers(model, gpu::kAutoLayers, n_ctx, batch, two - 1);
  REQUIRE(fit1.ok());
  CHECK(std::count(fit1->layers.begin(), fit1->layers.end(), 1) == 1);
  auto none = gpu::PlanWholeLayers(model, gpu::kAutoLayers, n_ctx, batch, 1000);
  REQUIRE(none.ok());
  CHECK(std::count(none->layers.begin(), none->layers.end(), 1) == 0);
  // The head goes along only when everything fits.
  auto head = gpu::PlanWholeLayers(model, gpu::kAutoLayers, n_ctx, batch, mem.Total(*all));
  REQUIRE(head.ok());
  CHECK(head->output);
  auto no_head = gpu::PlanWholeLayers(model, gpu::kAutoLayers, n_ctx, batch, mem.Total(*all) - 1);
  REQUIRE(no_head.ok());
  CHECK(std::count(no_head->layers.begin(), no_head->layers.end(), 1) == h.n_layer);
  CHECK_FALSE(no_head->output);
  // A requested count: clamped to the layers, refused when it does not fit.
  auto many = gpu::PlanWholeLayers(model, 99, n_ctx, batch, gpu::MemoryBudget::kUnlimited);
  REQUIRE(many.ok());
  CHECK(many->output);
  auto too_many = gpu::PlanWholeLayers(model, 3, n_ctx, batch, two);
  CHECK(too_many.status().code() == absl::StatusCode::kResourceExhausted);
  CHECK_THAT(std::string(too_many.status().message()), Catch::Contains("--gpu-memory"));
  // Hybrid GPU layers (the FFN on the host) need no FFN weights on the device.
  gpu::GpuLayersSpec hybrid = *all;
  struct NoFfn : FfnBackend {
    void Forward(int, const float*, const float*, int64_t, float*) override {}
  } host;
  hybrid.host_ffn = &host;
  CHECK(gpu::ComputeGpuLayersMemory(hybrid).layer[0] <
        mem.layer[0] - 3 * gpu::MemoryBudget::Rounded(L.ffn_up.rows * L.ffn_up.cols * 4) + 1);
}

// A CPU stand-in for a GPU layer backend: the owned layers computed with the same operators as
// Session's CPU path, with its own KV cache. It checks what the seam hands over (runs, the
// residual stream, positions, the head) by giving the CPU's results through it.
class CpuLayers : public LayerBackend {
 public:
  CpuLayers(const LlamaModel& model, ThreadPool* pool, std::vector<uint8_t> owned, bool head,
            int64_t n_ctx)
      : m_(model),
        h_(model.hparams()),
        pool_(pool),
        owned_(std::move(owned)),
        head_(head),
        n_ctx_(n_ctx) {
    k_.assign(h_.n_layer * n_ctx * h_.kv_dim(), 0.0f);
    v_.assign(k_.size(), 0.0f);
  }
  bool Owns(int64_t l) const override { return l == h_.n_layer ? head_ : owned_[l] != 0; }
  absl::Status Forward(int64_t first, int64_t last, float* x, int64_t n, int64_t pos,
                       const float* cs, float* logits, bool all_rows) override {
    ++calls;
    const int64_t d = h_.n_embd, kvd = h_.kv_dim(), qd = h_.q_dim();
    std::vector<float> xb(n * d), q(n * qd), k(n * kvd), v(n * kvd), att(n * qd), g(n * h_.n_ff),
        u(n * h_.n_ff), scores(n_ctx_);
    for (int64_t l = first; l < last; ++l) {
      const LayerWeights& L = m_.layers()[l];
      for (int64_t t = 0; t < n; ++t)
        RmsNorm(x + t * d, L.attn_norm.data(), d, h_.rms_eps, &xb[t * d]);
      MatMul(*pool_, L.wq, xb.data(), n, q.data(), scratch_);
      MatMul(*pool_, L.wk, xb.data(), n, k.data(), scratch_);
      MatMul(*pool_, L.wv, xb.data(), n, v.data(), scratch_);
      float* kc = k_.data() + l * n_ctx_ * kvd;
      float* vc = v_.data() + l * n_ctx_ * kvd;
      for (int64_t t = 0; t < n; ++t) {
        ApplyRope(&q[t * qd], h_.n_head, h_.head_dim, h_.rope_dim, cs + t * h_.rope_dim);
        ApplyRope(&k[t * kvd], h_.n_head_kv, h_.head_dim, h_.rope_dim, cs + t * h_.rope_dim);
        std::copy_n(&k[t * kvd], kvd, kc + (pos + t) * kvd);
        std::copy_n(&v[t * kvd], kvd, vc + (pos + t) * kvd);
      }
      const int64_t group = h_.n_head / h_.n_head_kv;
      const float scale = 1.0f / std::sqrt(static_cast<float>(h_.head_dim));
      for (int64_t t = 0; t < n; ++t) {
        for (int64_t head = 0; head < h_.n_head; ++head) {
          const int64_t off = (head / group) * h_.head_dim, n_kv = pos + t + 1;
          const float* qh = &q[t * qd + head * h_.head_dim];
          for (int64_t j = 0; j < n_kv; ++j) {
            float dot = 0.0f;
            for (int64_t i = 0; i < h_.head_dim; ++i) dot += qh[i] * kc[j * kvd + off + i];
            scores[j] = dot * scale;
          }
          Softmax(scores.data(), n_kv);
          float* o = &att[t * qd + head * h_.head_dim];
          std::fill_n(o, h_.head_dim, 0.0f);
          for (int64_t j = 0; j < n_kv; ++j) {
            for (int64_t i = 0; i < h_.head_dim; ++i) o[i] += scores[j] * vc[j * kvd + off + i];
          }
        }
      }
      MatMul(*pool_, L.wo, att.data(), n, xb.data(), scratch_);
      for (int64_t i = 0; i < n * d; ++i) x[i] += xb[i];
      for (int64_t t = 0; t < n; ++t)
        RmsNorm(x + t * d, L.ffn_norm.data(), d, h_.rms_eps, &xb[t * d]);
      MatMul(*pool_, L.ffn_gate, xb.data(), n, g.data(), scratch_);
      MatMul(*pool_, L.ffn_up, xb.data(), n, u.data(), scratch_);
      GatedActivation(h_.activation, g.data(), u.data(), n * h_.n_ff);
      MatMul(*pool_, L.ffn_down, g.data(), n, xb.data(), scratch_);
      for (int64_t i = 0; i < n * d; ++i) x[i] += xb[i];
    }
    if (logits != nullptr) {
      const int64_t from = all_rows ? 0 : n - 1;
      for (int64_t t = from; t < n; ++t) {
        RmsNorm(x + t * d, m_.output_norm().data(), d, h_.rms_eps, &xb[t * d]);
      }
      MatMul(*pool_, m_.output(), &xb[from * d], n - from, logits, scratch_);
    }
    return absl::OkStatus();
  }
  int calls = 0;

 private:
  const LlamaModel& m_;
  const LlamaHparams& h_;
  ThreadPool* pool_;
  std::vector<uint8_t> owned_;
  bool head_;
  int64_t n_ctx_;
  std::vector<float> k_, v_;
  MatMulScratch scratch_;
};

TEST_CASE("Session layer seam: owned runs give the CPU's logits and greedy tokens", "[gpu]") {
  for (const char* name : {"stories260K.gguf", "relu-tiny.f32.gguf"}) {
    const std::string path = TestModelPath(name);
    if (!std::filesystem::exists(path)) THERMOCLINE_SKIP(std::string(name) + " not found");
    INFO(name);
    const LlamaModel& model = CachedModel(path);
    const LlamaHparams& h = model.hparams();
    ThreadPool pool(2);
    SessionOptions so;
    so.n_ctx = 96;
    so.max_batch = 4;  // the prompt crosses chunks
    auto cpu = Session::Create(model, &pool, so);
    REQUIRE(cpu.ok());
    const std::vector<int32_t> prompt = {1, 403, 261, 290, 7, 45, 300};
    const std::vector<int32_t> want = testing::GreedyIds(**cpu, prompt, 24);
    std::vector<float> want_all(prompt.size() * h.n_vocab);
    (*cpu)->Reset();
    REQUIRE((*cpu)->Eval(prompt, want_all.data()).ok());

    const int64_t n = h.n_layer;
    struct Case {
      const char* what;
      std::vector<uint8_t> owned;
      bool head;
    };
    std::vector<uint8_t> first_half(n, 0), middle(n, 0), tail(n, 0), every(n, 1), alternate(n);
    for (int64_t l = 0; l < n; ++l) {
      first_half[l] = l < n / 2;
      middle[l] = l >= 1 && l < n - 1;
      tail[l] = l >= n / 2;
      alternate[l] = l % 2;
    }
    for (const Case& c :
         {Case{"first half (-ngl)", first_half, false}, Case{"middle", middle, false},
          Case{"tail", tail, false}, Case{"tail + head", tail, true},
          Case{"alternate", alternate, false}, Case{"full offload", every, true}}) {
      INFO(c.what);
      auto s = Session::Create(model, &pool, so);
      REQUIRE(s.ok());
      CpuLayers backend(model, &pool, c.owned, c.head, so.n_ctx);
      (*s)->set_layer_backend(&backend);
      CHECK(testing::GreedyIds(**s, prompt, 24) == want);
      CHECK(backend.calls > 0);
      std::vector<float> all(prompt.size() * h.n_vocab);
      (*s)->Reset();
      REQUIRE((*s)->Eval(prompt, all.data()).ok());
      double diff = 0, scale = 0;
      for (size_t i = 0; i < all.size(); ++i) {
        diff = std::max(diff, std::fabs(double{all[i]} - want_all[i]));
        scale = std::max(scale, std::fabs(double{want_all[i]}));
      }
      // The same operators in the same order: equal up to the attention's serial vs pooled
      // summation (none here: one thread computes each head) — allow float noise anyway.
      CHECK(diff <= 1e-5 * scale);
    }
  }
}

TEST_CASE("GPU layers without a CUDA device: Unavailable, never a crash", "[gpu]") {
  if (gpu::DeviceAvailable())
    THERMOCLINE_SKIP("a CUDA device is present: the [cuda] cases cover it");
  const std::string path = TestModelPath("relu-tiny.f32.gguf");
  if (!std::filesystem::exists(path)) THERMOCLINE_SKIP("relu-tiny.f32.gguf not found");
  const LlamaModel& model = CachedModel(path);
  auto spec = gpu::PlanWholeLayers(model, gpu::kAutoLayers, 64, 4, gpu::MemoryBudget::kUnlimited);
  REQUIRE(spec.ok());
  auto layers = gpu::CreateGpuLayers(*spec);
  CHECK(layers.status().code() == absl::StatusCode::kUnavailable);
  CHECK_THAT(std::string(layers.status().message()), Catch::Contains("no CUDA device"));
}

}  // namespace
}  // namespace thermocline
