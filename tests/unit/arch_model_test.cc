// Families without llama.cpp outputs here (qwen3, gemma3, phi3, qwen2moe, qwen3moe, RoPE
// scaling, sliding windows), checked on models built from stories260K's weights in the test:
// either the construction must reproduce stories260K exactly (phi3), or the test's plain
// double-precision forward pass (arch_reference_model.h, itself checked against stories260K's
// independent reference first) says what the family computes. Also GGUF v2.
#include <cmath>
#include <fstream>
#include <iterator>
#include <random>

#include "arch_reference_model.h"
#include "engine/model/session.h"
#include "engine/sparse/sparse_ffn.h"
#include "model_fixtures.h"

namespace thermocline {
namespace {

using testing::CachedModel;
using testing::GreedyIds;
using testing::LoadReference;
using testing::RefGreedy;
using testing::RefLayout;
using testing::RefLogits;
using testing::RefModel;
using testing::TestModelPath;

// Our f32 forward pass against the double-precision reference: float32 rounding over dot
// products of length <= 172 and 5-6 layers stays far below 1e-3 on logits of magnitude <= 20
// (as against stories260K's f32 PyTorch reference, model_reference_test); a missing norm, a
// wrong window, RoPE base or expert weight moves them by > 0.1.
constexpr double kLogitTolerance = 1e-3;
// Tokens compared with the reference's greedy continuation (it recomputes the sequence for
// each token, so it is kept short).
constexpr int kGreedyTokens = 16;

const GgufFile& Stories() {
  static std::unique_ptr<GgufFile> file = [] {
    auto f = GgufFile::Open(TestModelPath("stories260K.gguf"));
    REQUIRE(f.ok());
    return std::move(*f);
  }();
  return *file;
}

std::vector<std::string> Prompts() {
  return {"Once upon a time", "Lily and Ben", "The cat", "One day, a little"};
}

double MaxDiff(const float* a, const std::vector<double>& b) {
  double m = 0;
  for (size_t i = 0; i < b.size(); ++i) m = std::max(m, std::abs(a[i] - b[i]));
  return m;
}

// The engine on `path` against the reference on every prompt: first-position logits and the
// first kGreedyTokens greedy tokens.
void CheckAgainstReference(const std::string& path, const RefModel& ref, int64_t n_ctx = 0) {
  auto model = LlamaModel::Load(path);
  INFO(path << ": " << model.status().ToString());
  REQUIRE(model.ok());
  ThreadPool pool(2);
  SessionOptions so;
  so.n_ctx = n_ctx;
  for (const std::string& prompt : Prompts()) {
    INFO("prompt '" << prompt << "'");
    const std::vector<int32_t> ids = (*model)->tokenizer().Encode(prompt, true);
    auto session = Session::Create(**model, &pool, so);
    REQUIRE(session.ok());
    REQUIRE((*session)->Eval(ids).ok());
    CHECK(MaxDiff((*session)->logits(), RefLogits(ref, ids).back()) < kLogitTolerance);
    CHECK(GreedyIds(**session, ids, kGreedyTokens) == RefGreedy(ref, ids, kGreedyTokens));
  }
}

void PermuteQkForNeox(RefModel& m) {
  m.neox = true;
  for (testing::RefLayer& L : m.layers) {
    L.wq = testing::PermuteForNeox(L.wq, m.n_head, m.head_dim, m.n_embd);
    L.wk = testing::PermuteForNeox(L.wk, m.n_head_kv, m.head_dim, m.n_embd);
  }
}

std::vector<float> Uniform(size_t n, float lo, float hi, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = u(rng);
  return v;
}

GgufKeyValue U32(std::string key, uint32_t v) {
  return {std::move(key), GgufValue::Uint(GgufValueType::kUint32, v)};
}
GgufKeyValue F32(std::string key, float v) {
  return {std::move(key), GgufValue::Float(GgufValueType::kFloat32, v)};
}
GgufKeyValue Str(std::string key, std::string v) { return {std::move(key), GgufValue::String(v)}; }

TEST_CASE("the reference forward pass reproduces stories260K's reference", "[model][arch]") {
  const RefModel m = testing::Stories260K(Stories());
  const nlohmann::json ref = LoadReference("stories260K.reference.json");
  for (const nlohmann::json& p : ref["prompts"]) {
    INFO(p["prompt"].get<std::string>());
    const std::vector<int32_t> ids = p["prompt_ids"];
    const std::vector<float> first = p["first_logits"];
    const std::vector<double> got = RefLogits(m, ids).back();
    double max_err = 0;
    for (size_t i = 0; i < first.size(); ++i)
      max_err = std::max(max_err, std::abs(got[i] - first[i]));
    CHECK(max_err < kLogitTolerance);
    const std::vector<int32_t> greedy = p["greedy_ids"];
    CHECK(RefGreedy(m, ids, kGreedyTokens) ==
          std::vector<int32_t>(greedy.begin(), greedy.begin() + kGreedyTokens));
  }
}

TEST_CASE("a GGUF v2 file loads and gives the tokens of the v3 file", "[model][gguf]") {
  // Version 2 differs from 3 only for big-endian files, so stories260K with its version field
  // set to 2 is a v2 file of the same model.
  std::ifstream in(TestModelPath("stories260K.gguf"), std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  REQUIRE(bytes.size() > 8);
  const uint32_t two = 2;
  std::memcpy(bytes.data() + 4, &two, 4);
  auto file = GgufFile::FromBytes(bytes);
  REQUIRE(file.ok());
  CHECK((*file)->version() == 2);
  auto model = LlamaModel::FromGguf(std::move(*file));
  REQUIRE(model.ok());
  const nlohmann::json ref = LoadReference("stories260K.reference.json");
  ThreadPool pool(2);
  for (const nlohmann::json& p : ref["prompts"]) {
    auto session = Session::Create(**model, &pool);
    REQUIRE(session.ok());
    const std::vector<int32_t> expected = p["greedy_ids"];
    CHECK(GreedyIds(**session, p["prompt_ids"].get<std::vector<int32_t>>(),
                    static_cast<int>(expected.size())) == expected);
  }
}

// phi3's fused attn_qkv holds stories260K's Q (NEOX-permuted), K (permuted) and V rows, its
// fused ffn_up the gate rows then the up rows: the same model, so stories260K's reference
// holds as it is (logits within model_reference_test's 1e-3, all 48 greedy tokens).
std::string WritePhi3(int64_t window, const std::string& name) {
  RefModel m = testing::Stories260K(Stories());
  PermuteQkForNeox(m);
  RefLayout layout;
  layout.arch = "phi3";
  layout.fused_qkv = true;
  layout.fused_gate_up = true;
  layout.extra = {U32("phi3.attention.sliding_window", static_cast<uint32_t>(window))};
  return testing::WriteRefModel(m, layout, Stories(), name);
}

TEST_CASE("phi3 (fused QKV and gate/up, NEOX RoPE) reproduces stories260K", "[model][arch]") {
  // A window of 512 positions is the whole context: it changes nothing at <= 64 positions.
  const LlamaModel& model = CachedModel(WritePhi3(512, "phi3.gguf"));
  CHECK(model.architecture().name == std::string("phi3"));
  const nlohmann::json ref = LoadReference("stories260K.reference.json");
  ThreadPool pool(2);
  for (const nlohmann::json& p : ref["prompts"]) {
    INFO(p["prompt"].get<std::string>());
    const std::vector<int32_t> ids = model.tokenizer().Encode(p["prompt"].get<std::string>(), true);
    CHECK(ids == p["prompt_ids"].get<std::vector<int32_t>>());
    auto session = Session::Create(model, &pool);
    REQUIRE(session.ok());
    REQUIRE((*session)->Eval(ids).ok());
    const std::vector<float> first = p["first_logits"];
    double max_err = 0;
    for (size_t i = 0; i < first.size(); ++i) {
      max_err = std::max(max_err, std::abs(double{(*session)->logits()[i]} - first[i]));
    }
    CHECK(max_err < kLogitTolerance);
    const std::vector<int32_t> expected = p["greedy_ids"];
    CHECK(GreedyIds(**session, ids, static_cast<int>(expected.size())) == expected);
  }
}

TEST_CASE("the sparse FFN runs other families' gated FFNs, phi3's fused views included",
          "[model][arch][sparse]") {
  // A plan without predictors makes every neuron a candidate and, at magnitude threshold 0,
  // every nonzero activation fires: the sparse FFN computes the dense FFN, so phi3 (whose gate
  // and up are row ranges of one fused tensor) and qwen2 give their dense greedy tokens.
  const nlohmann::json ref = LoadReference("stories260K.reference.json");
  for (const std::string path :
       {WritePhi3(512, "phi3.gguf"), TestModelPath("arch/stories260K-qwen2.gguf")}) {
    INFO(path);
    const LlamaModel& model = CachedModel(path);
    ThreadPool pool(2);
    SparsePlan plan;
    plan.layers.resize(model.hparams().n_layer);
    auto dense = testing::NewEngineSession(model, std::nullopt, pool);
    auto with_sparse = testing::NewEngineSession(model, std::move(plan), pool);
    REQUIRE(with_sparse->sparse() != nullptr);
    for (const nlohmann::json& p : ref["prompts"]) {
      const std::vector<int32_t> ids = p["prompt_ids"];
      CHECK(GreedyIds(with_sparse->session(), ids, kGreedyTokens) ==
            GreedyIds(dense->session(), ids, kGreedyTokens));
    }
  }
}

TEST_CASE("a sliding window of one position makes each token see only itself", "[model][arch]") {
  // With a window of 1, every layer's attention at position p attends to p alone: its output
  // is p's own value row, whatever came before and whatever the position's rotation. The last
  // logits of a sequence then equal those of its last token evaluated alone.
  const LlamaModel& windowed = CachedModel(WritePhi3(1, "phi3-window1.gguf"));
  const LlamaModel& full = CachedModel(WritePhi3(512, "phi3.gguf"));
  ThreadPool pool(2);
  const std::vector<int32_t> seq = windowed.tokenizer().Encode("Once upon a time, a cat", true);
  auto a = Session::Create(windowed, &pool);
  auto b = Session::Create(windowed, &pool);
  auto c = Session::Create(full, &pool);
  REQUIRE((a.ok() && b.ok() && c.ok()));
  REQUIRE((*a)->Eval(seq).ok());
  REQUIRE((*b)->Eval({&seq.back(), 1}).ok());
  REQUIRE((*c)->Eval(seq).ok());
  double same = 0, differs = 0;
  for (int64_t i = 0; i < windowed.hparams().n_vocab; ++i) {
    same = std::max(same, double{std::abs((*a)->logits()[i] - (*b)->logits()[i])});
    differs = std::max(differs, double{std::abs((*a)->logits()[i] - (*c)->logits()[i])});
  }
  CHECK(same < 1e-4);    // the same arithmetic on the same rows, but for summation order
  CHECK(differs > 0.1);  // and the context does matter without the window
}

TEST_CASE("qwen3 (per-head Q/K RMSNorm before RoPE) computes the reference", "[model][arch]") {
  RefModel m = testing::Stories260K(Stories());
  PermuteQkForNeox(m);
  for (size_t l = 0; l < m.layers.size(); ++l) {
    m.layers[l].q_norm = Uniform(m.head_dim, 0.5f, 1.5f, 10 + l);
    m.layers[l].k_norm = Uniform(m.head_dim, 0.5f, 1.5f, 20 + l);
  }
  RefLayout layout;
  layout.arch = "qwen3";
  CheckAgainstReference(testing::WriteRefModel(m, layout, Stories(), "qwen3.gguf"), m);
}

TEST_CASE("gemma2 slides its even layers' attention as the reference does", "[model][arch]") {
  // stories260K as gemma2 (the llama.cpp file's construction, at 5 layers) with a window of 3
  // positions, so that layers 0, 2 and 4 see the last 3 positions only.
  RefModel m = testing::Stories260K(Stories());
  PermuteQkForNeox(m);
  m.gelu = true;
  m.embd_scale = 8;  // sqrt(64); the file stores the embeddings divided by it
  for (float& e : m.embd) e /= 8;
  m.attn_softcap = 50;
  m.final_softcap = 30;
  for (size_t l = 0; l < m.layers.size(); ++l) {
    m.layers[l].post_attn_norm = Uniform(m.n_embd, 0.3f, 0.7f, 30 + l);
    m.layers[l].post_ffn_norm = Uniform(m.n_embd, 0.3f, 0.7f, 40 + l);
    m.layers[l].window = l % 2 == 0 ? 3 : 0;
  }
  RefLayout layout;
  layout.arch = "gemma2";
  layout.extra = {U32("gemma2.attention.sliding_window", 3)};
  CheckAgainstReference(testing::WriteRefModel(m, layout, Stories(), "gemma2-window3.gguf"), m);
}

TEST_CASE("gemma3: Q/K norms, local layers with their own window and RoPE base", "[model][arch]") {
  // Six layers (stories260K's five, then its layer 0 again): layers 0-4 are local (window 4,
  // RoPE base 10000), layer 5 is global with gemma3.rope.freq_base = 1e6.
  RefModel m = testing::Stories260K(Stories());
  m.layers.push_back(m.layers[0]);
  PermuteQkForNeox(m);
  m.gelu = true;
  m.embd_scale = 8;
  for (float& e : m.embd) e /= 8;
  for (size_t l = 0; l < m.layers.size(); ++l) {
    testing::RefLayer& L = m.layers[l];
    L.q_norm = Uniform(m.head_dim, 0.5f, 1.5f, 50 + l);
    L.k_norm = Uniform(m.head_dim, 0.5f, 1.5f, 60 + l);
    L.post_attn_norm = Uniform(m.n_embd, 0.3f, 0.7f, 70 + l);
    L.post_ffn_norm = Uniform(m.n_embd, 0.3f, 0.7f, 80 + l);
    const bool local = l < 5;
    L.window = local ? 4 : 0;
    L.rope_coef = testing::BaseRopeCoef(local ? 10000.0 : 1e6, m.head_dim);
  }
  RefLayout layout;
  layout.arch = "gemma3";
  layout.extra = {U32("gemma3.attention.sliding_window", 4), F32("gemma3.rope.freq_base", 1e6f)};
  CheckAgainstReference(testing::WriteRefModel(m, layout, Stories(), "gemma3.gguf"), m);
}

// The llama mixture of experts of arch/ (4 experts, 2 used) as a RefModel.
RefModel LlamaMoe() {
  auto f = GgufFile::Open(TestModelPath("arch/stories260K-llama-moe.gguf"));
  REQUIRE(f.ok());
  // Attention, norms and embeddings are stories260K's; the FFN is the file's experts.
  RefModel m = testing::Stories260K(Stories());
  m.n_expert_used = 2;
  for (size_t l = 0; l < m.layers.size(); ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    testing::RefLayer& L = m.layers[l];
    L.gate.clear();
    L.up.clear();
    L.down.clear();
    L.router = testing::F32Tensor(**f, b + "ffn_gate_inp.weight");
    const auto g = testing::F32Tensor(**f, b + "ffn_gate_exps.weight");
    const auto u = testing::F32Tensor(**f, b + "ffn_up_exps.weight");
    const auto d = testing::F32Tensor(**f, b + "ffn_down_exps.weight");
    const size_t per = static_cast<size_t>(m.n_ff * m.n_embd);
    for (size_t e = 0; e < 4; ++e) {
      L.exp_gate.emplace_back(g.begin() + e * per, g.begin() + (e + 1) * per);
      L.exp_up.emplace_back(u.begin() + e * per, u.begin() + (e + 1) * per);
      L.exp_down.emplace_back(d.begin() + e * per, d.begin() + (e + 1) * per);
    }
  }
  return m;
}

TEST_CASE("qwen2moe: experts weighted by their softmax probability, and a gated shared expert",
          "[model][arch]") {
  RefModel m = LlamaMoe();
  PermuteQkForNeox(m);
  m.renormalise_experts = false;
  const RefModel dense = testing::Stories260K(Stories());
  for (size_t l = 0; l < m.layers.size(); ++l) {
    testing::RefLayer& L = m.layers[l];
    L.bq = Uniform(m.n_head * m.head_dim, -0.05f, 0.05f, 90 + l);
    L.bk = Uniform(m.n_head_kv * m.head_dim, -0.05f, 0.05f, 100 + l);
    L.bv = Uniform(m.n_head_kv * m.head_dim, -0.05f, 0.05f, 110 + l);
    // The shared expert: stories260K's dense FFN, its gate sigmoid(w · xn) with small w.
    L.sh_gate = dense.layers[l].gate;
    L.sh_up = dense.layers[l].up;
    L.sh_down = dense.layers[l].down;
    L.sh_gate_inp = Uniform(m.n_embd, -0.2f, 0.2f, 120 + l);
  }
  RefLayout layout;
  layout.arch = "qwen2moe";
  layout.extra = {U32("qwen2moe.expert_count", 4), U32("qwen2moe.expert_used_count", 2),
                  U32("qwen2moe.expert_feed_forward_length", 172),
                  U32("qwen2moe.expert_shared_feed_forward_length", 172)};
  CheckAgainstReference(testing::WriteRefModel(m, layout, Stories(), "qwen2moe.gguf"), m);
}

TEST_CASE("qwen3moe: Q/K norms and renormalised top-k experts", "[model][arch]") {
  RefModel m = LlamaMoe();
  PermuteQkForNeox(m);
  for (size_t l = 0; l < m.layers.size(); ++l) {
    m.layers[l].q_norm = Uniform(m.head_dim, 0.5f, 1.5f, 130 + l);
    m.layers[l].k_norm = Uniform(m.head_dim, 0.5f, 1.5f, 140 + l);
  }
  RefLayout layout;
  layout.arch = "qwen3moe";
  layout.extra = {U32("qwen3moe.expert_count", 4), U32("qwen3moe.expert_used_count", 2),
                  U32("qwen3moe.expert_feed_forward_length", 172)};
  CheckAgainstReference(testing::WriteRefModel(m, layout, Stories(), "qwen3moe.gguf"), m);
}

// ---- RoPE scaling: each layer's angle coefficients written out from the published formulas.

RefModel StoriesWithRope(const std::vector<double>& coef, double mscale) {
  RefModel m = testing::Stories260K(Stories());
  for (testing::RefLayer& L : m.layers) {
    L.rope_coef = coef;
    L.rope_mscale = mscale;
  }
  return m;
}

RefLayout LlamaWith(std::vector<GgufKeyValue> keys) {
  RefLayout layout;
  layout.extra = std::move(keys);
  return layout;
}

TEST_CASE("linear RoPE scaling divides positions by the factor", "[model][arch][rope]") {
  std::vector<double> coef = testing::BaseRopeCoef(10000, 8);
  for (double& c : coef) c /= 4;
  const RefModel m = StoriesWithRope(coef, 1);
  const auto layout =
      LlamaWith({Str("llama.rope.scaling.type", "linear"), F32("llama.rope.scaling.factor", 4)});
  CheckAgainstReference(testing::WriteRefModel(m, layout, Stories(), "rope-linear.gguf"), m);
}

// Llama 3.1's divisor of a pair's frequency (Meta's apply_scaling): 1 for wavelengths under
// orig/high, the factor above orig/low, and in between 1 / ((1 - s)/factor + s) with
// s = (orig/wavelength - low) / (high - low).
double Llama3Divisor(double freq, double factor, double low, double high, double orig) {
  const double wavelen = 2 * M_PI / freq;
  if (wavelen < orig / high) return 1;
  if (wavelen > orig / low) return factor;
  const double s = (orig / wavelen - low) / (high - low);
  return 1 / ((1 - s) / factor + s);
}

TEST_CASE("llama3 RoPE scaling spreads the factor over the pairs by wavelength",
          "[model][arch][rope]") {
  // Original context 64 with the default low/high factors 1 and 4 puts stories260K's 4 pairs
  // (wavelengths 6.3, 63, 628, 6283 positions) in all three bands.
  std::vector<double> coef = testing::BaseRopeCoef(10000, 8);
  std::vector<float> divisors;
  for (double& c : coef) {
    divisors.push_back(static_cast<float>(Llama3Divisor(c, 8, 1, 4, 64)));
    c /= Llama3Divisor(c, 8, 1, 4, 64);
  }
  CHECK(divisors[0] == 1.0f);
  CHECK((divisors[1] > 1.0f && divisors[1] < 8.0f));
  CHECK(divisors[3] == 8.0f);
  const RefModel m = StoriesWithRope(coef, 1);
  const auto layout =
      LlamaWith({Str("llama.rope.scaling.type", "llama3"), F32("llama.rope.scaling.factor", 8),
                 U32("llama.rope.scaling.original_context_length", 64)});
  CheckAgainstReference(testing::WriteRefModel(m, layout, Stories(), "rope-llama3.gguf"), m);
  // The same divisors as a rope_freqs tensor (what llama.cpp's converter writes) are the same
  // model.
  RefLayout tensor;
  tensor.extra_tensors = {{"rope_freqs.weight", divisors}};
  CheckAgainstReference(testing::WriteRefModel(m, tensor, Stories(), "rope-freqs.gguf"), m);
}

TEST_CASE("YaRN blends interpolated and original angles per pair and scales cos and sin",
          "[model][arch][rope]") {
  // YaRN (Peng et al. 2023) with factor s = 4 over an original context of 32: pair i keeps its
  // angle when it turns more than beta_fast = 32 times over the context, is interpolated
  // (angle / s) when it turns fewer than beta_slow = 1 times, and is blended linearly between;
  // the pair index where a frequency makes r turns is d · ln(orig / (2π r)) / (2 ln base). cos
  // and sin are scaled by 1 + 0.1 ln s.
  const double s = 4, base = 10000, orig = 32, d = 8;
  auto dim = [&](double r) { return d * std::log(orig / (2 * M_PI * r)) / (2 * std::log(base)); };
  const double lo = std::max(0.0, std::floor(dim(32))), hi = std::min(d - 1, std::ceil(dim(1)));
  std::vector<double> coef = testing::BaseRopeCoef(base, 8);
  for (size_t i = 0; i < coef.size(); ++i) {
    const double keep = 1 - std::clamp((i - lo) / std::max(0.001, hi - lo), 0.0, 1.0);
    coef[i] *= keep + (1 - keep) / s;
  }
  const RefModel m = StoriesWithRope(coef, 1 + 0.1 * std::log(s));
  const auto layout =
      LlamaWith({Str("llama.rope.scaling.type", "yarn"), F32("llama.rope.scaling.factor", 4),
                 U32("llama.rope.scaling.original_context_length", 32)});
  CheckAgainstReference(testing::WriteRefModel(m, layout, Stories(), "rope-yarn.gguf"), m);
}

TEST_CASE("LongRoPE (phi3) takes the short factors up to the original context, then the long",
          "[model][arch][rope]") {
  RefModel m = testing::Stories260K(Stories());
  PermuteQkForNeox(m);
  const std::vector<float> shrt = {1.0f, 1.5f, 2.0f, 3.0f}, lng = {1.0f, 2.0f, 4.0f, 8.0f};
  RefLayout layout;
  layout.arch = "phi3";
  layout.fused_qkv = layout.fused_gate_up = true;
  layout.extra = {Str("phi3.rope.scaling.type", "longrope"),
                  U32("phi3.rope.scaling.original_context_length", 128),
                  F32("phi3.rope.scaling.attn_factor", 1.2f)};
  layout.extra_tensors = {{"rope_factors_long.weight", lng}, {"rope_factors_short.weight", shrt}};
  const std::string path = testing::WriteRefModel(m, layout, Stories(), "phi3-longrope.gguf");
  for (const auto& [n_ctx, factors] :
       {std::pair{int64_t{128}, shrt}, std::pair{int64_t{256}, lng}}) {
    INFO("n_ctx " << n_ctx);
    std::vector<double> coef = testing::BaseRopeCoef(10000, 8);
    for (size_t i = 0; i < coef.size(); ++i) coef[i] /= factors[i];
    for (testing::RefLayer& L : m.layers) {
      L.rope_coef = coef;
      L.rope_mscale = 1.2f;
    }
    CheckAgainstReference(path, m, n_ctx);
  }
}

}  // namespace
}  // namespace thermocline
