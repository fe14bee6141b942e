#include "engine/sparse/predictor.h"

#include <algorithm>
#include <vector>

#include "engine/sparse/sparse_ops.h"

namespace thermocline {
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

int64_t PredictSlots(Isa isa, const PredictorView& p, const PredictorHidden& hidden, int64_t begin,
                     int64_t end, float* logits, int32_t* active) {
  int64_t n = 0;
  if (p.rank == 0) {
    for (int64_t s = begin; s < end; ++s) active[n++] = static_cast<int32_t>(s);
    return n;
  }
  // fc2ᵀ's rows are read in whole blocks of its type.
  const int64_t block = TypeInfo(p.fc2_t->type).block_size;
  const int64_t from = begin / block * block;
  std::fill(logits + from, logits + end, 0.0f);
  SparseAxpyRows(isa, *p.fc2_t, from, end - from, hidden.idx, hidden.value, hidden.n,
                 logits + from);
  const float thr = p.threshold;
  const float* b2 = p.b2;
  // Without a branch: which slots pass is data, a branch on it mispredicts at every few slots.
  for (int64_t s = begin; s < end; ++s) {
    active[n] = static_cast<int32_t>(s);
    n += logits[s] + b2[s] > thr ? 1 : 0;
  }
  return n;
}

}  // namespace thermocline
