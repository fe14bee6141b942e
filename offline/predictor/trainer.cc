// Mini-batch Adam for fc2(relu(fc1 x + b1)) + b2 with loss
//   sum_i  w+ · y_i · softplus(-z_i) + (1 - y_i) · softplus(z_i)    (mean over the batch),
// products through GemmNT (the engine's F32 MatMul).
#include "offline/predictor/trainer.h"

#include <algorithm>
#include <array>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>

#include "engine/model/cpu_ops.h"

namespace thermocline::offline {
namespace {

constexpr int64_t kEvalChunk = 256;

struct Adam {
  explicit Adam(size_t n) : m(n, 0.0f), v(n, 0.0f) {}
  void Step(float* __restrict w, const float* __restrict g, size_t n, float lr, int64_t t) {
    constexpr float b1 = 0.9f, b2 = 0.999f, eps = 1e-8f;
    const float c1 = lr / (1.0f - std::pow(b1, static_cast<float>(t)));
    const float c2 = 1.0f / (1.0f - std::pow(b2, static_cast<float>(t)));
    float* __restrict mm = m.data();
    float* __restrict vv = v.data();
    for (size_t i = 0; i < n; ++i) {
      mm[i] = b1 * mm[i] + (1 - b1) * g[i];
      vv[i] = b2 * vv[i] + (1 - b2) * g[i] * g[i];
      w[i] -= c1 * mm[i] / (std::sqrt(vv[i] * c2) + eps);
    }
  }
  std::vector<float> m, v;
};

// 1 / (1 + e^-z) with e^x as 2^(x log2 e): integer part into the exponent bits, fractional part
// by a degree-5 polynomial (relative error below 1e-4, in the far tails). Branch-free arithmetic
// (even the clamp), so loops over it vectorize on baseline x86-64; the loss gradient needs no more
// accuracy.
inline float FastSigmoid(float z) {
  float x = -z * 1.44269504f;
  x = 0.5f * (std::fabs(x + 120.0f) - std::fabs(x - 120.0f));  // clamp to [-120, 120]
  const int32_t i = static_cast<int32_t>(x + 128.0f) - 128;    // floor for x > -128
  const float f = x - static_cast<float>(i);
  const float p =
      1.0f +
      f * (0.693147182f +
           f * (0.240226507f + f * (0.0555041087f + f * (0.00961812911f + f * 0.00133335581f))));
  const int32_t bits = (i + 127) << 23;
  return 1.0f / (1.0f + p * std::bit_cast<float>(bits));
}

// out[i] = bit i of mask (0 or 1), a byte at a time through a table of 8 floats per byte.
void MaskToFloats(const uint64_t* mask, int64_t n, float* out) {
  static const auto kTable = [] {
    std::array<std::array<float, 8>, 256> t{};
    for (int b = 0; b < 256; ++b) {
      for (int j = 0; j < 8; ++j) t[b][j] = static_cast<float>((b >> j) & 1);
    }
    return t;
  }();
  const auto* bytes = reinterpret_cast<const uint8_t*>(mask);  // little-endian: bit i in byte i/8
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) std::memcpy(out + i, kTable[bytes[i >> 3]].data(), 8 * sizeof(float));
  for (; i < n; ++i) out[i] = static_cast<float>((mask[i >> 6] >> (i & 63)) & 1);
}

// Logits of a whole split, chunk by chunk; fn(row, logits_of_row).
template <class Fn>
void ForEachLogitRow(ThreadPool& pool, const Predictor& p, const LayerDataset& data,
                     LayerDataset::Split split, Fn&& fn) {
  std::vector<float> hidden(kEvalChunk * p.rank), z(kEvalChunk * p.n_ff);
  for (int64_t s0 = 0; s0 < data.n[split]; s0 += kEvalChunk) {
    const int64_t n = std::min(kEvalChunk, data.n[split] - s0);
    p.Logits(pool, data.x[split].data() + s0 * p.n_embd, n, hidden.data(), z.data());
    for (int64_t t = 0; t < n; ++t) fn(s0 + t, z.data() + t * p.n_ff);
  }
}

// The threshold at which a fraction `recall` of the split's firings is predicted, and (with
// contributions) a fraction `contribution` of what they add to the output: the lower of the two.
float ChooseThreshold(ThreadPool& pool, const Predictor& p, const LayerDataset& data,
                      LayerDataset::Split split, double recall, double contribution) {
  struct Positive {
    float z, weight;
  };
  std::vector<Positive> positives;
  const std::vector<float>& weights = data.contribution[split];
  float max_logit = -INFINITY;
  double total = 0;
  ForEachLogitRow(pool, p, data, split, [&](int64_t row, const float* z) {
    for (int64_t i = 0; i < p.n_ff; ++i) {
      max_logit = std::max(max_logit, z[i]);
      if (data.fired(split, row, i)) {
        const float w = weights.empty() ? 1.0f : weights[row * p.n_ff + i];
        positives.push_back({z[i], w});
        total += w;
      }
    }
  });
  if (positives.empty()) return std::isfinite(max_logit) ? max_logit + 1.0f : 0.0f;
  std::sort(positives.begin(), positives.end(),
            [](const Positive& a, const Positive& b) { return a.z < b.z; });
  // The lowest logits may be missed while both shares stay kept.
  size_t missable =
      static_cast<size_t>(std::floor(static_cast<double>(positives.size()) * (1.0 - recall)));
  if (!weights.empty() && contribution < 1) {
    const double allowed = total * (1.0 - contribution);
    double missed = 0;
    size_t k = 0;
    while (k < missable && missed + positives[k].weight <= allowed) missed += positives[k++].weight;
    missable = k;
  }
  if (missable == 0) return std::nextafter(positives[0].z, -INFINITY) - 1e-3f;
  const float lo = positives[missable - 1].z, hi = positives[missable].z;
  return lo < hi ? 0.5f * (lo + hi) : std::nextafter(hi, -INFINITY);
}

}  // namespace

