// Loading: hyperparameters, tokenizer, and the binding of every tensor the family's row
// (architecture.h) names to a view; a tensor of the file that nothing binds is an error, so a
// variant the description does not cover is refused rather than run without that tensor.
#include "engine/model/llama_model.h"

#include <algorithm>
#include <cmath>
#include <unordered_set>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/ops/kernels.h"
#include "engine/ops/type_table.h"
#include "engine/ops/weight_layout.h"
#include "engine/util/status_macros.h"
#include "engine/util/thread_pool.h"

namespace thermocline {
namespace {

std::string ShapeString(const std::vector<int64_t>& dims) {
  return absl::StrCat("{", absl::StrJoin(dims, ", "), "}");
}

// Looks tensors up by name and remembers which were used.
class Tensors {
 public:
  explicit Tensors(const GgufFile& f) : f_(f) {}
  const GgufFile& file() const { return f_; }
  const GgufTensorInfo* Find(const std::string& name) {
    const GgufTensorInfo* t = f_.FindTensor(name);
    if (t != nullptr) used_.insert(name);
    return t;
  }
  bool Has(const std::string& name) const { return f_.FindTensor(name) != nullptr; }
  // Names of the file's tensors no Find asked for.
  std::vector<std::string> Unused() const {
    std::vector<std::string> out;
    for (const GgufTensorInfo& t : f_.tensors()) {
      if (!used_.count(t.name)) out.push_back(t.name);
    }
    return out;
  }

 private:
  const GgufFile& f_;
  std::unordered_set<std::string> used_;
};

absl::Status Missing(const std::string& name) {
  return absl::InvalidArgumentError(absl::StrCat("tensor ", name, " is missing"));
}

absl::Status CheckComputable(const GgufTensorInfo& t) {
  if (FindWeightType(t.type) != nullptr) return absl::OkStatus();
  return absl::UnimplementedError(absl::StrCat(
      "tensor ", t.name, " has type ", TypeName(t.type),
      ", which Thermocline cannot compute yet (supported: ", WeightTypeNames(),
      "); requantize the model to one of those, e.g. thermocline quantize IN OUT --type q4_k_m"));
}

// A weight with GGUF dims {cols, rows, experts} (experts = 0: a 2-D matrix) as one view of all
// its rows.
absl::StatusOr<WeightView> Rows(Tensors& ts, const std::string& name, int64_t rows, int64_t cols,
                                int64_t experts = 0) {
  const GgufTensorInfo* t = ts.Find(name);
  if (t == nullptr) return Missing(name);
  const bool ok = experts == 0 ? t->dims.size() == 2 && t->dims[0] == cols && t->dims[1] == rows
                               : t->dims.size() == 3 && t->dims[0] == cols && t->dims[1] == rows &&
                                     t->dims[2] == experts;
  if (!ok) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor ", name, " has shape ", ShapeString(t->dims), ", expected {", cols,
                     ", ", rows, experts == 0 ? "" : absl::StrCat(", ", experts), "}"));
  }
  TC_RETURN_IF_ERROR(CheckComputable(*t));
  WeightView w;
  w.type = t->type;
  w.rows = rows * std::max<int64_t>(experts, 1);
  w.cols = cols;
  w.data = t->data;
  w.row_bytes = RowBytes(t->type, cols);
  return w;
}

// Rows [first, first + n) of w.
WeightView Slice(const WeightView& w, int64_t first, int64_t n) {
  WeightView s = w;
  s.rows = n;
  s.data = w.row(first);
  return s;
}

// A 1-D vector (norm weights, biases), converted to float; `required` false: empty if absent.
absl::StatusOr<std::vector<float>> Vector(Tensors& ts, const std::string& name, int64_t n,
                                          bool required = true) {
  const GgufTensorInfo* t = ts.Find(name);
  if (t == nullptr) {
    if (required) return Missing(name);
    return std::vector<float>();
  }
  if (t->dims.size() != 1 || t->dims[0] != n) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor ", name, " has shape ", ShapeString(t->dims), ", expected {", n, "}"));
  }
  const TypeKernels* k = FindWeightType(t->type) != nullptr ? KernelsFor(t->type) : nullptr;
  if (k == nullptr) {
    return absl::UnimplementedError(
        absl::StrCat("tensor ", name, " has unsupported type ", TypeName(t->type)));
  }
  std::vector<float> out(n);
  k->to_float(t->data, out.data(), n);
  return out;
}

