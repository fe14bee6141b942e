// Recording a sparse decode's active sets (a mutex-guarded list per layer and token) and
// replaying only their reads, per layer over the pool, between untimed streams of a flush buffer.
#include "bench/sparse_read_floor.h"

#include <algorithm>
#include <chrono>

#include "bench/touch_lines.h"
#include "engine/sparse/column_sparse.h"
#include "engine/sparse/sparse_ops.h"

namespace thermocline {

void ActiveSetRecorder::OnLayer(int layer) {
  std::lock_guard<std::mutex> lock(mu_);
  layers_.push_back({layer, {}});
}

void ActiveSetRecorder::OnChunk(int layer, absl::Span<const int32_t> predicted,
                                absl::Span<const int32_t> up, absl::Span<const int32_t> fired) {
  std::lock_guard<std::mutex> lock(mu_);
  if (layers_.empty() || layers_.back().layer != layer) layers_.push_back({layer, {}});
  layers_.back().chunks.push_back(
      {{predicted.begin(), predicted.end()}, {up.begin(), up.end()}, {fired.begin(), fired.end()}});
}

void ActiveSetRecorder::OnColumns(int layer, ColumnReads which, absl::Span<const int32_t> kept) {
  std::lock_guard<std::mutex> lock(mu_);
  if (which == ColumnReads::kQkv || column_layers_.empty() ||
      column_layers_.back().layer != layer) {
    column_layers_.push_back({layer, {}, {}, {}});
  }
  ColumnLayer& l = column_layers_.back();
  std::vector<int32_t>& list = which == ColumnReads::kQkv      ? l.qkv
                               : which == ColumnReads::kGateUp ? l.gate_up
                                                               : l.down;
  list.insert(list.end(), kept.begin(), kept.end());
}

int64_t ActiveSetRecorder::tokens() const {
  return std::count_if(layers_.begin(), layers_.end(), [](const Layer& l) { return l.layer == 0; });
}

int ActiveSetRecorder::first_column_layer() const {
  int first = -1;
  for (const ColumnLayer& l : column_layers_)
    first = first < 0 ? l.layer : std::min(first, l.layer);
  return first;
}

int64_t ActiveSetRecorder::column_tokens() const {
  const int first = first_column_layer();
  return std::count_if(column_layers_.begin(), column_layers_.end(),
                       [first](const ColumnLayer& l) { return l.layer == first; });
}

namespace {

// The rows `slots` of w, in order, fetched as the sparse operators fetch theirs.
uint64_t TouchRows(const WeightView& w, absl::Span<const int32_t> slots) {
  const int64_t n = static_cast<int64_t>(slots.size());
  const size_t bytes = RowBytes(w.type, w.cols);
  for (int64_t j = 0; j < std::min(n, kPrefetchRows); ++j) PrefetchRow(w.row(slots[j]), bytes);
  uint64_t sum = 0;
  for (int64_t j = 0; j < n; ++j) {
    if (j + kPrefetchRows < n) PrefetchRow(w.row(slots[j + kPrefetchRows]), bytes);
    sum += TouchLines(w.row(slots[j]), bytes);
  }
  return sum;
}

// The rows of the kept inputs `kept` (ascending) of w, in the integer kernels' order: per block
// of 32 inputs, each step a line of the block's scales (and mins) and a line of each kept row,
// the step kAheadSteps on prefetched (column_sparse.h). `begins`: room for a block start per
// kept input and one more.
uint64_t TouchColumns(const ColumnWeight& w, absl::Span<const int32_t> kept,
                      std::vector<int32_t>& begins) {
  if (kept.empty() || w.out() == 0) return 0;
  if (w.form() == ColumnWeight::Form::kFloat) return TouchRows(w.rows(), kept);
  using column_sparse_internal::PrefetchRows;
  const int32_t n = static_cast<int32_t>(kept.size());
  int64_t n_blocks = 0;
  for (int32_t i = 0; i < n; ++i) {
    if (i == 0 || kept[i] / kColumnBlock != kept[i - 1] / kColumnBlock) begins[n_blocks++] = i;
  }
  begins[n_blocks] = n;
  const size_t row_bytes = w.row_bytes();
  const int64_t steps = static_cast<int64_t>(row_bytes / kColumnStepBytes);
  const size_t scale_bytes = static_cast<size_t>(w.chunk()) * sizeof(uint16_t);  // a step's
  const uint8_t* values = w.values();
  auto prefetch = [&](int64_t step) {
    if (const int64_t k = step / steps; k < n_blocks) {
      PrefetchRows(values, row_bytes, kept.data(), begins[k], begins[k + 1],
                   static_cast<size_t>(step % steps) * kColumnStepBytes);
    }
  };
  for (int64_t t = 0; t < column_sparse_internal::kAheadSteps; ++t) prefetch(t);
  uint64_t sum = 0, v;
  for (int64_t k = 0; k < n_blocks; ++k) {
    const int64_t block = kept[begins[k]] / kColumnBlock;
    const auto* scales = reinterpret_cast<const uint8_t*>(w.scales(block));
    const auto* mins = reinterpret_cast<const uint8_t*>(w.mins(block));
    for (int64_t c = 0; c < steps; ++c) {
      prefetch(k * steps + c + column_sparse_internal::kAheadSteps);
      sum += TouchLines(scales + c * scale_bytes, scale_bytes);
      if (mins != nullptr) sum += TouchLines(mins + c * scale_bytes, scale_bytes);
      for (int32_t i = begins[k]; i < begins[k + 1]; ++i) {
        std::memcpy(&v, values + kept[i] * row_bytes + c * kColumnStepBytes, 8);
        sum += v;
      }
    }
  }
  return sum;
}

// Rows [rows · part / parts, rows · (part + 1) / parts) of w.
uint64_t TouchShare(const WeightView& w, int part, int parts) {
  const int64_t begin = w.rows * part / parts, end = w.rows * (part + 1) / parts;
  return end > begin ? TouchLines(w.row(begin), static_cast<size_t>(end - begin) * w.row_bytes) : 0;
}

// The flush buffer read over the pool, untimed: the rest of a token's reads.
class Flush {
 public:
  Flush(ThreadPool& pool, size_t bytes)
      : pool_(pool), buffer_(std::max<size_t>(bytes, size_t{1} << 20), 1) {}
  void Run(std::vector<uint64_t>& sinks) {
    const int parts = pool_.size();
    pool_.Run([&](int part) {
      const size_t begin = buffer_.size() * part / parts, end = buffer_.size() * (part + 1) / parts;
      if (end > begin) sinks[part * 8] += TouchLines(buffer_.data() + begin, end - begin);
    });
  }

