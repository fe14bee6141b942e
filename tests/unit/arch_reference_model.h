// Test models of other families built from stories260K's weights, and a plain reference forward
// pass to say what they must compute. A RefModel holds every weight as floats in the test's own
// hands; WriteRefModel lays it out as a family's GGUF (names, fused and 3-D tensors) for the
// engine, and RefLogits computes the model token by token in double precision with plain loops,
// written from the families' definitions, sharing no code with the engine. Its llama case is
// checked against stories260K's independent reference (arch_model_test.cc), so that it can be
// trusted for what the families add.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "engine/gguf/gguf.h"
#include "test_util.h"

namespace thermocline::testing {

struct RefLayer {
  std::vector<float> attn_norm, wq, wk, wv, wo;  // wq: (n_head*hd, n_embd) row-major, ...
  std::vector<float> bq, bk, bv;                 // empty: none
  std::vector<float> q_norm, k_norm;             // (hd), empty: none
  std::vector<float> post_attn_norm, post_ffn_norm;
  std::vector<float> ffn_norm, gate, up, down;  // gate, up: (n_ff, n_embd); down: (n_embd, n_ff)
  std::vector<float> router;                    // (n_expert, n_embd), empty: dense FFN
  std::vector<std::vector<float>> exp_gate, exp_up, exp_down;
  std::vector<float> sh_gate, sh_up, sh_down, sh_gate_inp;  // shared expert, empty: none
  // θ_i = pos · rope_coef[i] for pair i; cos and sin multiplied by rope_mscale.
  std::vector<double> rope_coef;
  double rope_mscale = 1;
  int64_t window = 0;  // > 0: attends to the last `window` positions
};

struct RefModel {
  int64_t n_embd = 0, n_head = 0, n_head_kv = 0, head_dim = 0, n_ff = 0, n_vocab = 0;
  double eps = 1e-5;
  bool neox = false;  // pairs (i, i + hd/2) instead of (2i, 2i+1)
  bool gelu = false;  // gelu_tanh(gate) * up instead of silu(gate) * up
  double embd_scale = 1;
  double attn_softcap = 0, final_softcap = 0;
  int64_t n_expert_used = 0;
  bool renormalise_experts = true;
  std::vector<float> embd, output_norm;  // embd (n_vocab, n_embd), also the tied output head
  std::vector<RefLayer> layers;
};

// Base RoPE coefficients base^(-2i/d) of the pairs of a head of `rope_dim` dimensions.
inline std::vector<double> BaseRopeCoef(double base, int64_t rope_dim) {
  std::vector<double> c(rope_dim / 2);
  for (int64_t i = 0; i < rope_dim / 2; ++i) c[i] = std::pow(base, -2.0 * i / rope_dim);
  return c;
}

// The tensor as floats (F32 files only, as the test models are).
inline std::vector<float> F32Tensor(const GgufFile& f, const std::string& name) {
  const GgufTensorInfo* t = f.FindTensor(name);
  REQUIRE(t != nullptr);
  REQUIRE(t->type == GgmlType::kF32);
  const float* p = reinterpret_cast<const float*>(t->data);
  return std::vector<float>(p, p + t->n_elements);
}

// stories260K as a RefModel (llama: adjacent-pair RoPE, base 10000, SwiGLU, tied head).
inline RefModel Stories260K(const GgufFile& f) {
  RefModel m;
  m.n_embd = 64;
  m.n_head = 8;
  m.n_head_kv = 4;
  m.head_dim = 8;
  m.n_ff = 172;
  m.n_vocab = 512;
  m.embd = F32Tensor(f, "token_embd.weight");
  m.output_norm = F32Tensor(f, "output_norm.weight");
  for (int l = 0; l < 5; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    RefLayer L;
    L.attn_norm = F32Tensor(f, b + "attn_norm.weight");
    L.wq = F32Tensor(f, b + "attn_q.weight");
    L.wk = F32Tensor(f, b + "attn_k.weight");
    L.wv = F32Tensor(f, b + "attn_v.weight");
    L.wo = F32Tensor(f, b + "attn_output.weight");
    L.ffn_norm = F32Tensor(f, b + "ffn_norm.weight");
    L.gate = F32Tensor(f, b + "ffn_gate.weight");
    L.up = F32Tensor(f, b + "ffn_up.weight");
    L.down = F32Tensor(f, b + "ffn_down.weight");
    L.rope_coef = BaseRopeCoef(10000.0, m.head_dim);
    m.layers.push_back(L);
  }
  return m;
}

// Reorders the rows of each head of w: (n_heads * hd, cols) so that NEOX RoPE's pair
// (i, i + hd/2) holds what adjacent RoPE's pair (2i, 2i + 1) held: the same rotations of the
// same values, so q·k, and the whole model, are unchanged.
inline std::vector<float> PermuteForNeox(const std::vector<float>& w, int64_t n_heads, int64_t hd,
                                         int64_t cols) {
  std::vector<float> out(w.size());
  for (int64_t h = 0; h < n_heads; ++h) {
    for (int64_t j = 0; j < hd; ++j) {
      const int64_t src = j < hd / 2 ? 2 * j : 2 * (j - hd / 2) + 1;
      std::copy_n(w.begin() + (h * hd + src) * cols, cols, out.begin() + (h * hd + j) * cols);
    }
  }
  return out;
}

// ---- The reference forward pass -----------------------------------------------------------

using Vec = std::vector<double>;

inline Vec MatVec(const std::vector<float>& w, const Vec& x, int64_t rows) {
  const int64_t cols = static_cast<int64_t>(x.size());
  Vec y(rows, 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) y[r] += double{w[r * cols + c]} * x[c];
  }
  return y;
}

