// What whole GPU layers need without a GPU: --gpu-layers parsing, the device memory of a set of
// layers and how many whole layers fit under a cap (the -ngl plan), the Session's layer seam
// (the front door's use of it, with a CPU stand-in device: engine_test.cc). Tagged [gpu]: they
// run everywhere (also in thermocline_cuda_tests on a GPU machine). The CLI cases:
// gpu_cli_test.cc.
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
  auto all = gpu::PlanWholeLayers(model, gpu::kAutoLayers, n_ctx, batch,
                                  gpu::MemoryBudget::kUnlimited, KvType::kF32);
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
  // An F16 cache (the engine's default) halves K and V.
  gpu::GpuLayersSpec half = *all;
  half.kv_type = KvType::kF16;
  CHECK(gpu::ComputeGpuLayersMemory(half).layer[0] == want - n_ctx * h.kv_dim() * 4);
  uint64_t total = mem.scratch + mem.output;
  for (uint64_t b : mem.layer) total += b;
  CHECK(mem.Total(*all) == total);

  // A cap of the scratch and exactly two layers holds two; a byte less holds one.
  const uint64_t two = mem.scratch + mem.layer[0] + mem.layer[1];
  auto fit2 = gpu::PlanWholeLayers(model, gpu::kAutoLayers, n_ctx, batch, two, KvType::kF32);
  REQUIRE(fit2.ok());
  CHECK(std::count(fit2->layers.begin(), fit2->layers.end(), 1) == 2);
  CHECK(fit2->layers[0] == 1);
  CHECK(fit2->layers[1] == 1);
  CHECK_FALSE(fit2->output);
  CHECK(gpu::ComputeGpuLayersMemory(*fit2).Total(*fit2) <= two);
  auto fit1 = gpu::PlanWholeLayers(model, gpu::kAutoLayers, n_ctx, batch, two - 1, KvType::kF32);
  REQUIRE(fit1.ok());
  CHECK(std::count(fit1->layers.begin(), fit1->layers.end(), 1) == 1);
  auto none = gpu::PlanWholeLayers(model, gpu::kAutoLayers, n_ctx, batch, 1000, KvType::kF32);
  REQUIRE(none.ok());
  CHECK(std::count(none->layers.begin(), none->layers.end(), 1) == 0);
  // The head goes along only when everything fits.
  auto head =
      gpu::PlanWholeLayers(model, gpu::kAutoLayers, n_ctx, batch, mem.Total(*all), KvType::kF32);
  REQUIRE(head.ok());
  CHECK(head->output);
  auto no_head = gpu::PlanWholeLayers(model, gpu::kAutoLayers, n_ctx, batch, mem.Total(*all) - 1,
                                      KvType::kF32);
  REQUIRE(no_head.ok());
  CHECK(std::count(no_head->layers.begin(), no_head->layers.end(), 1) == h.n_layer);
  CHECK_FALSE(no_head->output);
  // A requested count: clamped to the layers, refused when it does not fit.
  auto many =
      gpu::PlanWholeLayers(model, 99, n_ctx, batch, gpu::MemoryBudget::kUnlimited, KvType::kF32);
  REQUIRE(many.ok());
  CHECK(many->output);
  auto too_many = gpu::PlanWholeLayers(model, 3, n_ctx, batch, two, KvType::kF32);
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

TEST_CASE("GPU layers without a CUDA device: Unavailable, never a crash", "[nodevice]") {
  if (gpu::DeviceAvailable())
    THERMOCLINE_SKIP("a CUDA device is present: the [cuda] cases cover it");
  const std::string path = TestModelPath("relu-tiny.f32.gguf");
  if (!std::filesystem::exists(path)) THERMOCLINE_SKIP("relu-tiny.f32.gguf not found");
  const LlamaModel& model = CachedModel(path);
  auto spec = gpu::PlanWholeLayers(model, gpu::kAutoLayers, 64, 4, gpu::MemoryBudget::kUnlimited,
                                   KvType::kF32);
  REQUIRE(spec.ok());
  auto layers = gpu::CreateGpuLayers(*spec);
  CHECK(layers.status().code() == absl::StatusCode::kUnavailable);
  CHECK_THAT(std::string(layers.status().message()), Catch::Contains("no CUDA device"));
}

}  // namespace
}  // namespace thermocline