void ComputeContributions(ThreadPool& pool, const LlamaModel& model, int layer,
                          LayerDataset& data) {
  const LlamaHparams& h = model.hparams();
  const LayerWeights& L = model.layers()[layer];
  const int64_t d = data.n_embd, f = data.n_ff;
  // ‖down column i‖ over the rows of down: (n_embd, n_ff).
  std::vector<double> norm2(f, 0.0);
  std::vector<float> row(f);
  const TypeKernels* k = KernelsFor(L.ffn_down.type);
  for (int64_t r = 0; r < L.ffn_down.rows; ++r) {
    k->to_float(L.ffn_down.row(r), row.data(), f);
    for (int64_t i = 0; i < f; ++i) norm2[i] += double{row[i]} * row[i];
  }
  constexpr int64_t kChunk = 64;
  MatMulScratch scratch;
  scratch.Reserve(kChunk, d);
  std::vector<float> gate(kChunk * f), up(kChunk * f);
  for (LayerDataset::Split s : {LayerDataset::kCalib, LayerDataset::kTest}) {
    std::vector<float>& out = data.contribution[s];
    out.assign(static_cast<size_t>(data.n[s] * f), 0.0f);
    for (int64_t t0 = 0; t0 < data.n[s]; t0 += kChunk) {
      const int64_t n = std::min(kChunk, data.n[s] - t0);
      const float* x = data.x[s].data() + t0 * d;
      MatMul(pool, L.ffn_gate, x, n, gate.data(), scratch);
      MatMul(pool, L.ffn_up, x, n, up.data(), scratch);
      GatedActivation(h.activation, gate.data(), up.data(), n * f);
      for (int64_t t = 0; t < n; ++t) {
        for (int64_t i = 0; i < f; ++i) {
          if (data.fired(s, t0 + t, i)) {
            out[(t0 + t) * f + i] =
                static_cast<float>(std::fabs(gate[t * f + i]) * std::sqrt(norm2[i]));
          }
        }
      }
    }
  }
}

double LayerDataset::ActiveFraction(Split s) const {
  if (n[s] == 0) return 0;
  uint64_t ones = 0;
  for (uint64_t w : mask[s]) ones += static_cast<uint64_t>(__builtin_popcountll(w));
  return static_cast<double>(ones) / (static_cast<double>(n[s]) * n_ff);
}

LayerDataset BuildLayerDataset(const ActivationProfiler& profiler, int layer, const float* ffn_norm,
                               float rms_eps) {
  LayerDataset d;
  d.n_embd = profiler.n_embd();
  d.n_ff = profiler.n_ff();
  d.mask_words = profiler.mask_words();
  std::vector<float> x(d.n_embd);
  int64_t heldout_seen = 0;
  for (int64_t s = 0; s < profiler.num_samples(); ++s) {
    LayerDataset::Split split = LayerDataset::kTrain;
    if (profiler.heldout(s)) {
      split = (heldout_seen++ % 2 == 0) ? LayerDataset::kCalib : LayerDataset::kTest;
    }
    profiler.SampleX(layer, s, x.data());
    const size_t off = d.x[split].size();
    d.x[split].resize(off + d.n_embd);
    RmsNorm(x.data(), ffn_norm, d.n_embd, rms_eps, d.x[split].data() + off);
    const uint64_t* m = profiler.SampleMask(layer, s);
    d.mask[split].insert(d.mask[split].end(), m, m + d.mask_words);
    d.n[split]++;
  }
  return d;
}