inline Vec RmsNormed(const Vec& x, const std::vector<float>& w, double eps, int64_t off = 0,
                     int64_t n = -1) {
  if (n < 0) n = static_cast<int64_t>(x.size());
  double ss = 0;
  for (int64_t i = 0; i < n; ++i) ss += x[off + i] * x[off + i];
  const double s = 1.0 / std::sqrt(ss / n + eps);
  Vec y(n);
  for (int64_t i = 0; i < n; ++i) y[i] = x[off + i] * s * w[i];
  return y;
}

inline void Rotate(Vec& v, int64_t off, int64_t hd, bool neox, const RefLayer& L, int64_t pos) {
  for (int64_t i = 0; i < hd / 2; ++i) {
    const double th = pos * L.rope_coef[i];
    const double c = std::cos(th) * L.rope_mscale, s = std::sin(th) * L.rope_mscale;
    const int64_t a = off + (neox ? i : 2 * i), b = off + (neox ? i + hd / 2 : 2 * i + 1);
    const double x0 = v[a], x1 = v[b];
    v[a] = x0 * c - x1 * s;
    v[b] = x0 * s + x1 * c;
  }
}

inline Vec GatedFfn(const RefModel& m, const std::vector<float>& gate, const std::vector<float>& up,
                    const std::vector<float>& down, int64_t n_ff, const Vec& xn) {
  const Vec g = MatVec(gate, xn, n_ff), u = MatVec(up, xn, n_ff);
  Vec a(n_ff);
  for (int64_t i = 0; i < n_ff; ++i) {
    const double x = g[i];
    const double act =
        m.gelu ? 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)))
               : x / (1 + std::exp(-x));
    a[i] = act * u[i];
  }
  return MatVec(down, a, m.n_embd);
}

