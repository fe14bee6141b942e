#include "engine/model/session.h"

#include <algorithm>
#include <cmath>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "engine/model/cpu_ops.h"

namespace thermocline {

absl::StatusOr<std::unique_ptr<Session>> Session::Create(const LlamaModel& model, ThreadPool* pool,
                                                         const SessionOptions& options) {
  const LlamaHparams& h = model.hparams();
  const int64_t n_ctx = options.n_ctx > 0 ? options.n_ctx : h.n_ctx_train;
  if (n_ctx > (int64_t{1} << 22)) {
    return absl::InvalidArgumentError(absl::StrCat("context length ", n_ctx, " is too large"));
  }
  if (options.max_batch < 1 || options.max_batch > 4096) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_batch ", options.max_batch, " must be in [1, 4096]"));
  }
  const uint64_t kv_bytes = 2ull * h.n_layer * n_ctx * h.kv_dim() * sizeof(float);
  if (kv_bytes > (uint64_t{1} << 38)) {
    return absl::ResourceExhaustedError(absl::StrCat("a KV cache of ", n_ctx, " positions needs ",
                                                     kv_bytes >> 20,
                                                     " MiB; use a shorter context"));
  }
  return std::unique_ptr<Session>(
      new Session(model, pool, n_ctx, std::min(options.max_batch, n_ctx)));
}

Session::Session(const LlamaModel& model, ThreadPool* pool, int64_t n_ctx, int64_t max_batch)
    : model_(model), pool_(pool), n_ctx_(n_ctx), max_batch_(max_batch) {
  const LlamaHparams& h = model.hparams();
  k_cache_.resize(h.n_layer * n_ctx * h.kv_dim());
  v_cache_.resize(h.n_layer * n_ctx * h.kv_dim());
  inv_freq_.resize(h.rope_dim / 2);
  for (int64_t i = 0; i < h.rope_dim / 2; ++i) {
    inv_freq_[i] = static_cast<float>(std::pow(static_cast<double>(h.rope_freq_base),
                                               -2.0 * i / static_cast<double>(h.rope_dim)));
  }
  rope_.resize(max_batch * h.rope_dim);
  x_.resize(max_batch * h.n_embd);
  xb_.resize(max_batch * h.n_embd);
  q_.resize(max_batch * h.q_dim());
  k_.resize(max_batch * h.kv_dim());
  v_.resize(max_batch * h.kv_dim());
  att_out_.resize(max_batch * h.q_dim());
  ffn_out_.resize(max_batch * h.n_embd);
  scores_.resize(static_cast<size_t>(pool->size()) * n_ctx);
  gate_.resize(max_batch * h.n_ff);
  up_.resize(max_batch * h.n_ff);
  logits_.resize(h.n_vocab);
  scratch_.Reserve(max_batch, std::max({h.n_embd, h.n_ff, h.q_dim()}));
}