PredictorEval EvaluatePredictor(ThreadPool& pool, const Predictor& p, const LayerDataset& data,
                                LayerDataset::Split split, float threshold) {
  uint64_t tp = 0, fp = 0, fn = 0;
  double kept = 0, total = 0;
  const std::vector<float>& weights = data.contribution[split];
  ForEachLogitRow(pool, p, data, split, [&](int64_t row, const float* z) {
    for (int64_t i = 0; i < p.n_ff; ++i) {
      const bool predicted = z[i] > threshold;
      const bool fired = data.fired(split, row, i);
      tp += predicted && fired;
      fp += predicted && !fired;
      fn += !predicted && fired;
      if (fired && !weights.empty()) {
        total += weights[row * p.n_ff + i];
        kept += predicted ? weights[row * p.n_ff + i] : 0.0f;
      }
    }
  });
  PredictorEval e;
  e.contribution = total > 0 ? kept / total : 1.0;
  e.recall = tp + fn > 0 ? static_cast<double>(tp) / (tp + fn) : 1.0;
  e.precision = tp + fp > 0 ? static_cast<double>(tp) / (tp + fp) : 1.0;
  const double cells = static_cast<double>(std::max<int64_t>(1, data.n[split])) * p.n_ff;
  e.predicted_active = static_cast<double>(tp + fp) / cells;
  e.true_active = static_cast<double>(tp + fn) / cells;
  return e;
}

