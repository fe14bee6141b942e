// Whole layers on the GPU against the CPU: full offload (every layer and the output head), the
// -ngl split (the first layers on the GPU, the rest on the CPU), a split in the middle, and the
// hybrid layer (attention on the GPU, the FFN on the host) give the CPU's greedy tokens on the
// reference prompts of the test models; the device memory equals the CUDA-free estimate the
// -ngl plan uses; decode does not grow device memory. [cuda]: skipped without a device.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <vector>

#include "cuda_test_util.h"
#include "engine/gpu/gpu_backend.h"
#include "engine/gpu/gpu_layers.h"
#include "engine/util/thread_pool.h"
#include "model_fixtures.h"

namespace thermocline {
namespace {

// The session's own dense FFN as the host FFN of hybrid GPU layers.
class SessionDenseFfn : public FfnBackend {
 public:
  explicit SessionDenseFfn(Session* s) : s_(s) {}
  void Forward(int layer, const float* x, const float* xn, int64_t n, float* out) override {
    s_->DenseFfn(layer, x, xn, n, out);
  }

 private:
  Session* s_;
};

TEST_CASE("CUDA whole layers: full offload, -ngl split and hybrid give the CPU's greedy tokens",
          "[cuda]") {
  if (!gpu::DeviceAvailable()) THERMOCLINE_SKIP("no CUDA device: [cuda] case skipped");
  for (const char* name : {"stories260K.gguf", "relu-tiny.f32.gguf", "relu-tiny.f16.gguf"}) {
    const std::string path = testing::TestModelPath(name);
    if (!std::filesystem::exists(path)) THERMOCLINE_SKIP(std::string(name) + " not found");
    const std::string ref_name =
        std::string(name).substr(0, std::string(name).find('.')) + ".reference.json";
    const nlohmann::json ref = testing::LoadReference(ref_name);
    const LlamaModel& model = testing::CachedModel(path);
    const LlamaHparams& h = model.hparams();
    ThreadPool pool(2);
    SessionOptions so;
    so.n_ctx = 128;
    so.max_batch = 4;  // prompts cross chunks
    auto cpu = Session::Create(model, &pool, so);
    REQUIRE_OK(cpu.status());

    const int64_t n = h.n_layer;
    std::vector<uint8_t> all(n, 1), first_half(n, 0), middle(n, 0);
    for (int64_t l = 0; l < n; ++l) {
      first_half[l] = l < (n + 1) / 2;
      middle[l] = l >= 1 && l < n - 1;
    }
    struct Case {
      const char* what;
      std::vector<uint8_t> layers;
      bool output, hybrid;
    };
    for (const Case& c :
         {Case{"full offload", all, true, false}, Case{"-ngl first half", first_half, false, false},
          Case{"middle layers", middle, false, false},
          Case{"all layers, head on the CPU", all, false, false},
          Case{"hybrid: attention on the GPU, FFN on the host", all, true, true}}) {
      INFO(name << ": " << c.what);
      auto s = Session::Create(model, &pool, so);
      REQUIRE_OK(s.status());
      SessionDenseFfn host(s->get());
      gpu::GpuLayersSpec spec;
      spec.model = &model;
      spec.layers = c.layers;
      spec.output = c.output;
      spec.n_ctx = so.n_ctx;
      spec.max_batch = so.max_batch;
      spec.host_ffn = c.hybrid ? &host : nullptr;
      absl::StatusOr<std::unique_ptr<gpu::GpuLayers>> layers = gpu::CreateGpuLayers(spec);
      REQUIRE_OK(layers.status());
      // The estimate the -ngl plan uses is what the backend allocates.
      CHECK((*layers)->device_bytes() == gpu::ComputeGpuLayersMemory(spec).Total(spec));
      (*s)->set_layer_backend(layers->get());
      for (const auto& p : ref["prompts"]) {
        const std::vector<int32_t> prompt = p["prompt_ids"].get<std::vector<int32_t>>();
        const std::vector<int32_t> want = testing::GreedyIds(**cpu, prompt, 32);
        const uint64_t before = (*layers)->device_bytes();
        CHECK(testing::GreedyIds(**s, prompt, 32) == want);
        CHECK((*layers)->device_bytes() == before);  // nothing allocated per token
      }
      // Prefill with every row's logits: close to the CPU's (float sums in other orders).
      const std::vector<int32_t> prompt = ref["prompts"][0]["prompt_ids"];
      std::vector<float> want(prompt.size() * h.n_vocab), got(want.size());
      (*cpu)->Reset();
      (*s)->Reset();
      REQUIRE_OK((*cpu)->Eval(prompt, want.data()));
      REQUIRE_OK((*s)->Eval(prompt, got.data()));
      double diff = 0, scale = 0;
      for (size_t i = 0; i < want.size(); ++i) {
        diff = std::max(diff, std::fabs(double{got[i]} - want[i]));
        scale = std::max(scale, std::fabs(double{want[i]}));
      }
      // Each layer's products sum up to n_ff terms in float in another order than the CPU's
      // SIMD; through n_layer layers ~1e-5 relative is expected, 1e-3 leaves room without
      // hiding a wrong position or head (those move logits by O(1)).
      CHECK(diff <= 1e-3 * scale);
    }
  }
}

TEST_CASE("CUDA whole layers: the cap refuses what does not fit", "[cuda]") {
  if (!gpu::DeviceAvailable()) THERMOCLINE_SKIP("no CUDA device: [cuda] case skipped");
  const std::string path = testing::TestModelPath("relu-tiny.f32.gguf");
  if (!std::filesystem::exists(path)) THERMOCLINE_SKIP("relu-tiny.f32.gguf not found");
  const LlamaModel& model = testing::CachedModel(path);
  for (KvType kv : {KvType::kF32, KvType::kF16}) {
    INFO((kv == KvType::kF16 ? "F16" : "F32") << " KV cache");
    auto spec =
        gpu::PlanWholeLayers(model, gpu::kAutoLayers, 64, 4, gpu::MemoryBudget::kUnlimited, kv);
    REQUIRE_OK(spec.status());
    const uint64_t need = gpu::ComputeGpuLayersMemory(*spec).Total(*spec);
    spec->memory_cap = need - 1;
    auto refused = gpu::CreateGpuLayers(*spec);
    CHECK(refused.status().code() == absl::StatusCode::kResourceExhausted);
    spec->memory_cap = need;
    auto fits = gpu::CreateGpuLayers(*spec);
    REQUIRE_OK(fits.status());
    CHECK((*fits)->device_bytes() == need);
    CHECK((*fits)->n_gpu_layers() == model.hparams().n_layer);
    CHECK((*fits)->output_on_gpu());
  }
}

// Every weight type of llama.cpp's files with all layers and the head on the device. The device
// dots the non-Q8_0/Q4_0 types with F32 activations, the CPU with 8-bit ones, so logits differ by
// the activation quantization's noise (up to ~0.6 on these files, kquants_reference_test.cc), and
// greedy tokens agree until a near-tie; a wrong decoder moves logits by whole units.
TEST_CASE("CUDA whole layers run every llama.cpp weight type as the CPU does", "[cuda]") {
  if (!gpu::DeviceAvailable()) THERMOCLINE_SKIP("no CUDA device: [cuda] case skipped");
  for (const char* type : {"q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl", "q2_k", "q3_k_m",
                           "q4_k_m", "q5_k_m", "q6_k", "iq4_xs"}) {
    const std::string file = std::string("kquants/stories-wide.") + type + ".gguf";
    const std::string path = testing::TestModelPath(file);
    if (!std::filesystem::exists(path)) THERMOCLINE_SKIP(file + " not found");
    INFO(file);
    const LlamaModel& model = testing::CachedModel(path);
    const LlamaHparams& h = model.hparams();
    ThreadPool pool(2);
    SessionOptions so;
    so.n_ctx = 128;
    so.max_batch = 4;
    auto cpu = Session::Create(model, &pool, so);
    auto s = Session::Create(model, &pool, so);
    REQUIRE_OK(cpu.status());
    REQUIRE_OK(s.status());
    gpu::GpuLayersSpec spec;
    spec.model = &model;
    spec.layers.assign(h.n_layer, 1);
    spec.output = true;
    spec.n_ctx = so.n_ctx;
    spec.max_batch = so.max_batch;
    absl::StatusOr<std::unique_ptr<gpu::GpuLayers>> layers = gpu::CreateGpuLayers(spec);
    REQUIRE_OK(layers.status());
    (*s)->set_layer_backend(layers->get());
    const nlohmann::json ref =
        testing::LoadReference(std::string("kquants/stories-wide.") + type + ".llama-cpp.json");
    for (const auto& p : ref["prompts"]) {
      const std::vector<int32_t> prompt = p["prompt_ids"].get<std::vector<int32_t>>();
      (*cpu)->Reset();
      (*s)->Reset();
      REQUIRE_OK((*cpu)->Eval(prompt));
      REQUIRE_OK((*s)->Eval(prompt));
      for (int step = 0; step < 16; ++step) {
        const float* a = (*cpu)->logits();
        const float* b = (*s)->logits();
        double diff = 0;
        for (int64_t i = 0; i < h.n_vocab; ++i)
          diff = std::max(diff, std::fabs(double{a[i]} - b[i]));
        CHECK(diff < 0.8);
        const int32_t ta = static_cast<int32_t>(std::max_element(a, a + h.n_vocab) - a);
        const int32_t tb = static_cast<int32_t>(std::max_element(b, b + h.n_vocab) - b);
        if (ta != tb) {
          CHECK(a[ta] - a[tb] < 0.4);  // a near-tie
          break;
        }
        REQUIRE_OK((*cpu)->Eval({&ta, 1}));
        REQUIRE_OK((*s)->Eval({&ta, 1}));
      }
    }
  }
}

}  // namespace
}  // namespace thermocline
