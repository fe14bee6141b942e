#include "engine/sparse/predictor.h"

#include <algorithm>
#include <vector>

#include "engine/sparse/sparse_ops.h"

namespace thermocline {
namespace {

// Slices of PredictAll start on multiples of this (a whole number of any type's blocks).
constexpr int64_t kSliceAlign = 256;

}  // namespace

void PredictHidden(ThreadPool& pool, const PredictorView& p, const float* xn, float* fc1_out,
                   PredictorHidden* hidden, MatMulScratch& scratch) {
  hidden->n = 0;
  if (p.rank == 0) return;
  MatMul(pool, *p.fc1, xn, 1, fc1_out, scratch);
  for (int64_t j = 0; j < p.rank; ++j) {
    const float v = fc1_out[j] + p.b1[j];
    if (v > 0.0f) {
      hidden->idx[hidden->n] = static_cast<int32_t>(j);
      hidden->value[hidden->n++] = v;
    }
  }
}

int64_t PredictSlots(Isa isa, const PredictorView& p, const PredictorHidden& hidden,
                     int64_t begin, int64_t end, float* logits, int32_t* active) {
  int64_t n = 0;
  if (p.rank == 0) {
    for (int64_t s = begin; s < end; ++s) active[n++] = static_cast<int32_t>(s);
    return n;
  }
  std::fill(logits, logits + (end - begin), 0.0f);
  SparseAxpyRows(isa, *p.fc2_t, begin, end - begin, hidden.idx, hidden.value, hidden.n, logits);
  const float thr = p.threshold;
  const float* b2 = p.b2;
  for (int64_t s = begin; s < end; ++s) {
    if (logits[s - begin] + b2[s] > thr) active[n++] = static_cast<int32_t>(s);
  }
  return n;
}

int64_t PredictAll(ThreadPool& pool, Isa isa, const PredictorView& p,
                   const PredictorHidden& hidden, int64_t n_ff, float* logits, int32_t* active) {
  const int parts = pool.size();
  const int64_t per = (n_ff / parts + kSliceAlign - 1) / kSliceAlign * kSliceAlign;
  constexpr int kMaxParts = 64;
  int64_t count[kMaxParts] = {};
  if (parts > kMaxParts || per == 0 || p.rank == 0) {
    return PredictSlots(isa, p, hidden, 0, n_ff, logits, active);
  }
  // Each part writes its slots at its slice's own offset; the lists are packed after.
  pool.Run([&](int part) {
    const int64_t begin = std::min(n_ff, part * per);
    const int64_t end = part + 1 == parts ? n_ff : std::min(n_ff, begin + per);
    if (begin < end) {
      count[part] = PredictSlots(isa, p, hidden, begin, end, logits + begin, active + begin);
    }
  });
  int64_t n = count[0];
  for (int part = 1; part < parts; ++part) {
    const int64_t begin = std::min(n_ff, part * per);
    std::copy_n(active + begin, count[part], active + n);
    n += count[part];
  }
  return n;
}

}  // namespace thermocline
