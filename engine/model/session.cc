#include "engine/model/session.h"

#include <algorithm>
#include <cmath>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/model/cpu_ops.h"
#include "engine/model/moe_route.h"

namespace thermocline {
namespace {

// Multiply-adds of attention (positions × head_dim per head) below which a part of the heads
// is not worth handing to another thread. Low: the first head of each KV group waits for its
// K and V rows from memory, and two threads wait for half as many each (32 heads of 64 at
// 16-48 positions, 2 threads: 480 -> 377 us per token with 2^13 instead of 2^17).
constexpr int64_t kAttentionWorkPerPart = int64_t{1} << 13;
// Query heads of one KV group that one attention item takes together (kernels.h's
// AttendGroupF16 reads each cached row once for them).
constexpr int64_t kAttentionHeadsPerItem = 4;

// The F16 cache in tiles of positions, each KV head's rows of a tile together (kernels.h's
// HalfRows), 64 KB of them per head: a head's K and V rows come in runs that the hardware
// prefetchers stream, where rows of positions side by side gave each head one piece of every row
// of all heads (on the 1.1B shape 128 bytes of each 512): at 4000 positions its attention took
// 1.4x as long (docs/types.md, "The KV cache"). Runs of 32 KB were 1.13x slower than one run per
// head, runs of 64 KB as fast. Tiles rather than one run per head for the whole context keep the
// pages a short sequence touches about as few as with rows side by side.
constexpr int64_t kKvTileBytes = int64_t{1} << 16;

// log2 of the positions per tile: kKvTileBytes per head, fewer for a context that is shorter.
// The allocation is rounded up to a whole tile; the positions past n_ctx are never touched, so
// what may become resident stays KvCacheBytes.
int KvTileShift(const LlamaHparams& h, int64_t n_ctx) {
  const int64_t row_bytes = std::max<int64_t>(1, std::max(h.head_dim, h.head_dim_v)) * 2;
  int shift = 0;
  while ((int64_t{1} << shift) * row_bytes < kKvTileBytes && (int64_t{1} << shift) < n_ctx) {
    ++shift;
  }
  return shift;
}

int64_t KvTiledPositions(int64_t n_ctx, int shift) {
  const int64_t tile = int64_t{1} << shift;
  return (n_ctx + tile - 1) / tile * tile;
}

// Offset of (position, head)'s row in a layer's tiled cache of rows of `dim` per head.
int64_t KvTiledOffset(int64_t pos, int64_t head, int64_t n_head_kv, int64_t dim, int shift) {
  const int64_t tile = int64_t{1} << shift;
  return ((pos >> shift) * n_head_kv + head) * tile * dim + (pos & (tile - 1)) * dim;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Session>> Session::Create(const LlamaModel& model, ThreadPool* pool,
                                                         const SessionOptions& options) {
  const LlamaHparams& h = model.hparams();
  const int64_t n_ctx = options.n_ctx > 0 ? options.n_ctx : h.n_ctx_train;
  if (n_ctx > (int64_t{1} << 22)) {
    return absl::InvalidArgumentError(
        absl::StrCat("context length ", n_ctx, " is too large (at most ", int64_t{1} << 22, ")"));
  }
  if (options.max_batch < 1 || options.max_batch > 4096) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_batch ", options.max_batch, " must be in [1, 4096]"));
  }
  const uint64_t kv_bytes = KvCacheBytes(h, n_ctx, options.kv_type);
  if (kv_bytes > (uint64_t{1} << 38)) {
    return absl::ResourceExhaustedError(absl::StrCat("a KV cache of ", n_ctx, " positions needs ",
                                                     kv_bytes >> 20,
                                                     " MiB; use a shorter context"));
  }
  return std::unique_ptr<Session>(
      new Session(model, pool, n_ctx, std::min(options.max_batch, n_ctx), options.kv_type));
}

Session::Session(const LlamaModel& model, ThreadPool* pool, int64_t n_ctx, int64_t max_batch,
                 KvType kv_type)
    : model_(model), pool_(pool), n_ctx_(n_ctx), max_batch_(max_batch), kv_type_(kv_type) {
  const LlamaHparams& h = model.hparams();
  if (kv_type == KvType::kF16) {
    kv_tile_shift_ = KvTileShift(h, n_ctx);
    k_cache_f16_.resize(h.n_layer * KvTiledPositions(n_ctx, kv_tile_shift_) * h.kv_dim());
    v_cache_f16_.resize(h.n_layer * KvTiledPositions(n_ctx, kv_tile_shift_) * h.v_dim());
  } else {
    k_cache_.resize(h.n_layer * n_ctx * h.kv_dim());
    v_cache_.resize(h.n_layer * n_ctx * h.v_dim());
  }
  rope_table_ = RopeTable::ForModel(h, model.rope_factors(n_ctx));
  rope_.resize(max_batch * h.rope_dim);
  has_swa_rope_ = h.rope_freq_base_swa > 0;
  if (has_swa_rope_) {
    rope_table_swa_ = RopeTable::ForSlidingLayers(h);
    rope_swa_.resize(max_batch * h.rope_dim);
  }
  x_.resize(max_batch * h.n_embd);
  xb_.resize(max_batch * h.n_embd);
  q_.resize(max_batch * h.q_dim());
  k_.resize(max_batch * h.kv_dim());
  v_.resize(max_batch * h.v_dim());
  att_out_.resize(max_batch * h.o_dim());
  ffn_out_.resize(max_batch * h.n_embd);
  scores_.resize(static_cast<size_t>(pool->size()) * kAttentionHeadsPerItem * n_ctx);
  const int64_t n_ff = std::max({h.n_ff, h.n_ff_exp, h.n_ff_shexp});
  gate_.resize(max_batch * n_ff);
  up_.resize(max_batch * n_ff);
  if (h.is_moe()) {
    router_.resize(max_batch * h.n_expert);
    sel_.resize(max_batch * h.n_expert_used);
    sel_w_.resize(max_batch * h.n_expert_used);
    tok_.resize(max_batch);
    tok_w_.resize(max_batch);
    xg_.resize(max_batch * h.n_embd);
    eo_.resize(max_batch * h.n_embd);
  }
  logits_.resize(h.n_vocab);
  set_packed_weights(nullptr);
  scratch_.Reserve(max_batch, std::max({h.n_embd, n_ff, h.q_dim(), h.o_dim()}));
}

void Session::set_packed_weights(const PackedWeights* packed) {
  auto view = [&](const WeightView& w) { return packed != nullptr ? &packed->Resolve(w) : &w; };
  dense_.clear();
  for (const LayerWeights& L : model_.layers()) {
    dense_.push_back({view(L.wq), view(L.wk), view(L.wv), view(L.wo), view(L.ffn_gate),
                      view(L.ffn_up), view(L.ffn_down)});
  }
  output_ = view(model_.output());
}

absl::Status Session::Eval(absl::Span<const int32_t> tokens, float* all_logits) {
  return EvalChunks(tokens, all_logits, nullptr);
}

absl::Status Session::EvalHidden(absl::Span<const int32_t> tokens, float* hidden) {
  return EvalChunks(tokens, nullptr, hidden);
}

absl::Status Session::EvalChunks(absl::Span<const int32_t> tokens, float* all_logits,
                                 float* hidden) {
  const int64_t n = static_cast<int64_t>(tokens.size());
  if (n == 0) return absl::OkStatus();
  if (n_past_ + n > n_ctx_) {
    return absl::OutOfRangeError(absl::StrCat("context is full: ", n_past_, " + ", n,
                                              " tokens exceed the context length ", n_ctx_));
  }
  const int64_t n_vocab = model_.hparams().n_vocab;
  for (int32_t t : tokens) {
    if (t < 0 || t >= n_vocab) {
      return absl::InvalidArgumentError(
          absl::StrCat("token id ", t, " is outside the vocabulary [0, ", n_vocab, ")"));
    }
  }
  for (int64_t i = 0; i < n; i += max_batch_) {
    const int64_t chunk = std::min(max_batch_, n - i);
    absl::Status s =
        Forward(tokens.data() + i, chunk, all_logits ? all_logits + i * n_vocab : nullptr,
                hidden ? hidden + i * model_.hparams().n_embd : nullptr);
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status Session::Forward(const int32_t* tokens, int64_t n, float* all_logits, float* hidden) {
  const LlamaHparams& h = model_.hparams();
  const int64_t d = h.n_embd;
  for (int64_t t = 0; t < n; ++t) {
    model_.Embed(tokens[t], x_.data() + t * d);
    // RoPE angles for this position, shared by every head and layer (of a kind).
    rope_table_.Fill(n_past_ + t, rope_.data() + t * h.rope_dim);
    if (has_swa_rope_) rope_table_swa_.Fill(n_past_ + t, rope_swa_.data() + t * h.rope_dim);
  }

  // Runs of consecutive layers the layer backend owns go to it in one call each; the rest (and
  // everything without a backend) run here.
  LayerBackend* lb = layer_backend_;
  for (int64_t l = 0; l < h.n_layer;) {
    if (lb == nullptr || !lb->Owns(l)) {
      CpuLayer(static_cast<int>(l), n);
      ++l;
      continue;
    }
    int64_t end = l + 1;
    while (end < h.n_layer && lb->Owns(end)) ++end;
    if (end == h.n_layer && lb->Owns(h.n_layer) && hidden == nullptr) {
      float* out = all_logits != nullptr ? all_logits : logits_.data();
      absl::Status s =
          lb->Forward(l, end, x_.data(), n, n_past_, rope_.data(), out, all_logits != nullptr);
      if (!s.ok()) return s;
      if (all_logits != nullptr) {
        std::copy(all_logits + (n - 1) * h.n_vocab, all_logits + n * h.n_vocab, logits_.begin());
      }
      n_past_ += n;
      return absl::OkStatus();
    }
    absl::Status s = lb->Forward(l, end, x_.data(), n, n_past_, rope_.data(), nullptr, false);
    if (!s.ok()) return s;
    l = end;
  }

  if (hidden != nullptr) {
    for (int64_t t = 0; t < n; ++t) {
      RmsNorm(x_.data() + t * d, model_.output_norm().data(), d, h.rms_eps, hidden + t * d);
    }
    n_past_ += n;
    return absl::OkStatus();
  }
  // Output head: every row when the caller wants all logits, else only the last token's.
  const int64_t first = all_logits ? 0 : n - 1;
  for (int64_t t = first; t < n; ++t) {
    RmsNorm(x_.data() + t * d, model_.output_norm().data(), d, h.rms_eps, xb_.data() + t * d);
  }
  if (all_logits != nullptr) {
    MatMul(*pool_, *output_, xb_.data(), n, all_logits, scratch_);
    if (h.final_softcap > 0) SoftCap(all_logits, n * h.n_vocab, h.final_softcap);
    std::copy(all_logits + (n - 1) * h.n_vocab, all_logits + n * h.n_vocab, logits_.begin());
  } else {
    MatMul(*pool_, *output_, xb_.data() + (n - 1) * d, 1, logits_.data(), scratch_);
    if (h.final_softcap > 0) SoftCap(logits_.data(), h.n_vocab, h.final_softcap);
  }
  n_past_ += n;
  return absl::OkStatus();
}

// One layer on the CPU: attention and FFN with their residual adds, on x_: (n, n_embd). What a
// family adds to llama's layer (biases, post-norms) is decided once per layer.
void Session::CpuLayer(int l, int64_t n) {
  const LlamaHparams& h = model_.hparams();
  const int64_t d = h.n_embd;
  const LayerWeights& L = model_.layers()[l];
  for (int64_t t = 0; t < n; ++t) {
    RmsNorm(x_.data() + t * d, L.attn_norm.data(), d, h.rms_eps, xb_.data() + t * d);
  }
  if (observer_ != nullptr) observer_->OnAttentionInput(l, xb_.data(), d, n);
  const DenseViews& W = dense_[l];
  if (ffn_backend_ == nullptr ||
      !ffn_backend_->ProjectQkv(l, xb_.data(), n, q_.data(), k_.data(), v_.data())) {
    const WeightView* qkv[] = {W.wq, W.wk, W.wv};
    float* const qkv_out[] = {q_.data(), k_.data(), v_.data()};
    MatMulSameInput(*pool_, qkv, xb_.data(), n, qkv_out, scratch_);
  }
  if (!L.bq.empty()) AddBias(q_.data(), n, h.q_dim(), L.bq.data());
  if (!L.bk.empty()) AddBias(k_.data(), n, h.kv_dim(), L.bk.data());
  if (!L.bv.empty()) AddBias(v_.data(), n, h.v_dim(), L.bv.data());
  Attention(l, n);
  MatMul(*pool_, *W.wo, att_out_.data(), n, xb_.data(), scratch_);
  if (!L.bo.empty()) AddBias(xb_.data(), n, d, L.bo.data());
  if (!L.post_attn_norm.empty()) {
    for (int64_t t = 0; t < n; ++t) {
      RmsNorm(xb_.data() + t * d, L.post_attn_norm.data(), d, h.rms_eps, xb_.data() + t * d);
    }
  }
  for (int64_t i = 0; i < n * d; ++i) x_[i] += xb_[i];

  for (int64_t t = 0; t < n; ++t) {
    RmsNorm(x_.data() + t * d, L.ffn_norm.data(), d, h.rms_eps, xb_.data() + t * d);
  }
  if (observer_ != nullptr) observer_->OnFfnInput(l, xb_.data(), d, n);
  if (ffn_backend_ != nullptr && ffn_backend_->TakesFfn(l, n)) {
    ffn_backend_->Forward(l, x_.data(), xb_.data(), n, ffn_out_.data());
  } else {
    DenseFfn(l, x_.data(), xb_.data(), n, ffn_out_.data());
  }
  if (!L.post_ffn_norm.empty()) {
    for (int64_t t = 0; t < n; ++t) {
      RmsNorm(ffn_out_.data() + t * d, L.post_ffn_norm.data(), d, h.rms_eps,
              ffn_out_.data() + t * d);
    }
  }
  for (int64_t i = 0; i < n * d; ++i) x_[i] += ffn_out_[i];
}

void Session::DenseFfn(int layer, const float* x, const float* xn, int64_t n, float* out) {
  const LlamaHparams& h = model_.hparams();
  const LayerWeights& L = model_.layers()[layer];
  if (L.is_moe()) {
    MoeFfn(layer, xn, n, out);
    return;
  }
  const DenseViews& W = dense_[layer];
  MatMul(*pool_, *W.gate, xn, n, gate_.data(), scratch_);
  MatMul(*pool_, *W.up, xn, n, up_.data(), scratch_);
  if (observer_ != nullptr) observer_->OnGate(layer, gate_.data(), up_.data(), h.n_ff, n);
  GatedActivation(h.activation, gate_.data(), up_.data(), n * h.n_ff);
  if (observer_ != nullptr) observer_->OnFfn(layer, x, h.n_embd, gate_.data(), h.n_ff, n);
  MatMul(*pool_, *W.down, gate_.data(), n, out, scratch_);
}

void Session::MoeFfn(int layer, const float* xn, int64_t n, float* out) {
  const LlamaHparams& h = model_.hparams();
  const LayerWeights& L = model_.layers()[layer];
  const int64_t d = h.n_embd, n_expert = h.n_expert, k = h.n_expert_used;
  // Router: the k most probable experts of each token (moe_route.h).
  MatMul(*pool_, L.ffn_gate_inp, xn, n, router_.data(), scratch_);
  RouteTopK(h, router_.data(), n, sel_.data(), sel_w_.data());
  if (observer_ != nullptr) observer_->OnRouting(layer, sel_.data(), k, n);
  std::fill_n(out, n * d, 0.0f);
  // Expert by expert over the tokens that chose it, so that a prefill batch reads each
  // selected expert's weights once.
  const int64_t n_ff = h.n_ff_exp;
  for (int64_t e = 0; e < n_expert; ++e) {
    int64_t m = 0;
    for (int64_t i = 0; i < n * k; ++i) {
      if (sel_[i] != e) continue;
      tok_[m] = static_cast<int32_t>(i / k);
      tok_w_[m++] = sel_w_[i];
    }
    if (m == 0) continue;
    const float* in = xn;
    if (n > 1) {
      for (int64_t i = 0; i < m; ++i) std::copy_n(xn + tok_[i] * d, d, xg_.data() + i * d);
      in = xg_.data();
    }
    MatMul(*pool_, L.expert_gate[e], in, m, gate_.data(), scratch_);
    MatMul(*pool_, L.expert_up[e], in, m, up_.data(), scratch_);
    GatedActivation(h.activation, gate_.data(), up_.data(), m * n_ff);
    MatMul(*pool_, L.expert_down[e], gate_.data(), m, eo_.data(), scratch_);
    for (int64_t i = 0; i < m; ++i) {
      float* o = out + tok_[i] * d;
      const float* y = eo_.data() + i * d;
      const float wgt = tok_w_[i];
      for (int64_t c = 0; c < d; ++c) o[c] += wgt * y[c];
    }
  }
  AddSharedExpert(*pool_, h, L, xn, n, gate_.data(), up_.data(), eo_.data(), scratch_, out);
}

void Session::Attention(int layer, int64_t n) {
  const LlamaHparams& h = model_.hparams();
  const LayerWeights& L = model_.layers()[layer];
  const int64_t kv_dim = h.kv_dim(), v_dim = h.v_dim(), head_dim = h.head_dim;
  const int64_t head_dim_v = h.head_dim_v, q_dim = h.q_dim(), o_dim = h.o_dim();
  const bool half = kv_type_ == KvType::kF16;
  float* k_cache = half ? nullptr : k_cache_.data() + layer * n_ctx_ * kv_dim;
  float* v_cache = half ? nullptr : v_cache_.data() + layer * n_ctx_ * v_dim;
  const int shift = kv_tile_shift_;
  const int64_t tile = int64_t{1} << shift, n_tiled = KvTiledPositions(n_ctx_, shift);
  uint16_t* k_cache_f16 = half ? k_cache_f16_.data() + layer * n_tiled * kv_dim : nullptr;
  uint16_t* v_cache_f16 = half ? v_cache_f16_.data() + layer * n_tiled * v_dim : nullptr;
  static const TypeKernels& f16 = *KernelsFor(GgmlType::kF16);  // the cache rows' writer
  const bool slides = h.LayerSlides(layer);
  const float* table = slides && has_swa_rope_ ? rope_swa_.data() : rope_.data();
  auto rope = h.rope_kind == RopeKind::kNeox ? ApplyRopeNeox : ApplyRope;
  for (int64_t t = 0; t < n; ++t) {
    float* q = q_.data() + t * q_dim;
    float* k = k_.data() + t * kv_dim;
    if (!L.q_norm.empty()) {
      for (int64_t i = 0; i < h.n_head; ++i) {
        RmsNorm(q + i * head_dim, L.q_norm.data(), head_dim, h.rms_eps, q + i * head_dim);
      }
      for (int64_t i = 0; i < h.n_head_kv; ++i) {
        RmsNorm(k + i * head_dim, L.k_norm.data(), head_dim, h.rms_eps, k + i * head_dim);
      }
    }
    const float* cs = table + t * h.rope_dim;
    rope(q, h.n_head, head_dim, h.rope_dim, cs);
    rope(k, h.n_head_kv, head_dim, h.rope_dim, cs);
    const float* v = v_.data() + t * v_dim;
    const int64_t pos = n_past_ + t;
    if (half) {
      for (int64_t i = 0; i < h.n_head_kv; ++i) {
        f16.from_float(k + i * head_dim,
                       k_cache_f16 + KvTiledOffset(pos, i, h.n_head_kv, head_dim, shift), head_dim);
        f16.from_float(v + i * head_dim_v,
                       v_cache_f16 + KvTiledOffset(pos, i, h.n_head_kv, head_dim_v, shift),
                       head_dim_v);
      }
    } else {
      std::copy_n(k, kv_dim, k_cache + pos * kv_dim);
      std::copy_n(v, v_dim, v_cache + pos * v_dim);
    }
  }
  const int64_t group = h.n_head / h.n_head_kv;
  const float scale = h.attn_scale, softcap = h.attn_softcap;
  // A sliding layer's query at position p sees positions p - n_swa + 1 .. p.
  const int64_t window = slides ? h.n_swa : n_ctx_;
  // Items of up to kAttentionHeadsPerItem heads of one KV group: the kernel reads each cached
  // row once for them. A block of heads for consecutive tokens, so that a thread's share of a
  // prompt is whole blocks over all its tokens: every share holds the same mix of short and long
  // causal spans, and the tokens after each other read the same rows.
  const int64_t per_item = std::min<int64_t>(group, kAttentionHeadsPerItem);
  const int64_t items_per_group = (group + per_item - 1) / per_item;
  const int64_t items_per_token = h.n_head_kv * items_per_group;
  // Items per part: enough work to pay for a hand-off (a short context stays on this thread).
  const int64_t span = std::min(n_past_ + n, window);
  const int64_t grain = std::max<int64_t>(1, kAttentionWorkPerPart / (span * head_dim * per_item));
  pool_->ParallelFor(n * items_per_token, grain, [&](int thread, int64_t begin, int64_t end) {
    float* scores = scores_.data() + thread * kAttentionHeadsPerItem * n_ctx_;
    for (int64_t item = begin; item < end; ++item) {
      const int64_t t = item % n, in_token = item / n;
      const int64_t kv_head = in_token / items_per_group;
      const int64_t head = kv_head * group + in_token % items_per_group * per_item;
      const int64_t heads = std::min(per_item, (kv_head + 1) * group - head);
      const int64_t pos = n_past_ + t;  // causal: positions first .. pos
      const int64_t first = std::max<int64_t>(0, pos + 1 - window);
      const float* q = q_.data() + t * q_dim + head * head_dim;
      float* out = att_out_.data() + t * o_dim + head * head_dim_v;
      if (half) {
        const HalfRows k_rows = {k_cache_f16 + kv_head * tile * head_dim, head_dim, tile * kv_dim,
                                 first, shift};
        const HalfRows v_rows = {v_cache_f16 + kv_head * tile * head_dim_v, head_dim_v,
                                 tile * v_dim, first, shift};
        AttendGroupF16(pos + 1 - first, head_dim, head_dim_v, static_cast<int>(heads), q, head_dim,
                       k_rows, v_rows, scale, softcap, n > 1, scores, out, head_dim_v);
      } else {
        const int64_t k_off = first * kv_dim + kv_head * head_dim;
        const int64_t v_off = first * v_dim + kv_head * head_dim_v;
        for (int64_t i = 0; i < heads; ++i) {
          AttendHead(pos + 1 - first, head_dim, head_dim_v, q + i * head_dim, k_cache + k_off,
                     kv_dim, v_cache + v_off, v_dim, scale, softcap, scores, out + i * head_dim_v);
        }
      }
    }
  });
}

bool ParseKvType(const std::string& name, KvType* type) {
  if (name == "f16") {
    *type = KvType::kF16;
  } else if (name == "f32") {
    *type = KvType::kF32;
  } else {
    return false;
  }
  return true;
}

uint64_t KvCacheBytes(const LlamaHparams& h, int64_t n_ctx, KvType type) {
  const uint64_t element = type == KvType::kF16 ? sizeof(uint16_t) : sizeof(float);
  return static_cast<uint64_t>(h.n_layer) * n_ctx * (h.kv_dim() + h.v_dim()) * element;
}

}  // namespace thermocline