absl::Status Session::Eval(absl::Span<const int32_t> tokens, float* all_logits) {
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
        Forward(tokens.data() + i, chunk, all_logits ? all_logits + i * n_vocab : nullptr);
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status Session::Forward(const int32_t* tokens, int64_t n, float* all_logits) {
  const LlamaHparams& h = model_.hparams();
  const int64_t d = h.n_embd;
  for (int64_t t = 0; t < n; ++t) {
    model_.Embed(tokens[t], x_.data() + t * d);
    // RoPE angles for this position, shared by every head and layer.
    const double pos = static_cast<double>(n_past_ + t) * h.rope_freq_scale;
    float* cs = rope_.data() + t * h.rope_dim;
    for (int64_t i = 0; i < h.rope_dim / 2; ++i) {
      const double theta = pos * inv_freq_[i];
      cs[2 * i] = static_cast<float>(std::cos(theta));
      cs[2 * i + 1] = static_cast<float>(std::sin(theta));
    }
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
    if (end == h.n_layer && lb->Owns(h.n_layer)) {
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

  // Output head: every row when the caller wants all logits, else only the last token's.
  const int64_t first = all_logits ? 0 : n - 1;
  for (int64_t t = first; t < n; ++t) {
    RmsNorm(x_.data() + t * d, model_.output_norm().data(), d, h.rms_eps, xb_.data() + t * d);
  }
  if (all_logits != nullptr) {
    MatMul(*pool_, model_.output(), xb_.data(), n, all_logits, scratch_);
    std::copy(all_logits + (n - 1) * h.n_vocab, all_logits + n * h.n_vocab, logits_.begin());
  } else {
    MatMul(*pool_, model_.output(), xb_.data() + (n - 1) * d, 1, logits_.data(), scratch_);
  }
  n_past_ += n;
  return absl::OkStatus();
}

// One layer on the CPU: attention and FFN with their residual adds, on x_: (n, n_embd).
void Session::CpuLayer(int l, int64_t n) {
  const LlamaHparams& h = model_.hparams();
  const int64_t d = h.n_embd;
  const LayerWeights& L = model_.layers()[l];
  for (int64_t t = 0; t < n; ++t) {
    RmsNorm(x_.data() + t * d, L.attn_norm.data(), d, h.rms_eps, xb_.data() + t * d);
  }
  const WeightView* qkv[] = {&L.wq, &L.wk, &L.wv};
  float* const qkv_out[] = {q_.data(), k_.data(), v_.data()};
  MatMulSameInput(*pool_, qkv, xb_.data(), n, qkv_out, scratch_);
  Attention(l, n);
  MatMul(*pool_, L.wo, att_out_.data(), n, xb_.data(), scratch_);
  for (int64_t i = 0; i < n * d; ++i) x_[i] += xb_[i];

  for (int64_t t = 0; t < n; ++t) {
    RmsNorm(x_.data() + t * d, L.ffn_norm.data(), d, h.rms_eps, xb_.data() + t * d);
  }
  if (ffn_backend_ != nullptr) {
    ffn_backend_->Forward(l, x_.data(), xb_.data(), n, ffn_out_.data());
  } else {
    DenseFfn(l, x_.data(), xb_.data(), n, ffn_out_.data());
  }
  for (int64_t i = 0; i < n * d; ++i) x_[i] += ffn_out_[i];
}

void Session::DenseFfn(int layer, const float* x, const float* xn, int64_t n, float* out) {
  const LlamaHparams& h = model_.hparams();
  const LayerWeights& L = model_.layers()[layer];
  MatMul(*pool_, L.ffn_gate, xn, n, gate_.data(), scratch_);
  MatMul(*pool_, L.ffn_up, xn, n, up_.data(), scratch_);
  GatedActivation(h.activation, gate_.data(), up_.data(), n * h.n_ff);
  if (observer_ != nullptr) observer_->OnFfn(layer, x, h.n_embd, gate_.data(), h.n_ff, n);
  MatMul(*pool_, L.ffn_down, gate_.data(), n, out, scratch_);
}

// Multiply-adds of attention (positions × head_dim per head) below which a part of the heads
// is not worth handing to another thread. Low: the first head of each KV group waits for its
// K and V rows from memory, and two threads wait for half as many each (32 heads of 64 at
// 16-48 positions, 2 threads: 480 -> 377 us per token with 2^13 instead of 2^17).
constexpr int64_t kAttentionWorkPerPart = int64_t{1} << 13;

void Session::Attention(int layer, int64_t n) {
  const LlamaHparams& h = model_.hparams();
  const int64_t kv_dim = h.kv_dim(), head_dim = h.head_dim;
  float* k_cache = k_cache_.data() + layer * n_ctx_ * kv_dim;
  float* v_cache = v_cache_.data() + layer * n_ctx_ * kv_dim;
  for (int64_t t = 0; t < n; ++t) {
    const float* cs = rope_.data() + t * h.rope_dim;
    ApplyRope(q_.data() + t * h.q_dim(), h.n_head, head_dim, h.rope_dim, cs);
    ApplyRope(k_.data() + t * kv_dim, h.n_head_kv, head_dim, h.rope_dim, cs);
    std::copy_n(k_.data() + t * kv_dim, kv_dim, k_cache + (n_past_ + t) * kv_dim);
    std::copy_n(v_.data() + t * kv_dim, kv_dim, v_cache + (n_past_ + t) * kv_dim);
  }
  const int64_t group = h.n_head / h.n_head_kv;
  const float scale = 1.0f / std::sqrt(static_cast<float>(head_dim));
  // Heads per part: enough work to pay for a hand-off (a short context stays on this thread).
  const int64_t grain = std::max<int64_t>(1, kAttentionWorkPerPart / ((n_past_ + n) * head_dim));
  pool_->ParallelFor(n * h.n_head, grain, [&](int thread, int64_t begin, int64_t end) {
    float* scores = scores_.data() + thread * n_ctx_;
    for (int64_t item = begin; item < end; ++item) {
      const int64_t t = item / h.n_head, head = item % h.n_head;
      const int64_t kv_off = (head / group) * head_dim;
      const int64_t n_kv = n_past_ + t + 1;  // causal: positions 0 .. n_past + t
      AttendHead(n_kv, head_dim, q_.data() + t * h.q_dim() + head * head_dim, k_cache + kv_off,
                 kv_dim, v_cache + kv_off, kv_dim, scale, scores,
                 att_out_.data() + t * h.q_dim() + head * head_dim);
    }
  });
}

}  // namespace thermocline
