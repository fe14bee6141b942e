// Recording a sparse decode's active sets (a mutex-guarded list per layer and token) and
// replaying only their reads, per layer over the pool, between untimed streams of a flush buffer.
#include "bench/sparse_read_floor.h"

#include <algorithm>
#include <chrono>

#include "bench/touch_lines.h"
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

int64_t ActiveSetRecorder::tokens() const {
  return std::count_if(layers_.begin(), layers_.end(), [](const Layer& l) { return l.layer == 0; });
}

namespace {

// The rows `slots` of w, in order, fetched as the sparse operators fetch theirs.
uint64_t TouchRows(const WeightView& w, const std::vector<int32_t>& slots) {
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

// Rows [rows · part / parts, rows · (part + 1) / parts) of w.
uint64_t TouchShare(const WeightView& w, int part, int parts) {
  const int64_t begin = w.rows * part / parts, end = w.rows * (part + 1) / parts;
  return end > begin ? TouchLines(w.row(begin), static_cast<size_t>(end - begin) * w.row_bytes) : 0;
}

}  // namespace

double ReplaySparseReads(const SparseWeights& weights, ThreadPool& pool,
                         const ActiveSetRecorder& recorder, int repetitions, size_t flush_bytes) {
  const std::vector<ActiveSetRecorder::Layer>& layers = recorder.layers();
  const int64_t tokens = recorder.tokens();
  if (tokens == 0 || layers.empty()) return 0;
  const int parts = pool.size();
  std::vector<uint8_t> flush(std::max<size_t>(flush_bytes, size_t{1} << 20), 1);  // >= 8 B a thread
  std::vector<uint64_t> sinks(static_cast<size_t>(parts) * 8, 0);  // a line apart per thread
  std::vector<double> per_token;
  for (int rep = 0; rep < std::max(1, repetitions); ++rep) {
    double seconds = 0;
    for (size_t i = 0; i < layers.size(); ++i) {
      if (layers[i].layer == 0) {
        pool.Run([&](int part) {
          const size_t begin = flush.size() * part / parts, end = flush.size() * (part + 1) / parts;
          if (end > begin) sinks[part * 8] += TouchLines(flush.data() + begin, end - begin);
        });
      }
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
                 TouchRows(y.down_t.view, chunk.fired);
        }
        sinks[part * 8] += sum;
      });
      seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    }
    per_token.push_back(seconds / static_cast<double>(tokens));
  }
  volatile uint64_t keep = 0;  // the reads' sums are used, so the reads are not dropped
  for (uint64_t v : sinks) keep = keep + v;
  std::sort(per_token.begin(), per_token.end());
  return per_token[per_token.size() / 2];
}

}  // namespace thermocline
