#include "bench/synth.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/gguf/gguf.h"
#include "engine/model/cpu_ops.h"
#include "engine/model/llama_model.h"
#include "engine/model/session.h"
#include "engine/ops/kernels.h"
#include "engine/ops/type_table.h"
#include "engine/runtime/engine.h"

namespace thermocline {
namespace {

// splitmix64: a fast, well-mixed generator seeded per row, so output is independent of the
// number of threads.
struct SplitMix {
  uint64_t state;
  uint64_t Next() {
    uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  float Uniform() { return static_cast<float>(Next() >> 40) * (1.0f / 16777216.0f) * 2.0f - 1.0f; }
};

// A (rows, cols) matrix of uniform values with standard deviation scale/sqrt(cols), in `type`.
// edit(row, values) may change a row before it is converted.
std::vector<uint8_t> RandomMatrix(int64_t rows, int64_t cols, GgmlType type, uint64_t seed,
                                  ThreadPool& pool, float scale = 1.0f,
                                  const std::function<void(int64_t, float*)>& edit = nullptr) {
  const size_t row_bytes = RowBytes(type, cols);
  std::vector<uint8_t> out(row_bytes * rows);
  const TypeKernels* k = KernelsFor(type);
  const float amplitude = scale * std::sqrt(3.0f / static_cast<float>(cols));
  std::vector<std::vector<float>> tmp(pool.size(), std::vector<float>(cols));
  pool.ParallelFor(rows, 64, [&](int thread, int64_t begin, int64_t end) {
    float* buf = tmp[thread].data();
    for (int64_t r = begin; r < end; ++r) {
      SplitMix rng{seed * 0x100000001b3ull + static_cast<uint64_t>(r)};
      for (int64_t c = 0; c < cols; ++c) buf[c] = rng.Uniform() * amplitude;
      if (edit) edit(r, buf);
      QuantizeWeights(*k, buf, out.data() + r * row_bytes, cols);
    }
  });
  return out;
}

// Phi^-1(p) by bisection on the normal CDF (only at synthesis time).
double InverseNormalCdf(double p) {
  double lo = -10, hi = 10;
  for (int i = 0; i < 80; ++i) {
    const double mid = 0.5 * (lo + hi);
    (0.5 * std::erfc(-mid / std::sqrt(2.0)) < p ? lo : hi) = mid;
  }
  return 0.5 * (lo + hi);
}

// Per layer, the gate's bias z_i (in noise deviations) of each neuron: the power-law firing
// probabilities in an order shuffled per layer, so hot neurons are spread over the matrix.
std::vector<float> GateBiases(const std::vector<double>& firing, uint64_t seed) {
  std::vector<int64_t> order(firing.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int64_t>(i);
  SplitMix rng{seed};
  for (size_t i = order.size(); i > 1; --i) std::swap(order[i - 1], order[rng.Next() % i]);
  std::vector<float> z(firing.size());
  for (size_t r = 0; r < firing.size(); ++r) {
    z[order[r]] = static_cast<float>(InverseNormalCdf(firing[r]));
  }
  return z;
}

// A sparse model's gate rows (see synth.h): the token-dependent part of a row lies in a
// subspace of kGateRank directions of xn, as in trained models whose FFN inputs live near a
// low-dimensional manifold, so that low-rank predictors can learn who fires; a full-rank part
// of relative variance kGateNoise keeps them from being exact.
constexpr int kGateRank = 16;
constexpr float kGateNoise = 0.02f;

// (kGateRank, n) random directions with |v| ~ 1 and no component on dimension 0.
std::vector<float> GateBasis(int64_t n, uint64_t seed) {
  std::vector<float> basis(kGateRank * n);
  SplitMix rng{seed ^ 0x5bd1e995ull};
  const float amplitude = std::sqrt(3.0f / static_cast<float>(n));
  for (int k = 0; k < kGateRank; ++k) {
    for (int64_t j = 1; j < n; ++j) basis[k * n + j] = rng.Uniform() * amplitude;
  }
  return basis;
}

// The coefficients a_k of a gate row on the basis, var(a_k) = 1 / kGateRank.
void GateCoefficients(uint64_t seed, int64_t row, float* a) {
  SplitMix rng{(seed + 0x9e37ull) * 0x100000001b3ull + static_cast<uint64_t>(row)};
  const float amplitude = std::sqrt(3.0f / kGateRank);
  for (int k = 0; k < kGateRank; ++k) a[k] = rng.Uniform() * amplitude;
}

// The gate's weight on dimension 0 for a bias of z deviations (see MakeGateRow).
float BiasWeight(float z, int64_t n) {
  return z * std::sqrt((1.0f + kGateNoise) / static_cast<float>(n));
}

// v holds the row's full-rank noise (std sqrt(kGateNoise / n)); adds Σ_k a_k basis_k and sets
// the bias weight. The dot with xn then has variance (1 + kGateNoise) / 2 besides the bias, so
// z is scaled to keep P(fire) = Phi(z).
void MakeGateRow(const std::vector<float>& basis, float z, uint64_t seed, int64_t row, int64_t n,
                 float* v) {
  float a[kGateRank];
  GateCoefficients(seed, row, a);
  for (int k = 0; k < kGateRank; ++k) {
    const float* b = basis.data() + k * n;
    for (int64_t j = 1; j < n; ++j) v[j] += a[k] * b[j];
  }
  v[0] = BiasWeight(z, n);
}

uint64_t LayerSeed(const SynthOptions& o, int64_t layer) {
  return o.seed * 7919 + static_cast<uint64_t>(layer);
}

}  // namespace

absl::StatusOr<std::vector<double>> PowerLawFiring(int64_t n, double sparsity,
                                                   double hot_fraction) {
  if (!(sparsity >= 0.5 && sparsity <= 0.999)) {
    return absl::InvalidArgumentError(
        absl::StrCat("sparsity ", sparsity, ": expected a value in [0.5, 0.999]"));
  }
  if (!(hot_fraction > 0 && hot_fraction < 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("hot fraction ", hot_fraction, ": expected a value in (0, 1)"));
  }
  const double hot = hot_fraction * static_cast<double>(n);
  auto firing = [&](double alpha, std::vector<double>* out) {
    double sum = 0;
    for (int64_t r = 0; r < n; ++r) {
      const double p = std::min(0.99, 0.5 * std::pow((r + 1) / hot, -alpha));
      if (out != nullptr) (*out)[r] = p;
      sum += p;
    }
    return sum / static_cast<double>(n);
  };
  // The mean falls from 0.5 (alpha = 0) towards 0.99 * hot_fraction as alpha grows.
  const double target = 1.0 - sparsity;
  double lo = 0, hi = 50;
  for (int i = 0; i < 100; ++i) {
    const double mid = 0.5 * (lo + hi);
    (firing(mid, nullptr) > target ? lo : hi) = mid;
  }
  std::vector<double> p(n);
  const double mean = firing(hi, &p);
  if (std::fabs(mean - target) > 0.002) {
    return absl::InvalidArgumentError(
        absl::StrCat("sparsity ", sparsity, " with hot fraction ", hot_fraction,
                     " is not reachable: hot neurons alone fire for ", 0.99 * hot_fraction,
                     " of the neurons per token; lower --hot-fraction"));
  }
  return p;
}

absl::Status SynthesizeModel(const SynthOptions& o, const std::string& path, ThreadPool& pool) {
  if (o.n_layer < 1 || o.n_embd < 1 || o.n_ff < 1 || o.n_head < 1 || o.n_head_kv < 1 ||
      o.n_vocab < 260 || o.n_ctx < 1) {
    return absl::InvalidArgumentError(
        "synth: layers, embd, ff, heads, kv-heads and ctx must be positive; vocab at least 260");
  }
  if (o.n_embd % o.n_head != 0 || o.n_head % o.n_head_kv != 0 || (o.n_embd / o.n_head) % 2 != 0) {
    return absl::InvalidArgumentError(
        "synth: embd must be a multiple of heads with an even head size, and heads a multiple "
        "of kv-heads");
  }
  if (FindWeightType(o.type) == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("synth: unsupported type ", TypeName(o.type)));
  }
  const int64_t block = TypeInfo(o.type).block_size;
  if (o.n_embd % block != 0 || o.n_ff % block != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("synth: embd and ff must be multiples of ", block, " for ", TypeName(o.type)));
  }
  const int64_t head_dim = o.n_embd / o.n_head;
  if (!(o.sparsity >= 0 && o.sparsity < 1)) {  // NaN would pass as 0: a dense model
    return absl::InvalidArgumentError(
        absl::StrCat("synth: sparsity ", o.sparsity, ": 0 (dense) or a value in [0.5, 0.999]"));
  }
  const bool sparse = o.sparsity > 0;
  const bool moe = o.n_expert > 0;
  if (moe && (o.n_expert_used < 1 || o.n_expert_used > o.n_expert)) {
    return absl::InvalidArgumentError("synth: --experts needs 1 <= --experts-used <= --experts");
  }
  std::vector<double> firing;
  if (sparse) {
    if (o.activation == FfnActivation::kSilu) {
      return absl::InvalidArgumentError(
          "synth: --sparsity needs a ReLU-family activation (--activation relu or drelu)");
    }
    absl::StatusOr<std::vector<double>> p = PowerLawFiring(o.n_ff, o.sparsity, o.hot_fraction);
    if (!p.ok()) return absl::InvalidArgumentError(absl::StrCat("synth: ", p.status().message()));
    firing = *std::move(p);
  }

