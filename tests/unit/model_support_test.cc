// What is refused, and how: unsupported architectures, tokenizers, tensors and keys at load and
// by the registration-time check (CheckModelSupported), and the engine paths that compute only
// part of the families (GPU layers, sparse and GPU FFN, the profiler) on models they would get
// wrong.
#include "engine/model/model_support.h"

#include <algorithm>
#include <functional>

#include "bench/gpu_ffn_backend.h"
#include "engine/gpu/gpu_layers.h"
#include "engine/sparse/sparse_ffn.h"
#include "model_fixtures.h"
#include "offline/profile/activation_profiler.h"
#include "offline/profile/profile_run.h"

namespace thermocline {
namespace {

using testing::CachedModel;
using testing::TestModelPath;

const GgufFile& Stories() {
  static std::unique_ptr<GgufFile> file = [] {
    auto f = GgufFile::Open(TestModelPath("stories260K.gguf"));
    REQUIRE(f.ok());
    return std::move(*f);
  }();
  return *file;
}

// stories260K rewritten with one change to its metadata or tensors.
std::string Variant(const std::string& name, const std::function<void(GgufWriter&)>& change,
                    const std::vector<std::string>& drop_tensors = {}) {
  GgufWriter w;
  for (const GgufKeyValue& kv : Stories().metadata()) w.Set(kv.key, kv.value);
  for (const GgufTensorInfo& t : Stories().tensors()) {
    if (std::find(drop_tensors.begin(), drop_tensors.end(), t.name) != drop_tensors.end()) {
      continue;
    }
    REQUIRE(w.AddTensor(t.name, t.type, t.dims, t.data, t.size_bytes).ok());
  }
  change(w);
  const std::string path = (testing::TempDir() / name).string();
  REQUIRE(w.Write(path).ok());
  return path;
}

std::string LoadError(const std::string& path, const ModelOptions& options = {}) {
  auto model = LlamaModel::Load(path, options);
  REQUIRE_FALSE(model.ok());
  // The registration check says the same, before any weight is read.
  auto check = CheckModelSupported(path, options);
  REQUIRE_FALSE(check.ok());
  CHECK(check.status().code() == model.status().code());
  return std::string(model.status().message());
}

TEST_CASE("CheckModelSupported accepts every supported test model", "[model][support]") {
  for (const std::string f :
       {"stories260K.gguf", "relu-tiny.f16.gguf", "arch/stories260K-qwen2.gguf",
        "arch/stories260K-gemma2.gguf", "arch/stories260K-llama-moe.gguf",
        "arch/stories260K-llama-ropefreqs.gguf"}) {
    INFO(f);
    auto s = CheckModelSupported(TestModelPath(f));
    INFO(s.status().ToString());
    REQUIRE(s.ok());
    CHECK(s->warnings.empty());
  }
  CHECK(CheckModelSupported(TestModelPath("arch/stories260K-gemma2.gguf"))->architecture ==
        "gemma2");
  auto v1 = CheckModelSupported(TestModelPath("stories260K.ggufv1-original.gguf"));
  CHECK_THAT(std::string(v1.status().message()), Catch::Contains("GGUF version 1"));
}

TEST_CASE("an unsupported architecture is refused by name", "[model][support]") {
  const std::string path =
      Variant("mamba.gguf", [](GgufWriter& w) { w.SetString("general.architecture", "mamba"); });
  const std::string e = LoadError(path);
  CHECK_THAT(e, Catch::Contains("architecture 'mamba' is not supported") &&
                    Catch::Contains("qwen2") && Catch::Contains("gemma2"));
}

TEST_CASE("a tensor the family does not have, or lacks, is refused", "[model][support]") {
  // A bias llama files may have is fine; one qwen3 never has is refused, not ignored.
  const std::string extra = Variant("llama-extra.gguf", [](GgufWriter& w) {
    REQUIRE(w.AddTensorCopy("blk.0.attn_q_norm.weight", GgmlType::kF32, {8},
                            std::vector<uint8_t>(32, 0))
                .ok());
  });
  CHECK_THAT(LoadError(extra), Catch::Contains("blk.0.attn_q_norm.weight") &&
                                   Catch::Contains("'llama' model does not have"));
  // qwen2 needs its Q/K/V biases.
  const std::string qwen2 = Variant("qwen2-nobias.gguf", [](GgufWriter& w) {
    for (const GgufKeyValue& kv : Stories().metadata()) {
      if (kv.key.rfind("llama.", 0) == 0) {
        w.Remove(kv.key);
        w.Set("qwen2." + kv.key.substr(6), kv.value);
      }
    }
    w.SetString("general.architecture", "qwen2");
  });
  CHECK_THAT(LoadError(qwen2), Catch::Contains("tensor blk.0.attn_q.bias is missing"));
}

TEST_CASE("unsupported keys and options are refused by name", "[model][support]") {
  const std::string rope = Variant("rope-dynamic.gguf", [](GgufWriter& w) {
    w.SetString("llama.rope.scaling.type", "dynamic");
  });
  CHECK_THAT(LoadError(rope), Catch::Contains("llama.rope.scaling.type = \"dynamic\""));
  // Gemma's FFN is GELU-gated; a ReLU override cannot apply.
  ModelOptions relu;
  relu.activation = FfnActivation::kRelu;
  CHECK_THAT(LoadError(TestModelPath("arch/stories260K-gemma2.gguf"), relu),
             Catch::Contains("gemma2") && Catch::Contains("gelu"));
}

TEST_CASE("a BPE pre-tokenizer Thermocline does not implement is refused by name",
          "[model][support][tokenizer]") {
  // stories260K's vocabulary declared as byte-level BPE with a made-up pre-tokenizer.
  auto bpe = [](const std::string& pre) {
    return [pre](GgufWriter& w) {
      w.SetString("tokenizer.ggml.model", "gpt2");
      w.Set("tokenizer.ggml.merges", GgufValue::StringArray({"a b"}));
      if (pre.empty()) {
        w.Remove("tokenizer.ggml.pre");
      } else {
        w.SetString("tokenizer.ggml.pre", pre);
      }
    };
  };
  const std::string unknown = Variant("pre-unknown.gguf", bpe("made-up-bpe"));
  CHECK_THAT(LoadError(unknown), Catch::Contains("tokenizer.ggml.pre = \"made-up-bpe\"") &&
                                     Catch::Contains("does not implement"));
  // Without the key (old conversions): GPT-2's pre-tokenizer, and a warning says so.
  auto check = CheckModelSupported(Variant("pre-missing.gguf", bpe("")));
  REQUIRE(check.ok());
  REQUIRE(check->warnings.size() == 1);
  CHECK_THAT(check->warnings[0], Catch::Contains("tokenizer.ggml.pre is missing"));
  CHECK(CheckModelSupported(Variant("pre-qwen2.gguf", bpe("qwen2")))->warnings.empty());
}

TEST_CASE("paths that compute only llama's layer refuse other families", "[model][support]") {
  const LlamaModel& qwen2 = CachedModel(TestModelPath("arch/stories260K-qwen2.gguf"));
  const LlamaModel& gemma2 = CachedModel(TestModelPath("arch/stories260K-gemma2.gguf"));
  const LlamaModel& moe = CachedModel(TestModelPath("arch/stories260K-llama-moe.gguf"));
  const LlamaModel& ropefreqs = CachedModel(TestModelPath("arch/stories260K-llama-ropefreqs.gguf"));
  // RoPE factors live in the cos/sin table the session hands every backend: no refusal.
  CHECK(RequireLlamaLayers(ropefreqs, "--gpu-layers").ok());
  CHECK(RequireGatedFfn(ropefreqs, "the sparse FFN").ok());

  auto layers =
      gpu::PlanWholeLayers(qwen2, gpu::kAutoLayers, 128, 1, uint64_t{1} << 30, KvType::kF32);
  REQUIRE_FALSE(layers.ok());
  CHECK(layers.status().code() == absl::StatusCode::kFailedPrecondition);
  CHECK_THAT(std::string(layers.status().message()),
             Catch::Contains("--gpu-layers cannot run qwen2 models") &&
                 Catch::Contains("NEOX RoPE") && Catch::Contains("attention biases"));
  CHECK_THAT(std::string(RequireLlamaLayers(gemma2, "x").message()),
             Catch::Contains("soft-capping") && Catch::Contains("GELU"));

  ThreadPool pool(1);
  for (const LlamaModel* m : {&moe, &gemma2}) {
    std::vector<SparseLayerPlan> plan(m->hparams().n_layer);
    auto sparse = SparseWeights::Build(*m, std::move(plan), pool);
    REQUIRE_FALSE(sparse.ok());
    CHECK(sparse.status().code() == absl::StatusCode::kFailedPrecondition);
    CHECK_THAT(std::string(sparse.status().message()), Catch::Contains("the sparse FFN"));
    auto gpu_ffn = gpu::GpuFfnBackend::Create(*m, pool, uint64_t{1} << 30);
    CHECK(gpu_ffn.status().code() == absl::StatusCode::kFailedPrecondition);
  }
  CHECK_THAT(std::string(RequireGatedFfn(moe, "the profiler").message()),
             Catch::Contains("mixture of experts"));
  // A mixture of experts is profiled for its routing (moe_test.cc); the GELU-gated FFN is not.
  offline::ActivationProfiler profiler(gemma2.hparams(), offline::ProfilerOptions{});
  offline::ProfileRunOptions po;
  auto run = offline::RunProfile(gemma2, pool, profiler, po, nullptr);
  CHECK(run.status().code() == absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace thermocline
