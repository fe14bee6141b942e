// A Session is one sequence being decoded: its KV cache and the scratch buffers of the forward
// pass, all allocated once at creation so that evaluating a token never allocates. It shares
// the model's weights (read-only) and uses the caller's thread pool. Not thread-safe: one
// decode loop owns a session.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "engine/model/ffn_backend.h"
#include "engine/model/layer_backend.h"
#include "engine/model/llama_model.h"
#include "engine/model/packed_weights.h"
#include "engine/model/rope.h"
#include "engine/ops/matmul.h"
#include "engine/util/huge_pages.h"
#include "engine/util/thread_pool.h"

namespace thermocline {

// Sees the FFN of every layer during a forward pass (the profiler's hook). Called on the
// evaluating thread; `x` is the FFN input before ffn_norm, `act` the gated activation
// (n_tokens rows each). OnFfn is not called for mixture-of-experts layers; OnRouting is, with
// selected: (n_tokens, k) the experts each token's router chose.
class FfnObserver {
 public:
  virtual ~FfnObserver() = default;
  virtual void OnFfn(int layer, const float* x, int64_t n_embd, const float* act, int64_t n_ff,
                     int64_t n_tokens) = 0;
  virtual void OnRouting(int layer, const int32_t* selected, int64_t k, int64_t n_tokens) {}
  // Before OnFfn: gate and up (n_tokens, n_ff each), the projections before the activation
  // (what a gate-first layer's score and threshold are calibrated on).
  virtual void OnGate(int layer, const float* gate, const float* up, int64_t n_ff,
                      int64_t n_tokens) {}
  // The inputs of the projections after their norms, (n_tokens, n_embd) each: attention's (of
  // q/k/v, after attn_norm) and the FFN's (of gate/up, after ffn_norm). What an input-sparse
  // layer's thresholds are calibrated on.
  virtual void OnAttentionInput(int layer, const float* xn, int64_t n_embd, int64_t n_tokens) {}
  virtual void OnFfnInput(int layer, const float* xn, int64_t n_embd, int64_t n_tokens) {}
};

// The element type of the KV cache. kF16: half the memory, and attention computes as ggml's F16
// products do (kernels.h's AttendHeadF16), as llama.cpp's default cache; what the engine serves
// (EngineOptions). kF32: full precision, the reference the other paths are checked against.
enum class KvType { kF32, kF16 };
bool ParseKvType(const std::string& name, KvType* type);  // "f16", "f32"; false otherwise

struct SessionOptions {
  int64_t n_ctx = 0;       // KV cache length; 0: the model's training context
  int64_t max_batch = 64;  // tokens evaluated per forward pass during prefill
  KvType kv_type = KvType::kF32;
};

// Bytes of the KV cache of one session of n_ctx positions.
uint64_t KvCacheBytes(const LlamaHparams& h, int64_t n_ctx, KvType type);

class Session {
 public:
  static absl::StatusOr<std::unique_ptr<Session>> Create(const LlamaModel& model, ThreadPool* pool,
                                                         const SessionOptions& options = {});

  // Evaluates tokens at positions n_past() .. n_past() + size - 1, in chunks of max_batch.
  // logits() then holds the last token's logits. When all_logits is given it receives
  // tokens.size() rows of n_vocab logits, one per token.
  absl::Status Eval(absl::Span<const int32_t> tokens, float* all_logits = nullptr);
  // Evaluates tokens as Eval does, but instead of the output head writes each token's final
  // hidden state, after the output norm: hidden: (tokens.size(), n_embd). logits() is left as
  // it was. What embeddings are pooled from (engine/runtime/embed.h).
  absl::Status EvalHidden(absl::Span<const int32_t> tokens, float* hidden);

  const float* logits() const { return logits_.data(); }
  float* mutable_logits() { return logits_.data(); }
  int64_t n_past() const { return n_past_; }
  int64_t n_ctx() const { return n_ctx_; }
  const LlamaModel& model() const { return model_; }
  // Forgets the sequence (positions >= n) so decoding continues from position n.
  void Truncate(int64_t n) { n_past_ = n < n_past_ ? n : n_past_; }
  void Reset() { n_past_ = 0; }
  void set_ffn_observer(FfnObserver* observer) { observer_ = observer; }
  // nullptr: the dense FFN. The backend must outlive its use by this session.
  void set_ffn_backend(FfnBackend* backend) { ffn_backend_ = backend; }
  FfnBackend* ffn_backend() const { return ffn_backend_; }
  // nullptr: every layer on the CPU. Otherwise the layers the backend owns run there (with their
  // KV cache; the observer does not see them) and the rest here. The backend must outlive its
  // use by this session and be built for its n_ctx and max_batch.
  void set_layer_backend(LayerBackend* backend) { layer_backend_ = backend; }
  // The dense path reads the re-laid copies of `packed` where it has them (nullptr: the model's
  // views). They must outlive their use by this session.
  void set_packed_weights(const PackedWeights* packed);
  LayerBackend* layer_backend() const { return layer_backend_; }
  int64_t max_batch() const { return max_batch_; }
  KvType kv_type() const { return kv_type_; }
  // The dense FFN of `layer` (the reference every backend is compared to):
  // out: (n_tokens, n_embd) from xn: (n_tokens, n_embd) after ffn_norm, x before it. In a
  // mixture-of-experts layer: the routed experts (and the shared one), each token computing
  // only the experts its router selects.
  void DenseFfn(int layer, const float* x, const float* xn, int64_t n_tokens, float* out);