  GgufWriter w;
  w.SetString("general.architecture", "llama");
  w.SetString("general.name", "thermocline-synth");
  w.SetUint32("llama.context_length", static_cast<uint32_t>(o.n_ctx));
  w.SetUint32("llama.embedding_length", static_cast<uint32_t>(o.n_embd));
  w.SetUint32("llama.block_count", static_cast<uint32_t>(o.n_layer));
  w.SetUint32("llama.feed_forward_length", static_cast<uint32_t>(o.n_ff));
  w.SetUint32("llama.attention.head_count", static_cast<uint32_t>(o.n_head));
  w.SetUint32("llama.attention.head_count_kv", static_cast<uint32_t>(o.n_head_kv));
  w.SetUint32("llama.rope.dimension_count", static_cast<uint32_t>(head_dim));
  w.SetFloat32("llama.attention.layer_norm_rms_epsilon", 1e-5f);
  w.SetFloat32("llama.rope.freq_base", 10000.0f);
  w.SetString("llama.feed_forward_activation", ActivationName(o.activation));
  if (moe) {
    w.SetUint32("llama.expert_count", static_cast<uint32_t>(o.n_expert));
    w.SetUint32("llama.expert_used_count", static_cast<uint32_t>(o.n_expert_used));
  }

  // A SentencePiece-style vocabulary: unk, bos, eos, the 256 byte tokens, then filler pieces.
  std::vector<std::string> tokens = {"<unk>", "<s>", "</s>"};
  std::vector<double> scores = {0, 0, 0};
  std::vector<int64_t> types = {2, 3, 3};
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    tokens.push_back(name);
    scores.push_back(0);
    types.push_back(6);
  }
  for (int64_t i = static_cast<int64_t>(tokens.size()); i < o.n_vocab; ++i) {
    tokens.push_back(absl::StrCat("\xe2\x96\x81t", i));
    scores.push_back(-static_cast<double>(i));
    types.push_back(1);
  }
  w.SetString("tokenizer.ggml.model", "llama");
  w.Set("tokenizer.ggml.tokens", GgufValue::StringArray(std::move(tokens)));
  w.Set("tokenizer.ggml.scores", GgufValue::FloatArray(GgufValueType::kFloat32, std::move(scores)));
  w.Set("tokenizer.ggml.token_type", GgufValue::IntArray(GgufValueType::kInt32, std::move(types)));
  w.SetUint32("tokenizer.ggml.bos_token_id", 1);
  w.SetUint32("tokenizer.ggml.eos_token_id", 2);
  w.SetUint32("tokenizer.ggml.unknown_token_id", 0);