// Logits after each token of `tokens`, from an empty cache: (tokens.size(), n_vocab).
inline std::vector<Vec> RefLogits(const RefModel& m, const std::vector<int32_t>& tokens) {
  const int64_t d = m.n_embd, hd = m.head_dim, kvd = m.n_head_kv * hd;
  std::vector<std::vector<Vec>> kc(m.layers.size()), vc(m.layers.size());
  std::vector<Vec> out;
  for (size_t p = 0; p < tokens.size(); ++p) {
    Vec x(d);
    for (int64_t i = 0; i < d; ++i) x[i] = m.embd[tokens[p] * d + i] * m.embd_scale;
    for (size_t l = 0; l < m.layers.size(); ++l) {
      const RefLayer& L = m.layers[l];
      const Vec xn = RmsNormed(x, L.attn_norm, m.eps);
      Vec q = MatVec(L.wq, xn, m.n_head * hd), k = MatVec(L.wk, xn, kvd), v = MatVec(L.wv, xn, kvd);
      for (int64_t i = 0; i < static_cast<int64_t>(L.bq.size()); ++i) q[i] += L.bq[i];
      for (int64_t i = 0; i < static_cast<int64_t>(L.bk.size()); ++i) k[i] += L.bk[i];
      for (int64_t i = 0; i < static_cast<int64_t>(L.bv.size()); ++i) v[i] += L.bv[i];
      for (int64_t h = 0; h < m.n_head; ++h) {
        if (!L.q_norm.empty()) {
          const Vec n = RmsNormed(q, L.q_norm, m.eps, h * hd, hd);
          std::copy(n.begin(), n.end(), q.begin() + h * hd);
        }
        Rotate(q, h * hd, hd, m.neox, L, static_cast<int64_t>(p));
      }
      for (int64_t h = 0; h < m.n_head_kv; ++h) {
        if (!L.k_norm.empty()) {
          const Vec n = RmsNormed(k, L.k_norm, m.eps, h * hd, hd);
          std::copy(n.begin(), n.end(), k.begin() + h * hd);
        }
        Rotate(k, h * hd, hd, m.neox, L, static_cast<int64_t>(p));
      }
      kc[l].push_back(k);
      vc[l].push_back(v);
      const int64_t first = L.window > 0 ? std::max<int64_t>(0, p + 1 - L.window) : 0;
      Vec att(m.n_head * hd, 0.0);
      for (int64_t h = 0; h < m.n_head; ++h) {
        const int64_t kh = h / (m.n_head / m.n_head_kv);
        Vec s;
        for (int64_t j = first; j <= static_cast<int64_t>(p); ++j) {
          double dot = 0;
          for (int64_t i = 0; i < hd; ++i) dot += q[h * hd + i] * kc[l][j][kh * hd + i];
          dot /= std::sqrt(static_cast<double>(hd));
          if (m.attn_softcap > 0) dot = m.attn_softcap * std::tanh(dot / m.attn_softcap);
          s.push_back(dot);
        }
        const double mx = *std::max_element(s.begin(), s.end());
        double sum = 0;
        for (double& e : s) sum += (e = std::exp(e - mx));
        for (size_t j = 0; j < s.size(); ++j) {
          for (int64_t i = 0; i < hd; ++i) {
            att[h * hd + i] += s[j] / sum * vc[l][first + j][kh * hd + i];
          }
        }
      }
      Vec a = MatVec(L.wo, att, d);
      if (!L.post_attn_norm.empty()) a = RmsNormed(a, L.post_attn_norm, m.eps);
      for (int64_t i = 0; i < d; ++i) x[i] += a[i];
      const Vec fn = RmsNormed(x, L.ffn_norm, m.eps);
      Vec f(d, 0.0);
      if (L.router.empty()) {
        f = GatedFfn(m, L.gate, L.up, L.down, m.n_ff, fn);
      } else {
        const int64_t ne = static_cast<int64_t>(L.exp_gate.size());
        Vec r = MatVec(L.router, fn, ne);
        const double mx = *std::max_element(r.begin(), r.end());
        double sum = 0;
        for (double& e : r) sum += (e = std::exp(e - mx));
        for (double& e : r) e /= sum;
        std::vector<int64_t> order(ne);
        for (int64_t e = 0; e < ne; ++e) order[e] = e;
        std::stable_sort(order.begin(), order.end(),
                         [&](int64_t a, int64_t b) { return r[a] > r[b]; });
        double wsum = 0;
        for (int64_t j = 0; j < m.n_expert_used; ++j) wsum += r[order[j]];
        for (int64_t j = 0; j < m.n_expert_used; ++j) {
          const int64_t e = order[j];
          const double w = m.renormalise_experts ? r[e] / wsum : r[e];
          const Vec y = GatedFfn(m, L.exp_gate[e], L.exp_up[e], L.exp_down[e], m.n_ff, fn);
          for (int64_t i = 0; i < d; ++i) f[i] += w * y[i];
        }
        if (!L.sh_gate.empty()) {
          const int64_t n_sh = static_cast<int64_t>(L.sh_gate.size()) / d;
          const Vec y = GatedFfn(m, L.sh_gate, L.sh_up, L.sh_down, n_sh, fn);
          double g = 0;
          for (int64_t i = 0; i < d; ++i) g += L.sh_gate_inp[i] * fn[i];
          for (int64_t i = 0; i < d; ++i) f[i] += y[i] / (1 + std::exp(-g));
        }
      }
      if (!L.post_ffn_norm.empty()) f = RmsNormed(f, L.post_ffn_norm, m.eps);
      for (int64_t i = 0; i < d; ++i) x[i] += f[i];
    }
    Vec logits = MatVec(m.embd, RmsNormed(x, m.output_norm, m.eps), m.n_vocab);
    if (m.final_softcap > 0) {
      for (double& z : logits) z = m.final_softcap * std::tanh(z / m.final_softcap);
    }
    out.push_back(logits);
  }
  return out;
}

