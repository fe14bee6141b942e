// Predictor evaluation and the dense products training uses (the engine's F32 MatMul, which
// dispatches to the best ISA).
#include "offline/predictor/predictor.h"

#include <algorithm>

#include "engine/ops/kernels.h"
#include "engine/ops/matmul.h"

namespace thermocline::offline {

void GemmNT(ThreadPool& pool, const float* a, int64_t m, const float* b, int64_t n, int64_t k,
            float* c) {
  WeightView w;
  w.type = GgmlType::kF32;
  w.rows = n;
  w.cols = k;
  w.data = reinterpret_cast<const uint8_t*>(b);
  w.row_bytes = static_cast<size_t>(k) * sizeof(float);
  MatMulScratch unused;  // F32 activations are read in place: no conversion buffer
  MatMul(pool, w, a, m, c, unused);
}

void Transpose(const float* src, int64_t rows, int64_t cols, float* dst) {
  constexpr int64_t kTile = 32;
  for (int64_t r0 = 0; r0 < rows; r0 += kTile) {
    const int64_t r1 = std::min(rows, r0 + kTile);
    for (int64_t c0 = 0; c0 < cols; c0 += kTile) {
      const int64_t c1 = std::min(cols, c0 + kTile);
      for (int64_t r = r0; r < r1; ++r) {
        for (int64_t c = c0; c < c1; ++c) dst[c * rows + r] = src[r * cols + c];
      }
    }
  }
}

void Predictor::RoundToF16() {
  for (float& v : fc1) v = HalfToFloat(FloatToHalf(v));
  for (float& v : fc2) v = HalfToFloat(FloatToHalf(v));
}

void Predictor::Logits(ThreadPool& pool, const float* xb, int64_t n, float* hidden,
                       float* logits) const {
  GemmNT(pool, xb, n, fc1.data(), rank, n_embd, hidden);
  for (int64_t t = 0; t < n; ++t) {
    float* h = hidden + t * rank;
    for (int64_t j = 0; j < rank; ++j) h[j] = std::max(0.0f, h[j] + b1[j]);
  }
  GemmNT(pool, hidden, n, fc2.data(), n_ff, rank, logits);
  for (int64_t t = 0; t < n; ++t) {
    float* z = logits + t * n_ff;
    for (int64_t i = 0; i < n_ff; ++i) z[i] += b2[i];
  }
}

}  // namespace thermocline::offline