  // Sparse layout (see synth.h): embeddings of std 1 per element plus the constant A = sqrt(n)
  // in dimension 0, so rms(x) = sqrt(2), xn_0 = sqrt(n / 2) and the rest of a gate row's dot has
  // variance 1/2. A gate weight z / sqrt(n) on dimension 0 then adds z noise-deviations.
  const float n = static_cast<float>(o.n_embd);
  const float out_scale = sparse ? 0.3f / std::sqrt(static_cast<float>(o.n_layer)) : 1.0f;
  uint64_t seed = o.seed;
  auto add = [&](const std::string& name, int64_t rows, int64_t cols, float scale,
                 const std::function<void(int64_t, float*)>& edit) {
    return w.AddTensorCopy(name, o.type, {cols, rows},
                           RandomMatrix(rows, cols, o.type, ++seed, pool, scale, edit));
  };
  auto add_matrix = [&](const std::string& name, int64_t rows, int64_t cols) {
    return add(name, rows, cols, 1.0f, nullptr);
  };
  // attn_output and ffn_down: scaled down, and never writing dimension 0.
  auto add_output = [&](const std::string& name, int64_t rows, int64_t cols) {
    if (!sparse) return add_matrix(name, rows, cols);
    return add(name, rows, cols, out_scale, [&](int64_t r, float* v) {
      if (r == 0) std::fill_n(v, cols, 0.0f);
    });
  };
  auto add_ones = [&](const std::string& name) {
    std::vector<uint8_t> bytes(o.n_embd * sizeof(float));
    const float one = 1.0f;
    for (int64_t i = 0; i < o.n_embd; ++i) std::memcpy(bytes.data() + i * 4, &one, 4);
    return w.AddTensorCopy(name, GgmlType::kF32, {o.n_embd}, std::move(bytes));
  };
  absl::Status s = sparse ? add("token_embd.weight", o.n_vocab, o.n_embd, std::sqrt(n),
                                [&](int64_t, float* v) { v[0] = std::sqrt(n); })
                          : add_matrix("token_embd.weight", o.n_vocab, o.n_embd);
  for (int64_t l = 0; l < o.n_layer && s.ok(); ++l) {
    const std::string b = absl::StrCat("blk.", l, ".");
    if (s.ok()) s = add_ones(b + "attn_norm.weight");
    if (s.ok()) s = add_matrix(b + "attn_q.weight", o.n_embd, o.n_embd);
    if (s.ok()) s = add_matrix(b + "attn_k.weight", o.n_head_kv * head_dim, o.n_embd);
    if (s.ok()) s = add_matrix(b + "attn_v.weight", o.n_head_kv * head_dim, o.n_embd);
    if (s.ok()) s = add_output(b + "attn_output.weight", o.n_embd, o.n_embd);
    if (s.ok()) s = add_ones(b + "ffn_norm.weight");
    if (moe) {
      // Expert e's rows follow expert e - 1's: the 3-D tensors (n_embd, n_ff, n_expert) and
      // (n_ff, n_embd, n_expert) hold n_expert matrices one after another.
      // With a sparsity every expert's neurons fire as a dense sparse model's do (its own
      // biases and directions, from its own seed), and its down never writes dimension 0.
      auto add_experts = [&](const std::string& name, int64_t rows, int64_t cols, float scale,
                             const std::function<void(int64_t, float*)>& edit) {
        return w.AddTensorCopy(
            name, o.type, {cols, rows, o.n_expert},
            RandomMatrix(rows * o.n_expert, cols, o.type, ++seed, pool, scale, edit));
      };
      std::vector<uint64_t> expert_seed(o.n_expert);
      std::vector<std::vector<float>> z(o.n_expert), basis(o.n_expert);
      for (int64_t e = 0; sparse && e < o.n_expert; ++e) {
        expert_seed[e] = LayerSeed(o, l) * 131 + static_cast<uint64_t>(e) + 1;
        z[e] = GateBiases(firing, expert_seed[e]);
        basis[e] = GateBasis(o.n_embd, expert_seed[e]);
      }
      const std::function<void(int64_t, float*)> gate_rows = [&](int64_t row, float* v) {
        const int64_t e = row / o.n_ff, r = row % o.n_ff;
        MakeGateRow(basis[e], z[e][r], expert_seed[e], r, o.n_embd, v);
      };
      const std::function<void(int64_t, float*)> down_rows = [&](int64_t row, float* v) {
        if (row % o.n_embd == 0) std::fill_n(v, o.n_ff, 0.0f);
      };
      if (s.ok()) {
        s = w.AddTensorCopy(
            b + "ffn_gate_inp.weight", GgmlType::kF32, {o.n_embd, o.n_expert},
            RandomMatrix(o.n_expert, o.n_embd, GgmlType::kF32, ++seed, pool, 1.0f, nullptr));
      }
      if (s.ok()) {
        s = sparse ? add_experts(b + "ffn_gate_exps.weight", o.n_ff, o.n_embd,
                                 std::sqrt(kGateNoise), gate_rows)
                   : add_experts(b + "ffn_gate_exps.weight", o.n_ff, o.n_embd, 1.0f, nullptr);
      }
      if (s.ok()) s = add_experts(b + "ffn_up_exps.weight", o.n_ff, o.n_embd, 1.0f, nullptr);
      if (s.ok()) {
        s = sparse ? add_experts(b + "ffn_down_exps.weight", o.n_embd, o.n_ff, out_scale, down_rows)
                   : add_experts(b + "ffn_down_exps.weight", o.n_embd, o.n_ff, 1.0f, nullptr);
      }
      continue;
    }
    if (sparse) {
      const uint64_t layer_seed = LayerSeed(o, l);
      const std::vector<float> z = GateBiases(firing, layer_seed);
      const std::vector<float> basis = GateBasis(o.n_embd, layer_seed);
      if (s.ok()) {
        s = add(b + "ffn_gate.weight", o.n_ff, o.n_embd, std::sqrt(kGateNoise),
                [&](int64_t r, float* v) { MakeGateRow(basis, z[r], layer_seed, r, o.n_embd, v); });
      }
    } else if (s.ok()) {
      s = add_matrix(b + "ffn_gate.weight", o.n_ff, o.n_embd);
    }
    if (s.ok()) s = add_matrix(b + "ffn_up.weight", o.n_ff, o.n_embd);
    if (s.ok()) s = add_output(b + "ffn_down.weight", o.n_embd, o.n_ff);
  }
  if (s.ok()) s = add_ones("output_norm.weight");
  if (s.ok()) s = add_matrix("output.weight", o.n_vocab, o.n_embd);
  if (!s.ok()) return s;
  return w.Write(path);
}

}  // namespace thermocline