// Greedy continuation of `prompt` by the reference (argmax, lower id on a tie).
inline std::vector<int32_t> RefGreedy(const RefModel& m, std::vector<int32_t> seq, int n) {
  std::vector<int32_t> got;
  for (int i = 0; i < n; ++i) {
    const Vec last = RefLogits(m, seq).back();
    const int32_t next =
        static_cast<int32_t>(std::max_element(last.begin(), last.end()) - last.begin());
    got.push_back(next);
    seq.push_back(next);
  }
  return got;
}

// ---- Writing a RefModel as a family's GGUF -------------------------------------------------

struct RefLayout {
  std::string arch = "llama";
  bool fused_qkv = false;           // attn_qkv = Q, K, V rows (phi3)
  bool fused_gate_up = false;       // ffn_up = gate rows, then up rows (phi3)
  std::vector<GgufKeyValue> extra;  // family keys beyond the common ones
  std::vector<std::pair<std::string, std::vector<float>>> extra_tensors;
};

inline void AddF32(GgufWriter& w, const std::string& name, std::vector<int64_t> dims,
                   const std::vector<float>& v) {
  std::vector<uint8_t> bytes(v.size() * 4);
  std::memcpy(bytes.data(), v.data(), bytes.size());
  REQUIRE(w.AddTensorCopy(name, GgmlType::kF32, std::move(dims), std::move(bytes)).ok());
}

inline std::vector<float> Concat(std::initializer_list<const std::vector<float>*> parts) {
  std::vector<float> out;
  for (const auto* p : parts) out.insert(out.end(), p->begin(), p->end());
  return out;
}