// An optional group of tensors as the family's row says: kNever leaves them unbound (an
// existing one is then reported as unused), kRequired needs each.
absl::Status OptionalVector(Tensors& ts, Presence p, const std::string& name, int64_t n,
                            std::vector<float>* out) {
  if (p == Presence::kNever) return absl::OkStatus();
  auto v = Vector(ts, name, n, p == Presence::kRequired);
  if (!v.ok()) return v.status();
  *out = std::move(*v);
  return absl::OkStatus();
}

// A PowerInfer predictor: blk.N.fc1 {n_embd, rank} and blk.N.fc2 {rank, n_ff}, or neither.
absl::Status BindPredictor(Tensors& ts, const std::string& b, const LlamaHparams& h,
                           LayerWeights* L) {
  if (!ts.Has(b + "fc1.weight") && !ts.Has(b + "fc2.weight")) return absl::OkStatus();
  const GgufTensorInfo* fc1 = ts.Find(b + "fc1.weight");
  if (fc1 == nullptr || !ts.Has(b + "fc2.weight") || fc1->dims.size() != 2) {
    return absl::InvalidArgumentError(
        absl::StrCat(b, "fc1/fc2: a predictor needs both, fc1 of shape {n_embd, rank}"));
  }
  const int64_t rank = fc1->dims[1];
  auto m1 = Rows(ts, b + "fc1.weight", rank, h.n_embd);
  if (!m1.ok()) return m1.status();
  auto m2 = Rows(ts, b + "fc2.weight", h.n_ff, rank);
  if (!m2.ok()) return m2.status();
  L->pred_fc1 = *m1;
  L->pred_fc2 = *m2;
  return absl::OkStatus();
}

uint64_t Bytes(const WeightView& w) { return static_cast<uint64_t>(w.rows) * w.row_bytes; }

// Q, K and V: attn_q/k/v, or row ranges of a fused attn_qkv, and their biases.
absl::Status BindAttention(Tensors& ts, const ArchitectureSpec& a, const std::string& b,
                           const LlamaHparams& h, LayerWeights& L) {
  const bool fused = a.fused_qkv == Presence::kRequired ||
                     (a.fused_qkv == Presence::kOptional && ts.Has(b + "attn_qkv.weight"));
  if (fused) {
    auto qkv = Rows(ts, b + "attn_qkv.weight", h.q_dim() + h.kv_dim() + h.v_dim(), h.n_embd);
    if (!qkv.ok()) return qkv.status();
    L.wq = Slice(*qkv, 0, h.q_dim());
    L.wk = Slice(*qkv, h.q_dim(), h.kv_dim());
    L.wv = Slice(*qkv, h.q_dim() + h.kv_dim(), h.v_dim());
  } else {
    const std::pair<WeightView*, const char*> qkv[] = {
        {&L.wq, "attn_q.weight"}, {&L.wk, "attn_k.weight"}, {&L.wv, "attn_v.weight"}};
    const int64_t rows[] = {h.q_dim(), h.kv_dim(), h.v_dim()};
    for (int i = 0; i < 3; ++i) {
      auto m = Rows(ts, b + qkv[i].second, rows[i], h.n_embd);
      if (!m.ok()) return m.status();
      *qkv[i].first = *m;
    }
  }
  TC_RETURN_IF_ERROR(OptionalVector(ts, a.qkv_bias, b + "attn_q.bias", h.q_dim(), &L.bq));
  TC_RETURN_IF_ERROR(OptionalVector(ts, a.qkv_bias, b + "attn_k.bias", h.kv_dim(), &L.bk));
  TC_RETURN_IF_ERROR(OptionalVector(ts, a.qkv_bias, b + "attn_v.bias", h.v_dim(), &L.bv));
  auto wo = Rows(ts, b + "attn_output.weight", h.n_embd, h.o_dim());
  if (!wo.ok()) return wo.status();
  L.wo = *wo;
  TC_RETURN_IF_ERROR(OptionalVector(ts, a.output_bias, b + "attn_output.bias", h.n_embd, &L.bo));
  TC_RETURN_IF_ERROR(
      OptionalVector(ts, a.qk_norm, b + "attn_q_norm.weight", h.head_dim, &L.q_norm));
  TC_RETURN_IF_ERROR(
      OptionalVector(ts, a.qk_norm, b + "attn_k_norm.weight", h.head_dim, &L.k_norm));
  return absl::OkStatus();
}

