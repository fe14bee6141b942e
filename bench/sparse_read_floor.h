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

  // An input-sparse layer's token: the inputs whose rows of its q/k/v, gate and up layouts were
  // read, and the neurons whose rows of down's were.
  struct ColumnLayer {
    int layer = 0;
    std::vector<int32_t> qkv, gate_up, down;
  };

  void OnLayer(int layer) override;
  void OnChunk(int layer, absl::Span<const int32_t> predicted, absl::Span<const int32_t> up,
               absl::Span<const int32_t> fired) override;
  void OnColumns(int layer, ColumnReads which, absl::Span<const int32_t> kept) override;

  // Read once recording is over (the session no longer runs).
  const std::vector<Layer>& layers() const { return layers_; }
  const std::vector<ColumnLayer>& column_layers() const { return column_layers_; }
  // Tokens recorded: the layer groups of layer 0.
  int64_t tokens() const;
  // The lowest input-sparse layer recorded (its groups start a token); -1 when none.
  int first_column_layer() const;
  // Tokens recorded by input-sparse layers: the groups of first_column_layer().
  int64_t column_tokens() const;

 private:
  std::mutex mu_;  // OnChunk comes from the pool's threads concurrently
  std::vector<Layer> layers_;
  std::vector<ColumnLayer> column_layers_;
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

// The same for input-sparse layers: per layer and token, the kept inputs' rows of the q/k/v
// layouts (stacked or three), of gate's and of up's, and the fired neurons' rows of down's, each
// list shared out over the threads as the kernels share it (ColumnSplit), read in the kernels'
// order (per block of 32 inputs: the block's scales and mins, then a line of every kept row per
// step, kAheadSteps steps prefetched ahead), one word per cache line; the float form's rows as
// TouchRows reads rows. Between tokens flush_bytes are streamed as above.
double ReplayColumnReads(const SparseWeights& weights, ThreadPool& pool,
                         const ActiveSetRecorder& recorder, int repetitions, size_t flush_bytes);

}  // namespace thermocline