// Writes `m` as a `layout.arch` file, its tokenizer copied from `tokenizer_source`.
inline std::string WriteRefModel(const RefModel& m, const RefLayout& layout,
                                 const GgufFile& tokenizer_source, const std::string& name) {
  GgufWriter w;
  const std::string a = layout.arch + ".";
  w.SetString("general.architecture", layout.arch);
  w.SetUint32(a + "context_length", 512);
  w.SetUint32(a + "embedding_length", static_cast<uint32_t>(m.n_embd));
  w.SetUint32(a + "block_count", static_cast<uint32_t>(m.layers.size()));
  w.SetUint32(a + "feed_forward_length", static_cast<uint32_t>(m.n_ff));
  w.SetUint32(a + "attention.head_count", static_cast<uint32_t>(m.n_head));
  w.SetUint32(a + "attention.head_count_kv", static_cast<uint32_t>(m.n_head_kv));
  w.SetFloat32(a + "attention.layer_norm_rms_epsilon", static_cast<float>(m.eps));
  w.SetUint32(a + "rope.dimension_count", static_cast<uint32_t>(m.head_dim));
  for (const GgufKeyValue& kv : layout.extra) w.Set(kv.key, kv.value);
  for (const GgufKeyValue& kv : tokenizer_source.metadata()) {
    if (kv.key.rfind("tokenizer.", 0) == 0) w.Set(kv.key, kv.value);
  }
  const int64_t d = m.n_embd, hd = m.head_dim;
  AddF32(w, "token_embd.weight", {d, m.n_vocab}, m.embd);
  AddF32(w, "output_norm.weight", {d}, m.output_norm);
  for (const auto& [tname, values] : layout.extra_tensors) {
    AddF32(w, tname, {static_cast<int64_t>(values.size())}, values);
  }
  for (size_t l = 0; l < m.layers.size(); ++l) {
    const RefLayer& L = m.layers[l];
    const std::string b = "blk." + std::to_string(l) + ".";
    const int64_t qd = m.n_head * hd, kvd = m.n_head_kv * hd;
    AddF32(w, b + "attn_norm.weight", {d}, L.attn_norm);
    if (layout.fused_qkv) {
      AddF32(w, b + "attn_qkv.weight", {d, qd + 2 * kvd}, Concat({&L.wq, &L.wk, &L.wv}));
    } else {
      AddF32(w, b + "attn_q.weight", {d, qd}, L.wq);
      AddF32(w, b + "attn_k.weight", {d, kvd}, L.wk);
      AddF32(w, b + "attn_v.weight", {d, kvd}, L.wv);
    }
    if (!L.bq.empty()) {
      AddF32(w, b + "attn_q.bias", {qd}, L.bq);
      AddF32(w, b + "attn_k.bias", {kvd}, L.bk);
      AddF32(w, b + "attn_v.bias", {kvd}, L.bv);
    }
    if (!L.q_norm.empty()) {
      AddF32(w, b + "attn_q_norm.weight", {hd}, L.q_norm);
      AddF32(w, b + "attn_k_norm.weight", {hd}, L.k_norm);
    }
    AddF32(w, b + "attn_output.weight", {qd, d}, L.wo);
    if (!L.post_attn_norm.empty()) {
      AddF32(w, b + "post_attention_norm.weight", {d}, L.post_attn_norm);
      AddF32(w, b + "post_ffw_norm.weight", {d}, L.post_ffn_norm);
    }
    AddF32(w, b + "ffn_norm.weight", {d}, L.ffn_norm);
    if (!L.router.empty()) {
      const int64_t ne = static_cast<int64_t>(L.exp_gate.size());
      std::vector<float> g, u, dn;
      for (int64_t e = 0; e < ne; ++e) {
        g.insert(g.end(), L.exp_gate[e].begin(), L.exp_gate[e].end());
        u.insert(u.end(), L.exp_up[e].begin(), L.exp_up[e].end());
        dn.insert(dn.end(), L.exp_down[e].begin(), L.exp_down[e].end());
      }
      AddF32(w, b + "ffn_gate_inp.weight", {d, ne}, L.router);
      AddF32(w, b + "ffn_gate_exps.weight", {d, m.n_ff, ne}, g);
      AddF32(w, b + "ffn_up_exps.weight", {d, m.n_ff, ne}, u);
      AddF32(w, b + "ffn_down_exps.weight", {m.n_ff, d, ne}, dn);
      if (!L.sh_gate.empty()) {
        const int64_t n_sh = static_cast<int64_t>(L.sh_gate.size()) / d;
        AddF32(w, b + "ffn_gate_inp_shexp.weight", {d}, L.sh_gate_inp);
        AddF32(w, b + "ffn_gate_shexp.weight", {d, n_sh}, L.sh_gate);
        AddF32(w, b + "ffn_up_shexp.weight", {d, n_sh}, L.sh_up);
        AddF32(w, b + "ffn_down_shexp.weight", {n_sh, d}, L.sh_down);
      }
    } else if (layout.fused_gate_up) {
      AddF32(w, b + "ffn_up.weight", {d, 2 * m.n_ff}, Concat({&L.gate, &L.up}));
      AddF32(w, b + "ffn_down.weight", {m.n_ff, d}, L.down);
    } else {
      AddF32(w, b + "ffn_gate.weight", {d, m.n_ff}, L.gate);
      AddF32(w, b + "ffn_up.weight", {d, m.n_ff}, L.up);
      AddF32(w, b + "ffn_down.weight", {m.n_ff, d}, L.down);
    }
  }
  const std::string path = (TempDir() / name).string();
  REQUIRE(w.Write(path).ok());
  return path;
}

}  // namespace thermocline::testing
