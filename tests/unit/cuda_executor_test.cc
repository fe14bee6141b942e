// The hybrid FFN executor on the GPU: its device part against the CPU's computation of the same
// neurons (given active sets and the GPU predictor, every type and activation), misuse, the
// memory cap, and a real model's greedy tokens with the FFN on the GPU. [cuda]: skipped without
// a device. Tolerances: see cuda_test_util.h.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <numeric>
#include <random>
#include <vector>

#include "bench/gpu_ffn_backend.h"
#include "cuda_test_util.h"
#include "engine/gpu/gpu_backend.h"
#include "engine/gpu/gpu_ffn_executor.h"
#include "engine/model/cpu_ops.h"
#include "engine/util/thread_pool.h"
#include "model_fixtures.h"

namespace thermocline {
namespace {

using namespace cuda_test;  // NOLINT: the harness's helpers

// The CPU's version of the executor's work for one layer and a given active set.
std::vector<double> ReferenceFfn(const WeightView& gate, const WeightView& up,
                                 const WeightView& down_t, FfnActivation act,
                                 const std::vector<float>& xn, const std::vector<int32_t>& active,
                                 std::vector<double>* bound) {
  const CpuMatVec g = ReferenceMatVec(gate, xn), u = ReferenceMatVec(up, xn);
  std::vector<double> out(gate.cols, 0.0);
  bound->assign(gate.cols, 1e-30);
  for (int32_t n : active) {
    float a = g.y[n];
    float uu = up.rows ? u.y[n] : 0;
    GatedActivation(act, &a, &uu, 1);
    // Activation error from the gate/up dot errors (silu' ≤ 1.1, relu' ≤ 1) and expf/rounding.
    const double gt = DotBound(gate.cols, g.magnitude[n]), ut = DotBound(up.cols, u.magnitude[n]);
    const double at =
        1.1 * gt * (std::fabs(uu) + ut) + ut * (std::fabs(g.y[n]) + gt) + 8 * kEps32 * std::fabs(a);
    const std::vector<float> row = DequantRow(down_t, n);
    for (int64_t c = 0; c < down_t.cols; ++c) {
      out[c] += double{a} * row[c];
      (*bound)[c] += at * std::fabs(row[c]) + (active.size() + 2) * kEps32 * std::fabs(a * row[c]);
    }
  }
  return out;
}

TEST_CASE("CUDA FFN executor: the device part equals the CPU's for that part", "[cuda]") {
  if (!gpu::DeviceAvailable()) THERMOCLINE_SKIP("no CUDA device: [cuda] case skipped");
  const int64_t n_ff = 250, rank = 32;
  uint32_t seed = 500;
  for (GgmlType type : kTypes) {
    const int64_t n_embd = ColsFor(type, 96);
    for (FfnActivation act : {FfnActivation::kSilu, FfnActivation::kRelu, FfnActivation::kDRelu}) {
      INFO(TypeName(type) << " " << ActivationName(act));
      std::vector<OwnedWeight> keep;
      gpu::GpuFfnSpec spec;
      spec.n_embd = n_embd;
      spec.n_ff = n_ff;
      spec.activation = act;
      std::vector<std::vector<int32_t>> dev(2);
      std::vector<std::vector<float>> b1(2), b2(2);
      for (int l = 0; l < 2; ++l) {
        for (int32_t i = 0; i < n_ff; ++i) {
          if ((i * 7 + l) % 5 < 2) dev[l].push_back(i);  // 40% of the neurons on the GPU
        }
        keep.push_back(RandomWeight(type, n_ff, n_embd, ++seed));
        keep.push_back(RandomWeight(type, n_ff, n_embd, ++seed));
        keep.push_back(RandomWeight(type, n_ff, n_embd, ++seed));
        // Predictor with a decided outcome: fc2 tiny, b2 = ±100 picks every third device neuron.
        keep.push_back(RandomWeight(GgmlType::kF32, rank, n_embd, ++seed));
        keep.push_back(
            MakeWeight(GgmlType::kF32, std::vector<float>(n_ff * rank, 1e-4f).data(), n_ff, rank));
        b1[l] = RandomFloats(rank, ++seed);
        b2[l].assign(n_ff, -100.0f);
        for (size_t k = 0; k < dev[l].size(); k += 3) b2[l][dev[l][k]] = 100.0f;
        gpu::GpuFfnLayerSpec s;
        const size_t base = keep.size() - 5;
        s.gate = keep[base].view;
        s.up = keep[base + 1].view;
        s.down_t = keep[base + 2].view;
        s.device_neurons = dev[l];
        s.rank = l == 1 ? rank : 0;  // layer 0 without, layer 1 with a predictor
        s.fc1 = keep[base + 3].view;
        s.b1 = b1[l];
        s.fc2 = keep[base + 4].view;
        s.b2 = b2[l];
        s.threshold = 0.0f;
        spec.layers.push_back(s);
      }
      absl::StatusOr<std::unique_ptr<gpu::GpuFfnExecutor>> ex = gpu::CreateGpuFfnExecutor(spec);
      REQUIRE_OK(ex.status());
      REQUIRE((*ex)->device_bytes() > 0);
      const std::vector<float> xn = RandomFloats(n_embd, ++seed);
      for (int l = 0; l < 2; ++l) {
        const gpu::GpuFfnLayerSpec& s = spec.layers[l];
        std::vector<int32_t> given;  // every other device neuron, host ids
        for (size_t k = 0; k < dev[l].size(); k += 2) given.push_back(dev[l][k]);
        std::vector<int32_t> predicted;
        for (size_t k = 0; k < dev[l].size(); k += 3) predicted.push_back(dev[l][k]);
        const std::vector<int32_t>& expect_all = l == 0 ? dev[l] : predicted;
        for (bool use_given : {true, false}) {
          const std::vector<int32_t>& active = use_given ? given : expect_all;
          std::vector<float> out(n_embd, -1.0f), again(n_embd);
          int64_t n_pred = -1, n_fired = -1;
          REQUIRE_OK((*ex)->Launch(l, xn.data(), use_given ? given.data() : nullptr,
                                   use_given ? static_cast<int64_t>(given.size()) : 0));
          REQUIRE_OK((*ex)->Wait(out.data(), &n_pred, &n_fired));
          REQUIRE(n_pred == static_cast<int64_t>(active.size()));
          REQUIRE(n_fired <= n_pred);
          REQUIRE(n_fired > 0);
          std::vector<double> bound;
          const std::vector<double> ref =
              ReferenceFfn(s.gate, s.up, s.down_t, act, xn, active, &bound);
          for (int64_t c = 0; c < n_embd; ++c) REQUIRE(std::fabs(out[c] - ref[c]) <= bound[c]);
          // Deterministic: the same launch again gives the same bits.
          REQUIRE_OK((*ex)->Launch(l, xn.data(), use_given ? given.data() : nullptr,
                                   use_given ? static_cast<int64_t>(given.size()) : 0));
          REQUIRE_OK((*ex)->Wait(again.data(), nullptr, nullptr));
          REQUIRE(again == out);
        }
      }
      // Misuse is an error, not a crash.
      std::vector<float> out(n_embd);
      REQUIRE((*ex)->Wait(out.data(), nullptr, nullptr).code() ==
              absl::StatusCode::kFailedPrecondition);
      const int32_t host_neuron = 0;  // (0 * 7) % 5 == 0 < 2: on the device in layer 0 ...
      const int32_t not_device = 2;   // (2 * 7) % 5 == 4: not on the device
      REQUIRE((*ex)->Launch(0, xn.data(), &not_device, 1).code() ==
              absl::StatusCode::kInvalidArgument);
      REQUIRE_OK((*ex)->Launch(0, xn.data(), &host_neuron, 1));
      REQUIRE((*ex)->Launch(0, xn.data(), &host_neuron, 1).code() ==
              absl::StatusCode::kFailedPrecondition);
      REQUIRE_OK((*ex)->Wait(out.data(), nullptr, nullptr));
      REQUIRE((*ex)->Launch(7, xn.data(), nullptr, 0).code() == absl::StatusCode::kInvalidArgument);
    }
  }
}

TEST_CASE("CUDA memory cap: a device part that does not fit is refused", "[cuda]") {
  if (!gpu::DeviceAvailable()) THERMOCLINE_SKIP("no CUDA device: [cuda] case skipped");
  const OwnedWeight w = RandomWeight(GgmlType::kF16, 1024, 1024, 600);  // 2 MiB per matrix
  std::vector<int32_t> all(1024);
  std::iota(all.begin(), all.end(), 0);
  gpu::GpuFfnSpec spec;
  spec.n_embd = 1024;
  spec.n_ff = 1024;
  gpu::GpuFfnLayerSpec s;
  s.gate = s.up = s.down_t = w.view;
  s.device_neurons = all;
  spec.layers = {s};
  spec.memory_cap = 5 << 20;  // 3 × 2 MiB of weights do not fit
  absl::StatusOr<std::unique_ptr<gpu::GpuFfnExecutor>> ex = gpu::CreateGpuFfnExecutor(spec);
  REQUIRE(ex.status().code() == absl::StatusCode::kResourceExhausted);
  REQUIRE(ex.status().message().find("--gpu-memory") != std::string::npos);
  spec.memory_cap = 7 << 20;
  ex = gpu::CreateGpuFfnExecutor(spec);
  REQUIRE_OK(ex.status());
  REQUIRE((*ex)->device_bytes() <= spec.memory_cap);
  REQUIRE((*ex)->device_bytes() >= 6u << 20);
  // GpuOps: the cuBLAS workspace and every call's buffers count against its cap.
  absl::StatusOr<std::unique_ptr<gpu::GpuOps>> ops = gpu::GpuOps::Create(6 << 20);
  REQUIRE_OK(ops.status());
  std::vector<float> x(1024, 1.0f), y(1024);
  REQUIRE((*ops)->MatVec(w.view, x.data(), y.data()).code() ==
          absl::StatusCode::kResourceExhausted);
  REQUIRE((*ops)->budget().used() <= (*ops)->budget().cap());
}

TEST_CASE("CUDA FFN offload: a real model's greedy tokens equal the CPU's", "[cuda]") {
  if (!gpu::DeviceAvailable()) THERMOCLINE_SKIP("no CUDA device: [cuda] case skipped");
  for (const char* name : {"stories260K.gguf", "relu-tiny.f32.gguf", "relu-tiny.f16.gguf"}) {
    const std::string path = testing::TestModelPath(name);
    if (!std::filesystem::exists(path)) THERMOCLINE_SKIP(std::string(name) + " not found");
    INFO(name);
    const LlamaModel& model = testing::CachedModel(path);
    const LlamaHparams& h = model.hparams();
    ThreadPool pool(2);
    auto cpu = Session::Create(model, &pool);
    auto gpu_session = Session::Create(model, &pool);
    REQUIRE_OK(cpu.status());
    REQUIRE_OK(gpu_session.status());
    absl::StatusOr<std::unique_ptr<gpu::GpuFfnBackend>> backend =
        gpu::GpuFfnBackend::Create(model, pool);
    REQUIRE_OK(backend.status());
    (*gpu_session)->set_ffn_backend(backend->get());
    // Layer by layer on random inputs: the GPU FFN equals the CPU's dense FFN.
    std::mt19937 rng(11);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    std::vector<float> x(h.n_embd), xn(h.n_embd), dense(h.n_embd), got(h.n_embd);
    for (int layer = 0; layer < h.n_layer; ++layer) {
      for (float& f : x) f = dist(rng);
      RmsNorm(x.data(), model.layers()[layer].ffn_norm.data(), h.n_embd, h.rms_eps, xn.data());
      (*cpu)->DenseFfn(layer, x.data(), xn.data(), 1, dense.data());
      (*backend)->Forward(layer, x.data(), xn.data(), 1, got.data());
      REQUIRE_OK((*backend)->status());
      double scale = 0, diff = 0;
      for (int64_t i = 0; i < h.n_embd; ++i) {
        scale = std::max(scale, std::fabs(double{dense[i]}));
        diff = std::max(diff, std::fabs(double{got[i]} - dense[i]));
      }
      // Float sums of n_ff and n_embd terms in other orders (the CPU's SIMD sums too): a
      // relative 1e-4 is ~100x the expected error at these sizes.
      INFO("layer " << layer);
      REQUIRE(diff <= 1e-4 * std::max(scale, 1e-6));
    }
    const std::vector<int32_t> prompt = {1, 403, 261, 290, 7};
    const std::vector<int32_t> want = testing::GreedyIds(**cpu, prompt, 32);
    const std::vector<int32_t> got_ids = testing::GreedyIds(**gpu_session, prompt, 32);
    REQUIRE_OK((*backend)->status());
    REQUIRE(got_ids == want);
  }
}

}  // namespace
}  // namespace thermocline