// The router, the experts as one view each, and the shared expert.
absl::Status BindExperts(Tensors& ts, const ArchitectureSpec& a, const std::string& b,
                         const LlamaHparams& h, LayerWeights& L) {
  auto router = Rows(ts, b + "ffn_gate_inp.weight", h.n_expert, h.n_embd);
  if (!router.ok()) return router.status();
  L.ffn_gate_inp = *router;
  auto gate = Rows(ts, b + "ffn_gate_exps.weight", h.n_ff_exp, h.n_embd, h.n_expert);
  if (!gate.ok()) return gate.status();
  auto up = Rows(ts, b + "ffn_up_exps.weight", h.n_ff_exp, h.n_embd, h.n_expert);
  if (!up.ok()) return up.status();
  auto down = Rows(ts, b + "ffn_down_exps.weight", h.n_embd, h.n_ff_exp, h.n_expert);
  if (!down.ok()) return down.status();
  for (int64_t e = 0; e < h.n_expert; ++e) {
    L.expert_gate.push_back(Slice(*gate, e * h.n_ff_exp, h.n_ff_exp));
    L.expert_up.push_back(Slice(*up, e * h.n_ff_exp, h.n_ff_exp));
    L.expert_down.push_back(Slice(*down, e * h.n_embd, h.n_embd));
  }
  if (!a.shared_expert) return absl::OkStatus();
  const std::pair<WeightView*, const char*> shexp[] = {{&L.shexp_gate, "ffn_gate_shexp.weight"},
                                                       {&L.shexp_up, "ffn_up_shexp.weight"}};
  for (const auto& [dst, name] : shexp) {
    auto m = Rows(ts, b + name, h.n_ff_shexp, h.n_embd);
    if (!m.ok()) return m.status();
    *dst = *m;
  }
  auto sdown = Rows(ts, b + "ffn_down_shexp.weight", h.n_embd, h.n_ff_shexp);
  if (!sdown.ok()) return sdown.status();
  L.shexp_down = *sdown;
  auto sgate = Vector(ts, b + "ffn_gate_inp_shexp.weight", h.n_embd);
  if (!sgate.ok()) return sgate.status();
  L.shexp_gate_inp = std::move(*sgate);
  return absl::OkStatus();
}

// gate/up/down of a dense FFN (ffn_up holding both where the family fuses them), or PowerInfer's
// ffn_down_t in place of ffn_down. Sets *needs_down when only down_t is there.
absl::Status BindDenseFfn(Tensors& ts, const ArchitectureSpec& a, const std::string& b,
                          const LlamaHparams& h, LayerWeights& L, bool* needs_down) {
  if (a.fused_gate_up) {
    auto up = Rows(ts, b + "ffn_up.weight", 2 * h.n_ff, h.n_embd);
    if (!up.ok()) return up.status();
    L.ffn_gate = Slice(*up, 0, h.n_ff);
    L.ffn_up = Slice(*up, h.n_ff, h.n_ff);
  } else {
    for (const auto& [dst, name] :
         {std::pair{&L.ffn_gate, "ffn_gate.weight"}, std::pair{&L.ffn_up, "ffn_up.weight"}}) {
      auto m = Rows(ts, b + name, h.n_ff, h.n_embd);
      if (!m.ok()) return m.status();
      *dst = *m;
    }
  }
  const bool has_down_t = a.activation_configurable && ts.Has(b + "ffn_down_t.weight");
  if (has_down_t) {
    auto t = Rows(ts, b + "ffn_down_t.weight", h.n_ff, h.n_embd);
    if (!t.ok()) return t.status();
    L.ffn_down_t = *t;
  }
  *needs_down = has_down_t && !ts.Has(b + "ffn_down.weight");
  if (!*needs_down) {
    auto down = Rows(ts, b + "ffn_down.weight", h.n_embd, h.n_ff);
    if (!down.ok()) return down.status();
    L.ffn_down = *down;
  }
  if (a.activation_configurable) return BindPredictor(ts, b, h, &L);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<LlamaModel>> LlamaModel::Load(const std::string& path,
                                                             const ModelOptions& options) {
  auto file = GgufFile::Open(path);
  if (!file.ok()) return file.status();
  return FromGguf(std::move(*file), options);
}

absl::StatusOr<std::unique_ptr<LlamaModel>> LlamaModel::FromGguf(std::unique_ptr<GgufFile> file,
                                                                 const ModelOptions& options) {
  std::unique_ptr<LlamaModel> model(new LlamaModel());
  model->file_ = std::move(file);
  const GgufFile& f = *model->file_;
  auto hp = LlamaHparams::FromGguf(f, options.activation);
  if (!hp.ok()) return hp.status();
  model->hparams_ = *hp;
  if (absl::Status s = Tokenizer::CheckSupported(f, &model->warnings_); !s.ok()) return s;
  auto tok = Tokenizer::FromGguf(f);
  if (!tok.ok()) return tok.status();
  model->tokenizer_ = std::move(*tok);
  if (model->tokenizer_->vocab_size() != model->hparams_.n_vocab) {
    return absl::InvalidArgumentError(
        absl::StrCat("tokenizer has ", model->tokenizer_->vocab_size(),
                     " tokens but token_embd.weight has ", model->hparams_.n_vocab, " rows"));
  }
  if (absl::Status s = model->Bind(f, /*check_only=*/false); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat(f.path(), ": ", s.message()));
  }
  return model;
}