 private:
  ThreadPool& pool_;
  std::vector<uint8_t> buffer_;  // >= 8 B a thread
};

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

void Keep(const std::vector<uint64_t>& sinks) {
  volatile uint64_t keep = 0;  // the reads' sums are used, so the reads are not dropped
  for (uint64_t v : sinks) keep = keep + v;
}

}  // namespace

double ReplaySparseReads(const SparseWeights& weights, ThreadPool& pool,
                         const ActiveSetRecorder& recorder, int repetitions, size_t flush_bytes) {
  const std::vector<ActiveSetRecorder::Layer>& layers = recorder.layers();
  const int64_t tokens = recorder.tokens();
  if (tokens == 0 || layers.empty()) return 0;
  const int parts = pool.size();
  Flush flush(pool, flush_bytes);
  std::vector<uint64_t> sinks(static_cast<size_t>(parts) * 8, 0);  // a line apart per thread
  std::vector<double> per_token;
  for (int rep = 0; rep < std::max(1, repetitions); ++rep) {
    double seconds = 0;
    for (size_t i = 0; i < layers.size(); ++i) {
      if (layers[i].layer == 0) flush.Run(sinks);
      const ActiveSetRecorder::Layer& rec = layers[i];
      const SparseWeights::Layer& y = weights.layer(rec.layer);
      const SparseLayerPlan& p = weights.plan()[rec.layer];
      const auto t0 = std::chrono::steady_clock::now();
      pool.Run([&](int part) {
        uint64_t sum = 0;
        if (p.rank > 0)
          sum += TouchShare(p.fc1.view, part, parts) + TouchShare(y.fc2_t.view, part, parts);
        for (size_t c = part; c < rec.chunks.size(); c += parts) {
          const ActiveSetRecorder::Chunk& chunk = rec.chunks[c];
          sum += TouchRows(y.gate, chunk.predicted) + TouchRows(y.up, chunk.up) +
                 TouchRows(y.down_t, chunk.fired);
        }
        sinks[part * 8] += sum;
      });
      seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
    per_token.push_back(seconds / static_cast<double>(tokens));
  }
  Keep(sinks);
  return Median(std::move(per_token));
}

double ReplayColumnReads(const SparseWeights& weights, ThreadPool& pool,
                         const ActiveSetRecorder& recorder, int repetitions, size_t flush_bytes) {
  const std::vector<ActiveSetRecorder::ColumnLayer>& layers = recorder.column_layers();
  const int64_t tokens = recorder.column_tokens();
  if (tokens == 0) return 0;
  const int first = recorder.first_column_layer();
  const int parts = pool.size();
  Flush flush(pool, flush_bytes);
  std::vector<uint64_t> sinks(static_cast<size_t>(parts) * 8, 0);  // a line apart per thread
  const int64_t max_in = weights.model().hparams().n_ff + weights.model().hparams().n_embd;
  std::vector<std::vector<int32_t>> begins(parts, std::vector<int32_t>(max_in + 1));
  // Part `part` of `kept` as ColumnSplit shares it.
  auto share = [parts](const std::vector<int32_t>& kept, int part) {
    const int64_t n = static_cast<int64_t>(kept.size());
    const int64_t e0 = ColumnSplit(kept.data(), n, part, parts);
    const int64_t e1 = ColumnSplit(kept.data(), n, part + 1, parts);
    return absl::Span<const int32_t>(kept.data() + e0, static_cast<size_t>(e1 - e0));
  };
  std::vector<double> per_token;
  for (int rep = 0; rep < std::max(1, repetitions); ++rep) {
    double seconds = 0;
    for (const ActiveSetRecorder::ColumnLayer& rec : layers) {
      if (rec.layer == first) flush.Run(sinks);
      const SparseWeights::Layer& y = weights.layer(rec.layer);
      const auto t0 = std::chrono::steady_clock::now();
      pool.Run([&](int part) {
        std::vector<int32_t>& b = begins[part];
        const absl::Span<const int32_t> qkv = share(rec.qkv, part);
        uint64_t sum = 0;
        if (y.qkv_c.out() > 0) {
          sum += TouchColumns(y.qkv_c, qkv, b);
        } else {
          sum += TouchColumns(y.q_c, qkv, b) + TouchColumns(y.k_c, qkv, b) +
                 TouchColumns(y.v_c, qkv, b);
        }
        const absl::Span<const int32_t> gate_up = share(rec.gate_up, part);
        sum += TouchColumns(y.gate_c, gate_up, b) + TouchColumns(y.up_c, gate_up, b);
        sum += TouchColumns(y.down_c, share(rec.down, part), b);
        sinks[part * 8] += sum;
      });
      seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
    per_token.push_back(seconds / static_cast<double>(tokens));
  }
  Keep(sinks);
  return Median(std::move(per_token));
}

}  // namespace thermocline
