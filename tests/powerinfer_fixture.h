// relu-tiny rewritten as PowerInfer writes a model (magic "PWRI", blk.N.ffn_down_t instead of
// ffn_down, predictors blk.N.fc1 / blk.N.fc2, threshold powerinfer.sparse_threshold), with an
// exact predictor: fc1 = [gate; -gate], fc2 = [I, -I] gives the logit relu(g) - relu(-g) = g, the
// gate's own pre-activation, so with threshold 0 the predicted set is exactly the firing set and
// sparse generation must equal dense. Shared by the unit and the daemon tests.
#pragma once

#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "engine/gguf/gguf.h"
#include "test_util.h"

namespace thermocline::testing {

// relu-tiny (F32) rewritten as PowerInfer writes a model.
inline std::string WritePowerInferFile(const std::string& source) {
  auto in = GgufFile::Open(source);
  REQUIRE(in.ok());
  const GgufFile& f = **in;
  GgufWriter w;
  for (const GgufKeyValue& kv : f.metadata()) {
    if (kv.key != "llama.feed_forward_activation") w.Set(kv.key, kv.value);
  }
  w.SetFloat32("powerinfer.sparse_threshold", 0.0f);
  std::vector<std::vector<float>> keep;
  for (const GgufTensorInfo& t : f.tensors()) {
    const std::string& name = t.name;
    const size_t pos = name.find(".ffn_down.weight");
    if (pos == std::string::npos) {
      REQUIRE(w.AddTensor(name, t.type, t.dims, t.data, t.size_bytes).ok());
      continue;
    }
    REQUIRE(t.type == GgmlType::kF32);
    const std::string blk = name.substr(0, pos);  // "blk.N"
    const int64_t n_embd = t.dims[1], n_ff = t.dims[0];
    const float* down = reinterpret_cast<const float*>(t.data);  // (n_embd, n_ff)
    std::vector<float> down_t(n_ff * n_embd);
    for (int64_t r = 0; r < n_embd; ++r) {
      for (int64_t c = 0; c < n_ff; ++c) down_t[c * n_embd + r] = down[r * n_ff + c];
    }
    const GgufTensorInfo* gate = f.FindTensor(blk + ".ffn_gate.weight");
    REQUIRE(gate != nullptr);
    const float* g = reinterpret_cast<const float*>(gate->data);  // (n_ff, n_embd)
    std::vector<float> fc1(2 * n_ff * n_embd), fc2(n_ff * 2 * n_ff, 0.0f);
    for (int64_t i = 0; i < n_ff * n_embd; ++i) {
      fc1[i] = g[i];
      fc1[n_ff * n_embd + i] = -g[i];
    }
    for (int64_t i = 0; i < n_ff; ++i) {
      fc2[i * 2 * n_ff + i] = 1.0f;
      fc2[i * 2 * n_ff + n_ff + i] = -1.0f;
    }
    auto bytes = [](const std::vector<float>& v) {
      std::vector<uint8_t> b(v.size() * 4);
      std::memcpy(b.data(), v.data(), b.size());
      return b;
    };
    REQUIRE(
        w.AddTensorCopy(blk + ".ffn_down_t.weight", GgmlType::kF32, {n_embd, n_ff}, bytes(down_t))
            .ok());
    REQUIRE(
        w.AddTensorCopy(blk + ".fc1.weight", GgmlType::kF32, {n_embd, 2 * n_ff}, bytes(fc1)).ok());
    REQUIRE(
        w.AddTensorCopy(blk + ".fc2.weight", GgmlType::kF32, {2 * n_ff, n_ff}, bytes(fc2)).ok());
  }
  const std::string path = (TempDir() / "relu-tiny.powerinfer.gguf").string();
  REQUIRE(w.Write(path).ok());
  std::fstream io(path, std::ios::in | std::ios::out | std::ios::binary);
  io.write("PWRI", 4);
  return path;
}

}  // namespace thermocline::testing
