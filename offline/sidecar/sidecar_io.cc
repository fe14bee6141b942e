// Sidecar GGUF writing and reading. Key and tensor names are documented in docs/offline.md.
#include <cmath>
#include <cstring>
#include <functional>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "engine/ops/kernels.h"
#include "offline/sidecar/sidecar.h"

namespace thermocline::offline {
namespace {

const std::string kPrefix = "thermocline.";

std::string Key(const std::string& name) { return kPrefix + name; }
std::string TensorName(int64_t layer, const std::string& what) {
  return absl::StrCat("blk.", layer, ".", what);
}

template <class T, class F>
GgufValue Floats(const std::vector<T>& items, F get) {
  std::vector<double> v;
  for (const T& it : items) v.push_back(get(it));
  return GgufValue::FloatArray(GgufValueType::kFloat32, std::move(v));
}
template <class T, class F>
GgufValue Uints(const std::vector<T>& items, F get, GgufValueType type) {
  std::vector<uint64_t> v;
  for (const T& it : items) v.push_back(get(it));
  return GgufValue::UintArray(type, std::move(v));
}

template <class T>
std::vector<uint8_t> Bytes(const std::vector<T>& v) {
  std::vector<uint8_t> out(v.size() * sizeof(T));
  if (!out.empty()) std::memcpy(out.data(), v.data(), out.size());
  return out;
}
std::vector<uint8_t> HalfBytes(const std::vector<float>& v) {
  std::vector<uint16_t> h(v.size());
  for (size_t i = 0; i < v.size(); ++i) h[i] = FloatToHalf(v[i]);
  return Bytes(h);
}

absl::Status Corrupt(const std::string& path, absl::string_view what) {
  return absl::DataLossError(absl::StrCat("sidecar '", path, "': ", what,
                                          "; the file is damaged: make it again with "
                                          "`thermocline profile`"));
}

// Reads a tensor of `type` with exactly `dims` into floats (F32/F16) or int32 (I32).
absl::Status ReadTensor(const GgufFile& f, const std::string& name, GgmlType type,
                        const std::vector<int64_t>& dims, std::vector<float>* floats,
                        std::vector<int32_t>* ints) {
  const GgufTensorInfo* t = f.FindTensor(name);
  if (t == nullptr) return Corrupt(f.path(), absl::StrCat("tensor ", name, " is missing"));
  if (t->type != type || t->dims != dims) {
    return Corrupt(f.path(), absl::StrCat("tensor ", name, " has the wrong type or shape"));
  }
  const size_t n = static_cast<size_t>(t->n_elements);
  if (type == GgmlType::kI32) {
    ints->resize(n);
    std::memcpy(ints->data(), t->data, n * 4);
  } else if (type == GgmlType::kF16) {
    floats->resize(n);
    for (size_t i = 0; i < n; ++i) {
      uint16_t h;
      std::memcpy(&h, t->data + 2 * i, 2);
      (*floats)[i] = HalfToFloat(h);
    }
  } else {
    floats->resize(n);
    std::memcpy(floats->data(), t->data, n * 4);
  }
  return absl::OkStatus();
}

// A per-layer array key of exactly n_layer numbers.
absl::StatusOr<std::vector<double>> LayerArray(const GgufFile& f, const std::string& name,
                                               int64_t n_layer) {
  const GgufValue* v = f.Find(Key(name));
  std::vector<double> out;
  if (v != nullptr && v->AsDoubleArray() != nullptr) {
    out = *v->AsDoubleArray();
  } else if (v != nullptr && v->AsUintArray() != nullptr) {
    for (uint64_t x : *v->AsUintArray()) out.push_back(static_cast<double>(x));
  } else if (v != nullptr && v->AsIntArray() != nullptr) {
    for (int64_t x : *v->AsIntArray()) out.push_back(static_cast<double>(x));
  } else {
    return Corrupt(f.path(), absl::StrCat("key ", Key(name), " is missing or not an array"));
  }
  if (static_cast<int64_t>(out.size()) != n_layer) {
    return Corrupt(f.path(), absl::StrCat("key ", Key(name), " has ", out.size(), " entries for ",
                                          n_layer, " layers"));
  }
  return out;
}

}  // namespace

absl::Status WriteSidecar(const Sidecar& s, const std::string& path) {
  GgufWriter w;
  w.SetString("general.architecture", "thermocline-sidecar");
  w.SetString("general.name", absl::StrCat(s.model_name, " (Thermocline sidecar)"));
  w.SetUint32(Key("format_version"), s.format_version);
  w.SetString(Key("model.identity"), s.model_identity);
  w.SetString(Key("model.name"), s.model_name);
  w.SetUint32(Key("model.n_layer"), static_cast<uint32_t>(s.n_layer));
  w.SetUint32(Key("model.n_embd"), static_cast<uint32_t>(s.n_embd));
  w.SetUint32(Key("model.n_ff"), static_cast<uint32_t>(s.n_ff));
  w.SetString(Key("model.activation"), s.activation);
  if (s.n_expert > 0) {
    w.SetUint32(Key("experts.count"), static_cast<uint32_t>(s.n_expert));
    w.SetUint32(Key("experts.used_count"), static_cast<uint32_t>(s.n_expert_used));
  }
  w.SetString(Key("profile.source"), s.corpus_kind);
  w.SetString(Key("profile.corpus_hash"), s.corpus_hash);
  w.SetUint64(Key("profile.tokens"), static_cast<uint64_t>(s.tokens));
  w.SetFloat32(Key("profile.target_sparsity"), static_cast<float>(s.target_sparsity));
  w.Set(Key("profile.sparsity"), Floats(s.layers, [](auto& l) { return l.sparsity; }));
  w.Set(Key("profile.skew80"), Floats(s.layers, [](auto& l) { return l.skew80; }));
  w.Set(Key("profile.magnitude_threshold"),
        Floats(s.layers, [](auto& l) { return l.magnitude_threshold; }));
  w.SetString(Key("predictor.input"), "ffn_norm");
  w.SetFloat32(Key("predictor.target_recall"), static_cast<float>(s.target_recall));
  w.Set(Key("predictor.rank"),
        Uints(
            s.layers, [](auto& l) { return l.predictor.rank; }, GgufValueType::kUint32));
  w.Set(Key("predictor.threshold"),
        Floats(s.layers, [](auto& l) { return l.predictor.threshold; }));
  w.Set(Key("predictor.recall"), Floats(s.layers, [](auto& l) { return l.recall; }));
  w.Set(Key("predictor.precision"), Floats(s.layers, [](auto& l) { return l.precision; }));
  w.Set(Key("predictor.predicted_active"),
        Floats(s.layers, [](auto& l) { return l.predicted_active; }));
  const SidecarPlacement& p = s.placement;
  w.SetBool(Key("placement.present"), p.present);
  if (p.present) {
    w.SetString(Key("placement.objective"), p.objective);
    w.SetString(Key("placement.hardware"), p.hardware);
    w.SetUint64(Key("placement.gpu_budget_bytes"), p.gpu_budget_bytes);
    w.SetUint64(Key("placement.gpu_bytes"), p.gpu_bytes);
    w.SetUint32(Key("placement.bucket_size"), static_cast<uint32_t>(p.bucket_size));
    w.SetUint32(Key("placement.min_neurons"), static_cast<uint32_t>(p.min_neurons));
    w.SetUint32(Key("placement.context"), static_cast<uint32_t>(p.context));
    w.SetBool(Key("placement.output_gpu"), p.output_gpu);
    w.SetFloat32(Key("placement.gpu_neuron_fraction"), static_cast<float>(p.gpu_neuron_fraction));
    w.SetFloat32(Key("placement.gpu_mass_fraction"), static_cast<float>(p.gpu_mass_fraction));
    w.SetFloat32(Key("placement.tokens_per_s"), static_cast<float>(p.tokens_per_s));
    w.SetFloat32(Key("placement.tokens_per_s_time"), static_cast<float>(p.tokens_per_s_time));
    w.SetFloat32(Key("placement.tokens_per_s_frequency"),
                 static_cast<float>(p.tokens_per_s_frequency));
    w.Set(Key("placement.attention_gpu"),
          Uints(
              s.layers, [](auto& l) { return l.attention_gpu ? 1 : 0; }, GgufValueType::kUint8));
    w.Set(Key("placement.gpu_neurons"),
          Uints(
              s.layers, [](auto& l) { return l.n_gpu; }, GgufValueType::kUint32));
  }
  const SidecarCalibration& c = s.calibration;
  if (c.present) {
    w.SetFloat32(Key("calibration.max_ppl_increase"), static_cast<float>(c.max_ppl_increase));
    w.SetBool(Key("calibration.held_out"), c.held_out);
    w.SetUint32(Key("calibration.context"), static_cast<uint32_t>(c.n_ctx));
    w.SetUint64(Key("calibration.tokens_scored"), static_cast<uint64_t>(c.tokens_scored));
    w.SetFloat32(Key("calibration.dense_ppl"), static_cast<float>(c.dense_ppl));
    w.SetFloat32(Key("calibration.predicted.sparsity"), static_cast<float>(c.predicted_sparsity));
    w.SetFloat32(Key("calibration.predicted.ppl"), static_cast<float>(c.predicted_ppl));
    if (c.gate_first) {
      w.SetFloat32(Key("calibration.gate_first.sparsity"),
                   static_cast<float>(c.gate_first_sparsity));
      w.SetFloat32(Key("calibration.gate_first.ppl"), static_cast<float>(c.gate_first_ppl));
    }
    if (c.input_sparse) {
      w.SetFloat32(Key("calibration.input_sparse.sparsity"),
                   static_cast<float>(c.input_sparse_sparsity));
      w.SetFloat32(Key("calibration.input_sparse.ppl"), static_cast<float>(c.input_sparse_ppl));
    }
  }
  const SidecarSpeed& sp = s.speed;
  if (sp.present) {
    w.SetString(Key("speed.cpu"), sp.cpu);
    w.SetUint32(Key("speed.threads"), static_cast<uint32_t>(sp.threads));
    w.SetFloat32(Key("speed.dense_tokens_per_s"), static_cast<float>(sp.dense_tokens_per_s));
    w.SetFloat32(Key("speed.predicted.tokens_per_s"),
                 static_cast<float>(sp.predicted_tokens_per_s));
    w.SetFloat32(Key("speed.predicted.sparsity"), static_cast<float>(sp.predicted_sparsity));
    w.SetFloat32(Key("speed.gate_first.tokens_per_s"),
                 static_cast<float>(sp.gate_first_tokens_per_s));
    w.SetFloat32(Key("speed.gate_first.sparsity"), static_cast<float>(sp.gate_first_sparsity));
    w.SetFloat32(Key("speed.input_sparse.tokens_per_s"),
                 static_cast<float>(sp.input_sparse_tokens_per_s));
    w.SetFloat32(Key("speed.input_sparse.sparsity"), static_cast<float>(sp.input_sparse_sparsity));
  }
  const int64_t d = s.n_embd, f = s.n_ff;
  for (int64_t l = 0; l < s.n_layer; ++l) {
    const SidecarLayer& L = s.layers[l];
    const Predictor& pr = L.predictor;
    if (s.n_expert > 0) {
      const int64_t e = s.n_expert;
      if (absl::Status st = w.AddTensorCopy(TensorName(l, "expert_route_count"), GgmlType::kI32,
                                            {e}, Bytes(L.expert_route_count));
          !st.ok()) {
        return st;
      }
      if (p.present) {
        if (absl::Status st = w.AddTensorCopy(TensorName(l, "expert_gpu"), GgmlType::kI32, {e},
                                              Bytes(L.expert_gpu));
            !st.ok()) {
          return st;
        }
      }
      continue;
    }
    const std::vector<std::pair<std::string, absl::Status>> adds = {
        {"fire_count",
         w.AddTensorCopy(TensorName(l, "fire_count"), GgmlType::kI32, {f}, Bytes(L.fire_count))},
        {"act_abs_mean", w.AddTensorCopy(TensorName(l, "act_abs_mean"), GgmlType::kF32, {f},
                                         Bytes(L.act_abs_mean))},
        {"act_abs_quantiles", w.AddTensorCopy(TensorName(l, "act_abs_quantiles"), GgmlType::kF32,
                                              {kQuantileLevels}, Bytes(L.act_abs_quantiles))}};
    for (const auto& [what, st] : adds) {
      if (!st.ok()) return st;
    }
    if (!L.gate_score_quantiles.empty()) {
      for (absl::Status st :
           {w.AddTensorCopy(TensorName(l, "gate_scale"), GgmlType::kF32, {f}, Bytes(L.gate_scale)),
            w.AddTensorCopy(TensorName(l, "gate_score_quantiles"), GgmlType::kF32,
                            {kQuantileLevels}, Bytes(L.gate_score_quantiles))}) {
        if (!st.ok()) return st;
      }
    }
    for (auto [what, quantiles] : {std::pair{"attn_in_quantiles", &L.attn_in_quantiles},
                                   {"ffn_in_quantiles", &L.ffn_in_quantiles}}) {
      if (quantiles->empty()) continue;
      if (absl::Status st = w.AddTensorCopy(TensorName(l, what), GgmlType::kF32, {kQuantileLevels},
                                            Bytes(*quantiles));
          !st.ok()) {
        return st;
      }
    }
    if (pr.rank > 0) {
      for (absl::Status st :
           {w.AddTensorCopy(TensorName(l, "pred_fc1"), GgmlType::kF16, {d, pr.rank},
                            HalfBytes(pr.fc1)),
            w.AddTensorCopy(TensorName(l, "pred_fc1_b"), GgmlType::kF32, {pr.rank}, Bytes(pr.b1)),
            w.AddTensorCopy(TensorName(l, "pred_fc2"), GgmlType::kF16, {pr.rank, f},
                            HalfBytes(pr.fc2)),
            w.AddTensorCopy(TensorName(l, "pred_fc2_b"), GgmlType::kF32, {f}, Bytes(pr.b2))}) {
        if (!st.ok()) return st;
      }
    }
    if (p.present) {
      if (absl::Status st = w.AddTensorCopy(TensorName(l, "neuron_order"), GgmlType::kI32, {f},
                                            Bytes(L.neuron_order));
          !st.ok()) {
        return st;
      }
    }
  }
  return w.Write(path);
}

absl::StatusOr<Sidecar> ReadSidecar(const std::string& path) {
  auto file = GgufFile::Open(path);
  if (!file.ok()) return file.status();
  const GgufFile& f = **file;
  Sidecar s;
  const GgufValue* version = f.Find(Key("format_version"));
  if (version == nullptr || !version->AsUint()) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", path, "' is not a Thermocline sidecar (no thermocline.format_version)"));
  }
  s.format_version = static_cast<uint32_t>(*version->AsUint());
  if (s.format_version < kOldestSidecarFormatVersion || s.format_version > kSidecarFormatVersion) {
    return absl::FailedPreconditionError(absl::StrCat(
        "sidecar '", path, "' has format version ", s.format_version,
        ", this build reads versions ", kOldestSidecarFormatVersion, " to ", kSidecarFormatVersion,
        " (", s.format_version < kSidecarFormatVersion ? "older" : "newer",
        " format); run `thermocline profile` again to make a current sidecar"));
  }
  auto str = [&](const std::string& k) { return f.GetString(Key(k)); };
  auto num = [&](const std::string& k) { return f.GetInt(Key(k)); };
  auto flt = [&](const std::string& k) { return f.GetFloat(Key(k)); };
  for (auto [dst, k] : {std::pair{&s.model_identity, "model.identity"},
                        {&s.model_name, "model.name"},
                        {&s.activation, "model.activation"},
                        {&s.corpus_kind, "profile.source"},
                        {&s.corpus_hash, "profile.corpus_hash"}}) {
    auto v = str(k);
    if (!v.ok()) return Corrupt(path, v.status().message());
    *dst = *v;
  }
  for (auto [dst, k] : {std::pair{&s.n_layer, "model.n_layer"},
                        {&s.n_embd, "model.n_embd"},
                        {&s.n_ff, "model.n_ff"},
                        {&s.tokens, "profile.tokens"}}) {
    auto v = num(k);
    if (!v.ok()) return Corrupt(path, v.status().message());
    *dst = *v;
  }
  for (auto [dst, k] : {std::pair{&s.target_recall, "predictor.target_recall"},
                        {&s.target_sparsity, "profile.target_sparsity"}}) {
    auto v = flt(k);
    if (!v.ok()) return Corrupt(path, v.status().message());
    *dst = *v;
  }
  if (s.n_layer <= 0 || s.n_layer > 4096 || s.n_embd <= 0 || s.n_ff <= 0) {
    return Corrupt(path, "model shape keys are out of range");
  }
  if (f.Find(Key("experts.count")) != nullptr) {
    auto count = num("experts.count");
    auto used = num("experts.used_count");
    if (!count.ok() || !used.ok() || *count < 1 || *count > 4096 || *used < 1 || *used > *count) {
      return Corrupt(path, "experts keys are missing or out of range");
    }
    s.n_expert = *count;
    s.n_expert_used = *used;
  }
  const int64_t L = s.n_layer, d = s.n_embd, nf = s.n_ff;
  s.layers.resize(L);
  struct ArrayKey {
    const char* key;
    std::function<void(SidecarLayer&, double)> set;
  };
  const std::vector<ArrayKey> arrays = {
      {"profile.sparsity", [](SidecarLayer& l, double v) { l.sparsity = v; }},
      {"profile.skew80", [](SidecarLayer& l, double v) { l.skew80 = v; }},
      {"profile.magnitude_threshold",
       [](SidecarLayer& l, double v) { l.magnitude_threshold = static_cast<float>(v); }},
      {"predictor.rank", [](SidecarLayer& l, double v) { l.predictor.rank = std::llround(v); }},
      {"predictor.threshold",
       [](SidecarLayer& l, double v) { l.predictor.threshold = static_cast<float>(v); }},
      {"predictor.recall", [](SidecarLayer& l, double v) { l.recall = v; }},
      {"predictor.precision", [](SidecarLayer& l, double v) { l.precision = v; }},
      {"predictor.predicted_active", [](SidecarLayer& l, double v) { l.predicted_active = v; }}};
  for (const ArrayKey& a : arrays) {
    auto v = LayerArray(f, a.key, L);
    if (!v.ok()) return v.status();
    for (int64_t l = 0; l < L; ++l) a.set(s.layers[l], (*v)[l]);
  }
  auto present = f.GetBool(Key("placement.present"), false);
  if (!present.ok()) return Corrupt(path, present.status().message());
  SidecarPlacement& p = s.placement;
  p.present = *present;
  if (p.present) {
    auto obj = str("placement.objective");
    auto hw = str("placement.hardware");
    if (!obj.ok() || !hw.ok()) return Corrupt(path, "placement keys are missing");
    p.objective = *obj;
    p.hardware = *hw;
    for (auto [dst, k] : {std::pair{&p.bucket_size, "placement.bucket_size"},
                          {&p.min_neurons, "placement.min_neurons"},
                          {&p.context, "placement.context"}}) {
      auto v = num(k);
      if (!v.ok()) return Corrupt(path, v.status().message());
      *dst = *v;
    }
    auto budget = num("placement.gpu_budget_bytes");
    auto used = num("placement.gpu_bytes");
    auto out_gpu = f.GetBool(Key("placement.output_gpu"));
    if (!budget.ok() || !used.ok() || !out_gpu.ok()) return Corrupt(path, "placement keys");
    p.gpu_budget_bytes = static_cast<uint64_t>(*budget);
    p.gpu_bytes = static_cast<uint64_t>(*used);
    p.output_gpu = *out_gpu;
    for (auto [dst, k] : {std::pair{&p.gpu_neuron_fraction, "placement.gpu_neuron_fraction"},
                          {&p.gpu_mass_fraction, "placement.gpu_mass_fraction"},
                          {&p.tokens_per_s, "placement.tokens_per_s"},
                          {&p.tokens_per_s_time, "placement.tokens_per_s_time"},
                          {&p.tokens_per_s_frequency, "placement.tokens_per_s_frequency"}}) {
      auto v = flt(k);
      if (!v.ok()) return Corrupt(path, v.status().message());
      *dst = *v;
    }
    auto att = LayerArray(f, "placement.attention_gpu", L);
    auto ngpu = LayerArray(f, "placement.gpu_neurons", L);
    if (!att.ok()) return att.status();
    if (!ngpu.ok()) return ngpu.status();
    for (int64_t l = 0; l < L; ++l) {
      s.layers[l].attention_gpu = (*att)[l] != 0;
      s.layers[l].n_gpu = std::llround((*ngpu)[l]);
      if (s.layers[l].n_gpu < 0 || s.layers[l].n_gpu > nf) {
        return Corrupt(path, "placement.gpu_neurons is out of range");
      }
    }
  }
  if (f.Find(Key("calibration.max_ppl_increase")) != nullptr) {
    SidecarCalibration& c = s.calibration;
    c.present = true;
    auto held_out = f.GetBool(Key("calibration.held_out"));
    auto ctx = num("calibration.context");
    auto scored = num("calibration.tokens_scored");
    if (!held_out.ok() || !ctx.ok() || !scored.ok()) return Corrupt(path, "calibration keys");
    c.held_out = *held_out;
    c.n_ctx = *ctx;
    c.tokens_scored = *scored;
    c.gate_first = f.Find(Key("calibration.gate_first.sparsity")) != nullptr;
    c.input_sparse = f.Find(Key("calibration.input_sparse.sparsity")) != nullptr;
    for (auto [dst, k] : {std::pair{&c.max_ppl_increase, "calibration.max_ppl_increase"},
                          {&c.dense_ppl, "calibration.dense_ppl"},
                          {&c.predicted_sparsity, "calibration.predicted.sparsity"},
                          {&c.predicted_ppl, "calibration.predicted.ppl"},
                          {&c.gate_first_sparsity, "calibration.gate_first.sparsity"},
                          {&c.gate_first_ppl, "calibration.gate_first.ppl"},
                          {&c.input_sparse_sparsity, "calibration.input_sparse.sparsity"},
                          {&c.input_sparse_ppl, "calibration.input_sparse.ppl"}}) {
      if (!c.gate_first && absl::StrContains(k, "gate_first")) continue;
      if (!c.input_sparse && absl::StrContains(k, "input_sparse")) continue;
      auto v = flt(k);
      if (!v.ok()) return Corrupt(path, v.status().message());
      *dst = *v;
    }
    if (!(c.max_ppl_increase > 0) || !(c.predicted_sparsity >= 0 && c.predicted_sparsity < 1) ||
        !(c.gate_first_sparsity >= 0 && c.gate_first_sparsity < 1) ||
        !(c.input_sparse_sparsity >= 0 && c.input_sparse_sparsity < 1)) {
      return Corrupt(path, "calibration keys are out of range");
    }
  }
  if (f.Find(Key("speed.cpu")) != nullptr) {
    SidecarSpeed& sp = s.speed;
    sp.present = true;
    auto cpu = str("speed.cpu");
    auto threads = num("speed.threads");
    if (!cpu.ok() || !threads.ok()) return Corrupt(path, "speed keys");
    sp.cpu = *cpu;
    sp.threads = *threads;
    for (auto [dst, k] : {std::pair{&sp.dense_tokens_per_s, "speed.dense_tokens_per_s"},
                          {&sp.predicted_tokens_per_s, "speed.predicted.tokens_per_s"},
                          {&sp.predicted_sparsity, "speed.predicted.sparsity"},
                          {&sp.gate_first_tokens_per_s, "speed.gate_first.tokens_per_s"},
                          {&sp.gate_first_sparsity, "speed.gate_first.sparsity"}}) {
      auto v = flt(k);
      if (!v.ok()) return Corrupt(path, v.status().message());
      *dst = *v;
    }
    // Optional: sidecars measured before input-sparse have none (not measured).
    if (f.Find(Key("speed.input_sparse.tokens_per_s")) != nullptr) {
      auto tps = flt("speed.input_sparse.tokens_per_s");
      auto level = flt("speed.input_sparse.sparsity");
      if (!tps.ok() || !level.ok()) return Corrupt(path, "speed.input_sparse keys");
      sp.input_sparse_tokens_per_s = *tps;
      sp.input_sparse_sparsity = *level;
    }
    if (!(sp.dense_tokens_per_s > 0) || !(sp.predicted_tokens_per_s >= 0) ||
        !(sp.gate_first_tokens_per_s >= 0) || !(sp.predicted_sparsity >= 0) ||
        !(sp.predicted_sparsity < 1) || !(sp.gate_first_sparsity >= 0) ||
        !(sp.gate_first_sparsity < 1) || !(sp.input_sparse_tokens_per_s >= 0) ||
        !(sp.input_sparse_sparsity >= 0) || !(sp.input_sparse_sparsity < 1)) {
      return Corrupt(path, "speed keys are out of range");
    }
  }
  std::vector<int32_t> unused_ints;
  std::vector<float> unused_floats;
  for (int64_t l = 0; l < L; ++l) {
    SidecarLayer& y = s.layers[l];
    Predictor& pr = y.predictor;
    if (s.n_expert > 0) {  // experts: routing counts and placement, no neuron statistics
      const int64_t e = s.n_expert;
      absl::Status st = ReadTensor(f, TensorName(l, "expert_route_count"), GgmlType::kI32, {e},
                                   &unused_floats, &y.expert_route_count);
      if (st.ok() && p.present) {
        st = ReadTensor(f, TensorName(l, "expert_gpu"), GgmlType::kI32, {e}, &unused_floats,
                        &y.expert_gpu);
        for (int32_t v : y.expert_gpu) {
          if (st.ok() && v != 0 && v != 1) {
            st = Corrupt(path, absl::StrCat(TensorName(l, "expert_gpu"), " holds ", v));
          }
        }
      }
      if (!st.ok()) return st;
      continue;
    }
    absl::Status st = ReadTensor(f, TensorName(l, "fire_count"), GgmlType::kI32, {nf},
                                 &unused_floats, &y.fire_count);
    if (st.ok())
      st = ReadTensor(f, TensorName(l, "act_abs_mean"), GgmlType::kF32, {nf}, &y.act_abs_mean,
                      &unused_ints);
    if (st.ok())
      st = ReadTensor(f, TensorName(l, "act_abs_quantiles"), GgmlType::kF32, {kQuantileLevels},
                      &y.act_abs_quantiles, &unused_ints);
    // Optional: sidecars of ReLU models, and those written before it, have none.
    if (st.ok() && f.FindTensor(TensorName(l, "gate_score_quantiles")) != nullptr) {
      st = ReadTensor(f, TensorName(l, "gate_score_quantiles"), GgmlType::kF32, {kQuantileLevels},
                      &y.gate_score_quantiles, &unused_ints);
      if (st.ok())
        st = ReadTensor(f, TensorName(l, "gate_scale"), GgmlType::kF32, {nf}, &y.gate_scale,
                        &unused_ints);
    }
    for (auto [what, quantiles] : {std::pair{"attn_in_quantiles", &y.attn_in_quantiles},
                                   {"ffn_in_quantiles", &y.ffn_in_quantiles}}) {
      if (st.ok() && f.FindTensor(TensorName(l, what)) != nullptr) {
        st = ReadTensor(f, TensorName(l, what), GgmlType::kF32, {kQuantileLevels}, quantiles,
                        &unused_ints);
      }
    }
    if (st.ok() && pr.rank > 0) {
      pr.n_embd = d;
      pr.n_ff = nf;
      st = ReadTensor(f, TensorName(l, "pred_fc1"), GgmlType::kF16, {d, pr.rank}, &pr.fc1,
                      &unused_ints);
      if (st.ok())
        st = ReadTensor(f, TensorName(l, "pred_fc1_b"), GgmlType::kF32, {pr.rank}, &pr.b1,
                        &unused_ints);
      if (st.ok())
        st = ReadTensor(f, TensorName(l, "pred_fc2"), GgmlType::kF16, {pr.rank, nf}, &pr.fc2,
                        &unused_ints);
      if (st.ok())
        st = ReadTensor(f, TensorName(l, "pred_fc2_b"), GgmlType::kF32, {nf}, &pr.b2, &unused_ints);
    }
    if (st.ok() && p.present) {
      st = ReadTensor(f, TensorName(l, "neuron_order"), GgmlType::kI32, {nf}, &unused_floats,
                      &y.neuron_order);
      std::vector<uint8_t> seen(nf, 0);
      for (int32_t id : y.neuron_order) {
        if (id < 0 || id >= nf || seen[id]++) {
          return Corrupt(path, absl::StrCat(TensorName(l, "neuron_order"),
                                            " is not a permutation of the layer's neurons"));
        }
      }
    }
    if (!st.ok()) return st;
  }
  return s;
}

}  // namespace thermocline::offline