absl::StatusOr<ModelSupport> LlamaModel::CheckSupported(const GgufFile& file,
                                                        const ModelOptions& options) {
  LlamaModel model;
  auto hp = LlamaHparams::FromGguf(file, options.activation);
  if (!hp.ok()) return hp.status();
  model.hparams_ = *hp;
  ModelSupport support;
  support.architecture = std::string(hp->arch->name);
  TC_RETURN_IF_ERROR(Tokenizer::CheckSupported(file, &support.warnings));
  const GgufValue* tokens = file.Find("tokenizer.ggml.tokens");
  if (tokens == nullptr || tokens->AsStringArray() == nullptr) {
    return absl::InvalidArgumentError("tokenizer.ggml.tokens is missing or not a string array");
  }
  if (static_cast<int64_t>(tokens->array_size()) != hp->n_vocab) {
    return absl::InvalidArgumentError(absl::StrCat("tokenizer has ", tokens->array_size(),
                                                   " tokens but token_embd.weight has ",
                                                   hp->n_vocab, " rows"));
  }
  TC_RETURN_IF_ERROR(model.Bind(file, /*check_only=*/true));
  return support;
}

absl::Status LlamaModel::Bind(const GgufFile& f, bool check_only) {
  const LlamaHparams& h = hparams_;
  const ArchitectureSpec& a = *h.arch;
  Tensors ts(f);
  auto embd = Rows(ts, "token_embd.weight", h.n_vocab, h.n_embd);
  if (!embd.ok()) return embd.status();
  token_embd_ = *embd;
  if (ts.Has("output.weight")) {
    auto out = Rows(ts, "output.weight", h.n_vocab, h.n_embd);
    if (!out.ok()) return out.status();
    output_ = *out;
  } else {
    output_ = token_embd_;  // tied
  }
  auto onorm = Vector(ts, "output_norm.weight", h.n_embd);
  if (!onorm.ok()) return onorm.status();
  output_norm_ = std::move(*onorm);
  weight_bytes_ = Bytes(output_);
  const int64_t pairs = h.rope_dim / 2;
  if (a.rope_freqs) {
    auto freqs = Vector(ts, "rope_freqs.weight", pairs, /*required=*/false);
    if (!freqs.ok()) return freqs.status();
    rope_freqs_ = std::move(*freqs);
  }
  if (h.rope_scaling == RopeScaling::kLongRope) {
    auto lng = Vector(ts, "rope_factors_long.weight", pairs);
    if (!lng.ok()) return lng.status();
    auto sht = Vector(ts, "rope_factors_short.weight", pairs);
    if (!sht.ok()) return sht.status();
    rope_long_ = std::move(*lng);
    rope_short_ = std::move(*sht);
  }
  for (const std::vector<float>* factors : {&rope_freqs_, &rope_long_, &rope_short_}) {
    for (float x : *factors) {
      if (!(x > 0) || !std::isfinite(x)) {
        return absl::InvalidArgumentError("RoPE frequency factors must be positive and finite");
      }
    }
  }

  layers_.assign(h.n_layer, LayerWeights());
  int64_t layers_with_predictors = 0;
  std::unique_ptr<ThreadPool> transpose_pool;
  for (int64_t i = 0; i < h.n_layer; ++i) {
    const std::string b = absl::StrCat("blk.", i, ".");
    LayerWeights& L = layers_[i];
    auto an = Vector(ts, b + "attn_norm.weight", h.n_embd);
    if (!an.ok()) return an.status();
    L.attn_norm = std::move(*an);
    TC_RETURN_IF_ERROR(BindAttention(ts, a, b, h, L));
    auto fn = Vector(ts, b + "ffn_norm.weight", h.n_embd);
    if (!fn.ok()) return fn.status();
    L.ffn_norm = std::move(*fn);
    if (a.post_norms) {
      auto pa = Vector(ts, b + "post_attention_norm.weight", h.n_embd);
      if (!pa.ok()) return pa.status();
      L.post_attn_norm = std::move(*pa);
      auto pf = Vector(ts, b + "post_ffw_norm.weight", h.n_embd);
      if (!pf.ok()) return pf.status();
      L.post_ffn_norm = std::move(*pf);
    }
    for (const WeightView* w : {&L.wq, &L.wk, &L.wv, &L.wo}) weight_bytes_ += Bytes(*w);

    if (h.is_moe()) {
      TC_RETURN_IF_ERROR(BindExperts(ts, a, b, h, L));
      // A decode step reads the router, n_expert_used experts and the shared expert.
      weight_bytes_ += Bytes(L.ffn_gate_inp);
      weight_bytes_ += h.n_expert_used *
                       (Bytes(L.expert_gate[0]) + Bytes(L.expert_up[0]) + Bytes(L.expert_down[0]));
      for (const WeightView* w : {&L.shexp_gate, &L.shexp_up, &L.shexp_down}) {
        weight_bytes_ += Bytes(*w);
      }
      continue;
    }
    bool needs_down = false;
    TC_RETURN_IF_ERROR(BindDenseFfn(ts, a, b, h, L, &needs_down));
    if (needs_down && !check_only) {
      // PowerInfer keeps only down_t; the dense path needs down itself.
      if (!transpose_pool)
        transpose_pool = std::make_unique<ThreadPool>(ThreadPool::DefaultThreads());
      auto down = TransposeWeight(*transpose_pool, L.ffn_down_t);
      if (!down.ok()) return down.status();
      owned_.push_back(std::move(down->data));
      L.ffn_down = down->view;
      L.ffn_down.data = owned_.back().data();
    }
    weight_bytes_ +=
        Bytes(L.ffn_gate) + Bytes(L.ffn_up) + Bytes(needs_down ? L.ffn_down_t : L.ffn_down);
    if (L.pred_fc1.data != nullptr) ++layers_with_predictors;
  }
  if (layers_with_predictors != 0 && layers_with_predictors != h.n_layer) {
    return absl::InvalidArgumentError(absl::StrCat("predictors (blk.N.fc1/fc2) in ",
                                                   layers_with_predictors, " of ", h.n_layer,
                                                   " layers; a PowerInfer file has them in all"));
  }
  const std::vector<std::string> unused = ts.Unused();
  if (!unused.empty()) {
    const size_t shown = std::min<size_t>(unused.size(), 4);
    return absl::InvalidArgumentError(absl::StrCat(
        unused.size(), " tensor(s) that a '", a.name,
        "' model does not have: ", absl::StrJoin(unused.begin(), unused.begin() + shown, ", "),
        unused.size() > shown ? ", ..." : "",
        "; the file is a variant of the architecture that Thermocline does not support"));
  }
  carries_predictors_ = layers_with_predictors == h.n_layer;
  auto thr = f.GetFloat("powerinfer.sparse_threshold", 0.0f);
  if (!thr.ok()) return thr.status();
  sparse_threshold_ = static_cast<float>(*thr);
  return absl::OkStatus();
}

absl::Span<const float> LlamaModel::rope_factors(int64_t n_ctx) const {
  if (!rope_long_.empty()) return n_ctx > hparams_.rope_orig_ctx ? rope_long_ : rope_short_;
  return rope_freqs_;
}

void LlamaModel::Embed(int32_t token, float* out) const {
  KernelsFor(token_embd_.type)->to_float(token_embd_.row(token), out, hparams_.n_embd);
  if (hparams_.embd_scale != 1.0f) {
    for (int64_t i = 0; i < hparams_.n_embd; ++i) out[i] *= hparams_.embd_scale;
  }
}

}  // namespace thermocline