namespace thermocline {

absl::StatusOr<std::vector<SynthPredictor>> SynthPredictors(const SynthOptions& o) {
  if (o.n_expert > 0) {
    return absl::InvalidArgumentError(
        "synth: a mixture's experts are placed whole; --sidecar predictors are for a dense FFN");
  }
  if (o.sparsity <= 0) {
    return absl::InvalidArgumentError("synth: predictors exist only for a --sparsity model");
  }
  absl::StatusOr<std::vector<double>> firing = PowerLawFiring(o.n_ff, o.sparsity, o.hot_fraction);
  if (!firing.ok()) return firing.status();
  const int64_t n = o.n_embd, rank = 2 * kGateRank + 1;
  // The logit misses the full-rank part of the gate (variance kGateNoise / 2) and the weights'
  // quantization error: predict down to 2.5 deviations of that below zero (recall ~0.999);
  // CalibrateSynthThresholds then sets the threshold the target recall needs.
  const float noise = std::sqrt((kGateNoise + 0.01f) / 2.0f);
  std::vector<SynthPredictor> out(o.n_layer);
  for (int64_t l = 0; l < o.n_layer; ++l) {
    const uint64_t layer_seed = LayerSeed(o, l);
    const std::vector<float> z = GateBiases(*firing, layer_seed);
    const std::vector<float> basis = GateBasis(n, layer_seed);
    SynthPredictor& p = out[l];
    p.rank = rank;
    // hidden = [relu(B·xn), relu(-B·xn), relu(xn_0)]: B·xn in both signs, and xn_0 > 0.
    p.fc1.assign(rank * n, 0.0f);
    for (int k = 0; k < kGateRank; ++k) {
      for (int64_t j = 0; j < n; ++j) {
        p.fc1[k * n + j] = basis[k * n + j];
        p.fc1[(kGateRank + k) * n + j] = -basis[k * n + j];
      }
    }
    p.fc1[2 * kGateRank * n] = 1.0f;
    p.b1.assign(rank, 0.0f);
    // logit_i = a_i·(B·xn) + w0_i·xn_0: the gate's pre-activation without its noise part.
    p.fc2.assign(o.n_ff * rank, 0.0f);
    for (int64_t i = 0; i < o.n_ff; ++i) {
      float a[kGateRank];
      GateCoefficients(layer_seed, i, a);
      float* row = p.fc2.data() + i * rank;
      for (int k = 0; k < kGateRank; ++k) {
        row[k] = a[k];
        row[kGateRank + k] = -a[k];
      }
      row[2 * kGateRank] = BiasWeight(z[i], n);
    }
    p.b2.assign(o.n_ff, 0.0f);
    p.threshold = -2.5f * noise;
    p.firing.resize(z.size());
    for (size_t r = 0; r < z.size(); ++r) p.firing[r] = 0.5 * std::erfc(-z[r] / std::sqrt(2.0));
  }
  return out;
}

namespace {

// Collects, per layer, the implied predictors' logits of the neurons that fire: the FFN input
// x normed as the session norms it (RmsNorm), then fc2·relu(fc1·xn + b1) + b2.
class FiredLogits : public FfnObserver {
 public:
  FiredLogits(const LlamaModel& model, const std::vector<SynthPredictor>& predictors)
      : model_(model), predictors_(predictors), logits_(predictors.size()) {}