 private:
  Session(const LlamaModel& model, ThreadPool* pool, int64_t n_ctx, int64_t max_batch,
          KvType kv_type);
  // The checks and the chunking of Eval and EvalHidden.
  absl::Status EvalChunks(absl::Span<const int32_t> tokens, float* all_logits, float* hidden);
  // hidden: when given, the normed final states instead of any logits.
  absl::Status Forward(const int32_t* tokens, int64_t n, float* all_logits, float* hidden);
  void CpuLayer(int layer, int64_t n);
  void Attention(int layer, int64_t n);
  // out: (n, n_embd) = the experts of `layer` on xn, weighted by the router.
  void MoeFfn(int layer, const float* xn, int64_t n, float* out);

  const LlamaModel& model_;
  ThreadPool* pool_;
  const int64_t n_ctx_;
  const int64_t max_batch_;
  const KvType kv_type_;
  int64_t n_past_ = 0;
  // The matrices the dense path reads: the model's views, or their re-laid copies.
  struct DenseViews {
    const WeightView* wq;
    const WeightView* wk;
    const WeightView* wv;
    const WeightView* wo;
    const WeightView* gate;
    const WeightView* up;
    const WeightView* down;
  };
  std::vector<DenseViews> dense_;  // (n_layer)
  const WeightView* output_ = nullptr;
  FfnObserver* observer_ = nullptr;
  FfnBackend* ffn_backend_ = nullptr;
  LayerBackend* layer_backend_ = nullptr;

  // F32: (n_layer, n_ctx, kv_dim); F16: (n_layer, n_ctx / T, n_head_kv, T, head_dim), each
  // head's rows of a tile of T = 2^kv_tile_shift_ positions together (64 KB of them: session.cc's
  // KvTileShift), n_ctx rounded up to a whole tile. Uninitialized: a position is written before
  // attention reads it, so the pages of positions never reached are never touched (Llama 2 7B at
  // 4096 positions: 2 GiB each, which used to be zeroed when the session was made). On huge pages:
  // a decode step writes a row in every layer, and on 4 KB pages that was a page fault in the
  // token's path every few rows (11 per token on the 1.1B synthetic model, ≈ 33 µs each on our VM;
  // generate decoded 5% faster without them). The cost: RSS grows 2 MB per layer at a time.
  // Of kv_type_: the float pair or the half pair; the other stays empty.
  std::vector<float, HugePageAllocator<float>> k_cache_;
  std::vector<float, HugePageAllocator<float>> v_cache_;
  std::vector<uint16_t, HugePageAllocator<uint16_t>> k_cache_f16_;
  std::vector<uint16_t, HugePageAllocator<uint16_t>> v_cache_f16_;
  int kv_tile_shift_ = 0;
  RopeTable rope_table_;
  RopeTable rope_table_swa_;  // sliding layers' own RoPE (Gemma 3), when has_swa_rope_
  bool has_swa_rope_ = false;
  std::vector<float> rope_;      // (max_batch, rope_dim): cos, sin pairs per token
  std::vector<float> rope_swa_;  // (max_batch, rope_dim) of rope_table_swa_, or empty
  std::vector<float> x_;         // (max_batch, n_embd) residual stream
  std::vector<float> xb_;        // (max_batch, n_embd)
  std::vector<float> q_;         // (max_batch, q_dim)
  std::vector<float> k_;         // (max_batch, kv_dim)
  std::vector<float> v_;         // (max_batch, v_dim)
  std::vector<float> att_out_;   // (max_batch, o_dim)
  std::vector<float> ffn_out_;   // (max_batch, n_embd)
  std::vector<float> scores_;    // (threads, heads per attention item, n_ctx)
  std::vector<float> gate_;      // (max_batch, widest FFN: n_ff, n_ff_exp, n_ff_shexp)
  std::vector<float> up_;        // (max_batch, widest FFN)
  // Mixture of experts (empty otherwise).
  std::vector<float> router_;  // (max_batch, n_expert): router probabilities
  std::vector<int32_t> sel_;   // (max_batch, n_expert_used): each token's experts
  std::vector<float> sel_w_;   // (max_batch, n_expert_used): their weights
  std::vector<int32_t> tok_;   // (max_batch): the tokens routed to one expert
  std::vector<float> tok_w_;   // (max_batch): their weights for it
  std::vector<float> xg_;      // (max_batch, n_embd): those tokens' inputs, gathered
  std::vector<float> eo_;      // (max_batch, n_embd): an expert's outputs
  std::vector<float> logits_;  // (n_vocab)
  MatMulScratch scratch_;
};

}  // namespace thermocline
