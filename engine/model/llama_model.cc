#include "engine/model/llama_model.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "engine/ops/kernels.h"
#include "engine/ops/type_table.h"
#include "engine/ops/weight_layout.h"
#include "engine/util/thread_pool.h"

namespace thermocline {
namespace {

std::string ShapeString(const std::vector<int64_t>& dims) {
  return absl::StrCat("{", absl::StrJoin(dims, ", "), "}");
}

// A 2-D weight matrix with GGUF dims {cols, rows} in a type we can compute with.
absl::StatusOr<WeightView> Matrix(const GgufFile& file, const std::string& name, int64_t rows,
                                  int64_t cols) {
  const GgufTensorInfo* t = file.FindTensor(name);
  if (t == nullptr) return absl::InvalidArgumentError(absl::StrCat("tensor ", name, " is missing"));
  if (t->dims.size() != 2 || t->dims[0] != cols || t->dims[1] != rows) {
    return absl::InvalidArgumentError(absl::StrCat("tensor ", name, " has shape ",
                                                   ShapeString(t->dims), ", expected {", cols, ", ",
                                                   rows, "}"));
  }
  if (FindWeightType(t->type) == nullptr) {
    return absl::UnimplementedError(absl::StrCat(
        "tensor ", name, " has type ", TypeName(t->type),
        ", which Thermocline cannot compute yet (supported: ", WeightTypeNames(),
        "); requantize the model to one of those, e.g. thermocline quantize IN OUT --type q4_k_m"));
  }
  WeightView w;
  w.type = t->type;
  w.rows = rows;
  w.cols = cols;
  w.data = t->data;
  w.row_bytes = RowBytes(t->type, cols);
  return w;
}

// A 1-D vector (norm weights), converted to float.
absl::StatusOr<std::vector<float>> Vector(const GgufFile& file, const std::string& name,
                                          int64_t n) {
  const GgufTensorInfo* t = file.FindTensor(name);
  if (t == nullptr) return absl::InvalidArgumentError(absl::StrCat("tensor ", name, " is missing"));
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

// A PowerInfer predictor: blk.N.fc1 {n_embd, rank} and blk.N.fc2 {rank, n_ff}, or neither.
absl::Status BindPredictor(const GgufFile& f, const std::string& b, const LlamaHparams& h,
                           LayerWeights* L) {
  const GgufTensorInfo* fc1 = f.FindTensor(b + "fc1.weight");
  const GgufTensorInfo* fc2 = f.FindTensor(b + "fc2.weight");
  if (fc1 == nullptr && fc2 == nullptr) return absl::OkStatus();
  if (fc1 == nullptr || fc2 == nullptr || fc1->dims.size() != 2) {
    return absl::InvalidArgumentError(
        absl::StrCat(b, "fc1/fc2: a predictor needs both, fc1 of shape {n_embd, rank}"));
  }
  const int64_t rank = fc1->dims[1];
  auto m1 = Matrix(f, b + "fc1.weight", rank, h.n_embd);
  if (!m1.ok()) return m1.status();
  auto m2 = Matrix(f, b + "fc2.weight", h.n_ff, rank);
  if (!m2.ok()) return m2.status();
  L->pred_fc1 = *m1;
  L->pred_fc2 = *m2;
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
  auto hp = LlamaHparams::FromGguf(*model->file_, options.activation);
  if (!hp.ok()) return hp.status();
  model->hparams_ = *hp;
  auto tok = Tokenizer::FromGguf(*model->file_);
  if (!tok.ok()) return tok.status();
  model->tokenizer_ = std::move(*tok);
  if (model->tokenizer_->vocab_size() != model->hparams_.n_vocab) {
    return absl::InvalidArgumentError(
        absl::StrCat("tokenizer has ", model->tokenizer_->vocab_size(),
                     " tokens but token_embd.weight has ", model->hparams_.n_vocab, " rows"));
  }
  if (absl::Status s = model->Bind(); !s.ok()) {
    return absl::Status(s.code(), absl::StrCat(model->file_->path(), ": ", s.message()));
  }
  return model;
}

absl::Status LlamaModel::Bind() {
  const GgufFile& f = *file_;
  const LlamaHparams& h = hparams_;
  auto embd = Matrix(f, "token_embd.weight", h.n_vocab, h.n_embd);
  if (!embd.ok()) return embd.status();
  token_embd_ = *embd;
  if (f.FindTensor("output.weight") != nullptr) {
    auto out = Matrix(f, "output.weight", h.n_vocab, h.n_embd);
    if (!out.ok()) return out.status();
    output_ = *out;
  } else {
    output_ = token_embd_;  // tied
  }
  auto onorm = Vector(f, "output_norm.weight", h.n_embd);
  if (!onorm.ok()) return onorm.status();
  output_norm_ = std::move(*onorm);
  weight_bytes_ = output_.row_bytes * output_.rows;

  layers_.resize(h.n_layer);
  int64_t layers_with_predictors = 0;
  std::unique_ptr<ThreadPool> transpose_pool;
  for (int64_t i = 0; i < h.n_layer; ++i) {
    const std::string b = absl::StrCat("blk.", i, ".");
    LayerWeights& L = layers_[i];
    struct MatrixSpec {
      WeightView* dst;
      const char* name;
      int64_t rows, cols;
    };
    const bool has_down = f.FindTensor(b + "ffn_down.weight") != nullptr;
    const bool has_down_t = f.FindTensor(b + "ffn_down_t.weight") != nullptr;
    const MatrixSpec specs[] = {
        {&L.wq, "attn_q.weight", h.q_dim(), h.n_embd},
        {&L.wk, "attn_k.weight", h.kv_dim(), h.n_embd},
        {&L.wv, "attn_v.weight", h.kv_dim(), h.n_embd},
        {&L.wo, "attn_output.weight", h.n_embd, h.q_dim()},
        {&L.ffn_gate, "ffn_gate.weight", h.n_ff, h.n_embd},
        {&L.ffn_up, "ffn_up.weight", h.n_ff, h.n_embd},
        {&L.ffn_down, "ffn_down.weight", h.n_embd, h.n_ff},
        {&L.ffn_down_t, "ffn_down_t.weight", h.n_ff, h.n_embd},
    };
    for (const MatrixSpec& spec : specs) {
      if ((spec.dst == &L.ffn_down && !has_down && has_down_t) ||
          (spec.dst == &L.ffn_down_t && !has_down_t)) {
        continue;
      }
      auto m = Matrix(f, b + spec.name, spec.rows, spec.cols);
      if (!m.ok()) return m.status();
      *spec.dst = *m;
      if (spec.dst != &L.ffn_down_t) weight_bytes_ += m->row_bytes * m->rows;
    }
    if (!has_down) {
      // PowerInfer keeps only down_t; the dense path needs down itself.
      if (!transpose_pool)
        transpose_pool = std::make_unique<ThreadPool>(ThreadPool::DefaultThreads());
      auto down = TransposeWeight(*transpose_pool, L.ffn_down_t);
      if (!down.ok()) return down.status();
      owned_.push_back(std::move(down->data));
      L.ffn_down = down->view;
      L.ffn_down.data = owned_.back().data();
      weight_bytes_ += L.ffn_down.row_bytes * L.ffn_down.rows;
    }
    if (absl::Status s = BindPredictor(f, b, h, &L); !s.ok()) return s;
    if (L.pred_fc1.data != nullptr) ++layers_with_predictors;
    auto an = Vector(f, b + "attn_norm.weight", h.n_embd);
    if (!an.ok()) return an.status();
    L.attn_norm = std::move(*an);
    auto fn = Vector(f, b + "ffn_norm.weight", h.n_embd);
    if (!fn.ok()) return fn.status();
    L.ffn_norm = std::move(*fn);
  }
  if (layers_with_predictors != 0 && layers_with_predictors != h.n_layer) {
    return absl::InvalidArgumentError(absl::StrCat("predictors (blk.N.fc1/fc2) in ",
                                                   layers_with_predictors, " of ", h.n_layer,
                                                   " layers; a PowerInfer file has them in all"));
  }
  carries_predictors_ = layers_with_predictors == h.n_layer;
  auto thr = f.GetFloat("powerinfer.sparse_threshold", 0.0f);
  if (!thr.ok()) return thr.status();
  sparse_threshold_ = static_cast<float>(*thr);
  return absl::OkStatus();
}

void LlamaModel::Embed(int32_t token, float* out) const {
  KernelsFor(token_embd_.type)->to_float(token_embd_.row(token), out, hparams_.n_embd);
}

}  // namespace thermocline
