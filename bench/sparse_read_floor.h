// The read floor of sparse decode: the rows a sparse decode read (recorded through SparseFfn's
// ActiveSetObserver), read again with nothing computed. What merely fetching a sparse token's
// FFN bytes costs on this machine, measured, where the ideal ratio of `bench` assumes every
// byte arrives at the streaming rate.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
#include <vector>

#include "absl/types/span.h"
#include "engine/sparse/sparse_ffn.h"
#include "engine/util/thread_pool.h"

namespace thermocline {

// Records the slots of every chunk, grouped per layer and token, in the order they ran.
class ActiveSetRecorder : public ActiveSetObserver {
 public:
  struct Chunk {
    std::vector<int32_t> predicted, up, fired;
  };
  struct Layer {
    int layer = 0;
    std::vector<Chunk> chunks;
  };

  void OnLayer(int layer) override;
  void OnChunk(int layer, absl::Span<const int32_t> predicted, absl::Span<const int32_t> up,
               absl::Span<const int32_t> fired) override;

  // Read once recording is over (the session no longer runs).
  const std::vector<Layer>& layers() const { return layers_; }
  // Tokens recorded: the layer groups of layer 0.
  int64_t tokens() const;

 private:
  std::mutex mu_;  // OnChunk comes from the pool's threads concurrently
  std::vector<Layer> layers_;
};

// Median seconds per token, over `repetitions` replays of what `recorder` saw, of reading on
// `pool` per layer the predictor's fc1 and fc2ᵀ whole and the gate, up and down_t rows of each
// chunk's predicted, up and fired slots, one word per cache line, the chunks shared out over
// the threads and each thread's next rows prefetched as the operators do (PrefetchRow in
// sparse_ops.h). Before each token flush_bytes (at least 1 MiB) are streamed, untimed, standing
// for the rest of a token's reads (attention, output head), so that the FFN rows are not found
// in cache. 0 when nothing was recorded.
double ReplaySparseReads(const SparseWeights& weights, ThreadPool& pool,
                         const ActiveSetRecorder& recorder, int repetitions, size_t flush_bytes);

}  // namespace thermocline
