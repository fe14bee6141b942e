// The dense CPU path's weight matrices re-laid once at load for faster kernels (Q4_0 and Q2_K to
// Q6_K in interleaved row groups, weight_layout.h's PackQ4_0Groups etc.) or, for the other
// types, copied as they are onto huge pages where a matrix fills one at least (CopyWeight: faster
// to stream than the file's mapping), shared read-only by every session of an engine. Each copy
// replaces the model file's pages of its matrix (released with GgufFile::ReleasePages as it is
// made); the model's own views are left as they were, so every other reader of them (the sparse
// FFN's copies, the device uploads, MoE experts) still sees the rows GGUF stores, faulting the
// file's pages in again if it reads a released one.
#pragma once

#include <cstdint>
#include <memory>
#include <unordered_map>
#include <vector>

#include "engine/model/llama_model.h"
#include "engine/ops/matmul.h"
#include "engine/ops/weight_layout.h"
#include "engine/util/thread_pool.h"

namespace thermocline {

// Which of a model's matrices only the dense CPU path reads, and so may be re-laid: per layer
// its attention (wq, wk, wv, wo) and its FFN (gate, up, down; never a mixture of experts'), and
// the output head (never when tied to the token embedding, whose rows Embed reads).
struct PackScope {
  std::vector<uint8_t> attention;  // (n_layer): 1 where the layer's attention runs on the CPU
  std::vector<uint8_t> ffn;        // (n_layer): 1 where the dense FFN runs on the CPU
  bool output = false;
};

class PackedWeights {
 public:
  // Re-lays the Q4_0 and K-quant (Q2_K to Q6_K) matrices of `scope` and copies the others of at
  // least a huge page (2 MB), parallel over the pool.
  static std::shared_ptr<const PackedWeights> Build(const LlamaModel& model, const PackScope& scope,
                                                    ThreadPool& pool);

  // The view the dense path reads for the model's view w: its re-laid copy, or w itself.
  const WeightView& Resolve(const WeightView& w) const;
  int64_t matrices() const { return static_cast<int64_t>(copies_.size()); }
  // RAM of the copies, and of the model's mapped file the pages they replaced.
  uint64_t bytes() const { return bytes_; }
  uint64_t released_file_bytes() const { return released_file_bytes_; }

 private:
  std::unordered_map<const uint8_t*, OwnedWeight> copies_;  // by the model view's data
  uint64_t bytes_ = 0;
  uint64_t released_file_bytes_ = 0;
};

}  // namespace thermocline
