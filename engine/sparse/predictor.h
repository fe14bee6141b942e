// The activation predictor as the engine runs it, the one form every sparse path uses:
//   active(slot) = fc2ᵀ[:, slot] · relu(fc1 · xn + b1) + b2[slot] > threshold,
// with fc2 stored transposed, (rank, n_ff) in slot order (SparseWeights), so that fc2 becomes an
// axpy over the rows of the hidden units that relu left nonzero, and any slice of slots can be
// predicted alone: the fused path predicts each chunk it claims. The device part reads the same
// plan (fc1, b1, fc2 in slot order, b2, threshold) into its executor.
#pragma once

#include <cstdint>

#include "engine/ops/kernels.h"
#include "engine/ops/matmul.h"
#include "engine/util/thread_pool.h"

namespace thermocline {

// One layer's predictor; views and arrays owned by the plan and the sparse weights.
struct PredictorView {
  int64_t rank = 0;                   // 0: no predictor (every slot a candidate)
  const WeightView* fc1 = nullptr;    // (rank, n_embd)
  const float* b1 = nullptr;          // (rank)
  const WeightView* fc2_t = nullptr;  // (rank, n_ff) slot order
  const float* b2 = nullptr;          // (n_ff) slot order
  float threshold = 0;
};

// The hidden layer's nonzero units: relu(fc1 · xn + b1) > 0 as (index, value) pairs.
struct PredictorHidden {
  int32_t* idx = nullptr;  // (rank)
  float* value = nullptr;  // (rank)
  int64_t n = 0;
};

// Step 1, once per token and layer: fc1 over the pool, then relu; fills hidden (its arrays sized
// rank). scratch: for a (1, rank) product.
void PredictHidden(ThreadPool& pool, const PredictorView& p, const float* xn, float* fc1_out,
                   PredictorHidden* hidden, MatMulScratch& scratch);

// Step 2 for the slots [begin, end), on the calling thread: writes the predicted-active ones, in
// ascending order, to active (room for end - begin: the entries past the count returned are
// scratch) and returns how many. logits: (n_ff) scratch indexed by slot; the
// call writes [begin, end) and, when begin is not on a block of fc2_t's type, the slots from the
// block's start (which the caller's other slices must not be using: the device part's slots).
int64_t PredictSlots(Isa isa, const PredictorView& p, const PredictorHidden& hidden, int64_t begin,
                     int64_t end, float* logits, int32_t* active);

}  // namespace thermocline