  void OnFfn(int layer, const float* x, int64_t n_embd, const float* act, int64_t n_ff,
             int64_t n_tokens) override {
    const SynthPredictor& p = predictors_[layer];
    std::vector<float> xn(n_embd);
    std::vector<double> hidden(p.rank);
    for (int64_t t = 0; t < n_tokens; ++t) {
      RmsNorm(x + t * n_embd, model_.layers()[layer].ffn_norm.data(), n_embd,
              model_.hparams().rms_eps, xn.data());
      for (int64_t k = 0; k < p.rank; ++k) {
        double h = p.b1[k];
        for (int64_t j = 0; j < n_embd; ++j) h += double{p.fc1[k * n_embd + j]} * xn[j];
        hidden[k] = std::max(0.0, h);
      }
      for (int64_t i = 0; i < n_ff; ++i) {
        if (act[t * n_ff + i] == 0.0f) continue;
        double logit = p.b2[i];
        for (int64_t k = 0; k < p.rank; ++k) logit += double{p.fc2[i * p.rank + k]} * hidden[k];
        logits_[layer].push_back(logit);
      }
    }
  }

  std::vector<double>& logits(size_t layer) { return logits_[layer]; }

 private:
  const LlamaModel& model_;
  const std::vector<SynthPredictor>& predictors_;
  std::vector<std::vector<double>> logits_;
};

}  // namespace

absl::Status CalibrateSynthThresholds(const LlamaModel& model, ThreadPool& pool, double recall,
                                      int64_t n_tokens, std::vector<SynthPredictor>& predictors) {
  const LlamaHparams& h = model.hparams();
  if (predictors.size() != static_cast<size_t>(h.n_layer)) {
    return absl::InvalidArgumentError(
        absl::StrCat("synth: ", predictors.size(), " predictors for ", h.n_layer, " layers"));
  }
  if (!(recall > 0 && recall < 1) || n_tokens <= 0) {
    return absl::InvalidArgumentError("synth: the recall must be in (0, 1), the tokens > 0");
  }
  EngineOptions options;
  options.n_ctx = n_tokens;
  auto engine = Engine::Create(model, std::nullopt, options, pool);
  if (!engine.ok()) return engine.status();
  auto session = (*engine)->NewSession(&pool);
  if (!session.ok()) return session.status();
  FiredLogits fired(model, predictors);
  (*session)->set_ffn_observer(&fired);
  // Token ids spread over the vocabulary (a random model has no text to prefer).
  std::vector<int32_t> tokens(n_tokens);
  for (int64_t i = 0; i < n_tokens; ++i) {
    tokens[i] = static_cast<int32_t>((i * 7919 + 3) % h.n_vocab);
  }
  if (absl::Status s = (*session)->session().Eval(tokens); !s.ok()) return s;
  for (size_t l = 0; l < predictors.size(); ++l) {
    std::vector<double>& v = fired.logits(l);
    if (v.empty()) continue;  // nothing fired: keep the construction's threshold
    // The largest threshold that keeps `recall` of the fired logits above it.
    const size_t missed = static_cast<size_t>(std::floor((1.0 - recall) * v.size()));
    std::nth_element(v.begin(), v.begin() + missed, v.end());
    const float at = static_cast<float>(v[missed]);
    predictors[l].threshold = std::nextafter(at, -std::numeric_limits<float>::infinity());
  }
  return absl::OkStatus();
}

}  // namespace thermocline