TrainedPredictor TrainPredictor(ThreadPool& pool, const LayerDataset& data, int64_t rank,
                                const TrainOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  const int64_t d = data.n_embd, f = data.n_ff, r = rank;
  const int64_t n_train = data.n[LayerDataset::kTrain];
  const int64_t B = std::max<int64_t>(1, std::min(options.batch, n_train));
  std::mt19937_64 rng(options.seed * 0x9e3779b97f4a7c15ull + static_cast<uint64_t>(rank));

  Predictor p;
  p.n_embd = d;
  p.n_ff = f;
  p.rank = r;
  p.fc1.resize(r * d);
  p.b1.assign(r, 0.0f);
  p.fc2.resize(f * r);
  p.b2.resize(f);
  std::normal_distribution<float> n1(0.0f, std::sqrt(2.0f / d)), n2(0.0f, std::sqrt(1.0f / r));
  for (float& w : p.fc1) w = n1(rng);
  for (float& w : p.fc2) w = n2(rng);
  // Output biases start at each neuron's log-odds of firing in the training data.
  std::vector<double> freq(f, 0.0);
  for (int64_t s = 0; s < n_train; ++s) {
    for (int64_t i = 0; i < f; ++i) freq[i] += data.fired(LayerDataset::kTrain, s, i);
  }
  for (int64_t i = 0; i < f; ++i) {
    const double q = std::clamp((freq[i] + 0.5) / (n_train + 1.0), 1e-4, 1.0 - 1e-4);
    p.b2[i] = static_cast<float>(std::log(q / (1 - q)));
  }
  const double active = std::max(1e-6, data.ActiveFraction(LayerDataset::kTrain));
  const float pos_weight =
      std::clamp(static_cast<float>((1 - active) / active), 1.0f, options.max_pos_weight);

  std::vector<float> xb(B * d), xbT(d * B), y(B * f), h(B * r), hT(r * B), z(B * f), dzT(f * B);
  std::vector<float> w2T(r * f), dh(B * r), dhT(r * B), g1(r * d), gb1(r), g2(f * r), gb2(f);
  Adam a1(p.fc1.size()), ab1(r), a2(p.fc2.size()), ab2(f);
  std::vector<int64_t> order(n_train);
  std::iota(order.begin(), order.end(), 0);
  const int64_t steps_per_epoch = (n_train + B - 1) / B;
  const int64_t total_steps = std::max<int64_t>(1, steps_per_epoch * options.epochs);
  int64_t step = 0;
  for (int epoch = 0; epoch < options.epochs && n_train > 0; ++epoch) {
    std::shuffle(order.begin(), order.end(), rng);
    for (int64_t b0 = 0; b0 < n_train; b0 += B) {
      const int64_t nb = std::min(B, n_train - b0);
      for (int64_t t = 0; t < nb; ++t) {
        const int64_t s = order[b0 + t];
        std::copy_n(data.x[LayerDataset::kTrain].data() + s * d, d, xb.data() + t * d);
        const uint64_t* m = data.mask[LayerDataset::kTrain].data() + s * data.mask_words;
        MaskToFloats(m, f, y.data() + t * f);
      }
      // Forward.
      GemmNT(pool, xb.data(), nb, p.fc1.data(), r, d, h.data());
      for (int64_t t = 0; t < nb; ++t) {
        for (int64_t j = 0; j < r; ++j) h[t * r + j] = std::max(0.0f, h[t * r + j] + p.b1[j]);
      }
      GemmNT(pool, h.data(), nb, p.fc2.data(), f, r, z.data());
      // dL/dz = w+ (sigmoid(z) - 1) for positives, sigmoid(z) for negatives; mean over batch.
      const float inv_nb = 1.0f / nb;
      const float wp = pos_weight * inv_nb;
      std::fill(gb2.begin(), gb2.end(), 0.0f);
      for (int64_t t = 0; t < nb; ++t) {
        float* __restrict zt = z.data() + t * f;  // becomes dL/dz
        const float* __restrict yt = y.data() + t * f;
        const float* __restrict b2 = p.b2.data();
        for (int64_t i = 0; i < f; ++i) {
          const float sig = FastSigmoid(zt[i] + b2[i]);
          zt[i] = (sig - yt[i]) * (inv_nb + (wp - inv_nb) * yt[i]);  // y is 0 or 1
        }
        float* __restrict g = gb2.data();
        for (int64_t i = 0; i < f; ++i) g[i] += zt[i];
      }
      // Backward: g2 = dzᵀ h, dh = dz fc2 (masked by relu), g1 = dhᵀ xb.
      Transpose(z.data(), nb, f, dzT.data());
      Transpose(h.data(), nb, r, hT.data());
      GemmNT(pool, dzT.data(), f, hT.data(), r, nb, g2.data());
      Transpose(p.fc2.data(), f, r, w2T.data());
      GemmNT(pool, z.data(), nb, w2T.data(), r, f, dh.data());
      std::fill(gb1.begin(), gb1.end(), 0.0f);
      for (int64_t t = 0; t < nb; ++t) {
        for (int64_t j = 0; j < r; ++j) {
          dh[t * r + j] = h[t * r + j] > 0.0f ? dh[t * r + j] : 0.0f;
          gb1[j] += dh[t * r + j];
        }
      }
      Transpose(dh.data(), nb, r, dhT.data());
      Transpose(xb.data(), nb, d, xbT.data());
      GemmNT(pool, dhT.data(), r, xbT.data(), d, nb, g1.data());
      // Cosine decay to 5% of the initial rate.
      ++step;
      const double progress = static_cast<double>(step) / total_steps;
      const float lr = options.learning_rate *
                       static_cast<float>(0.05 + 0.95 * 0.5 * (1 + std::cos(M_PI * progress)));
      a1.Step(p.fc1.data(), g1.data(), g1.size(), lr, step);
      ab1.Step(p.b1.data(), gb1.data(), gb1.size(), lr, step);
      a2.Step(p.fc2.data(), g2.data(), g2.size(), lr, step);
      ab2.Step(p.b2.data(), gb2.data(), gb2.size(), lr, step);
    }
  }

  p.RoundToF16();
  TrainedPredictor out;
  const double aim = 1.0 - (1.0 - options.target_recall) * (1.0 - options.recall_margin);
  const double aim_contribution =
      1.0 - (1.0 - options.target_contribution) * (1.0 - options.recall_margin);
  p.threshold = ChooseThreshold(pool, p, data, LayerDataset::kCalib, aim, aim_contribution);
  out.calib = EvaluatePredictor(pool, p, data, LayerDataset::kCalib, p.threshold);
  out.test = EvaluatePredictor(pool, p, data, LayerDataset::kTest, p.threshold);
  out.test_recall_at_zero = EvaluatePredictor(pool, p, data, LayerDataset::kTest, 0.0f).recall;
  out.predictor = std::move(p);
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return out;
}

}  // namespace thermocline::offline
