// An activation predictor of one layer: logits = fc2 · relu(fc1 · xb + b1) + b2, where
// xb = ffn_norm(x) is the FFN's own normalized input (x taken before ffn_norm, as the profiler
// samples it). Neuron i is predicted active iff logits[i] > threshold. Stored in the sidecar
// with fc1/fc2 as F16 and biases as F32; in memory everything is float.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/util/thread_pool.h"

namespace thermocline::offline {

struct Predictor {
  int64_t n_embd = 0;
  int64_t n_ff = 0;
  int64_t rank = 0;
  std::vector<float> fc1;  // (rank, n_embd)
  std::vector<float> b1;   // (rank)
  std::vector<float> fc2;  // (n_ff, rank)
  std::vector<float> b2;   // (n_ff)
  float threshold = 0.0f;

  // Bytes in the sidecar (and in memory at inference): F16 matrices, F32 biases.
  uint64_t StorageBytes() const { return StorageBytesFor(n_embd, n_ff, rank); }
  static uint64_t StorageBytesFor(int64_t n_embd, int64_t n_ff, int64_t rank) {
    return static_cast<uint64_t>(rank * (n_embd + n_ff)) * 2 + 4 * (rank + n_ff);
  }
  // Rounds fc1 and fc2 through F16 so that evaluation sees what the sidecar will hold.
  void RoundToF16();
  // logits: (n, n_ff) for xb: (n, n_embd). hidden: scratch of at least n * rank floats.
  void Logits(ThreadPool& pool, const float* xb, int64_t n, float* hidden, float* logits) const;
};

// c: (m, n) = a: (m, k) · bᵀ, with b: (n, k). Row-major, contiguous; parallel over rows of b.
void GemmNT(ThreadPool& pool, const float* a, int64_t m, const float* b, int64_t n, int64_t k,
            float* c);
// dst: (cols, rows) = srcᵀ, src: (rows, cols).
void Transpose(const float* src, int64_t rows, int64_t cols, float* dst);

}  // namespace thermocline::offline
