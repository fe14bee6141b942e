// The K-quants (Q2_K .. Q6_K) and the Q8_K activations, scalar: each block decoded into integers
// (quants_ref.h's DecodedBlock) and the reference quantizers, which follow ggml's
// quantize_row_*_ref step by step (the scale search of make_qkx2_quants, make_qx_quants and
// make_q3_quants included) so that our quantize writes the blocks llama-quantize writes.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "engine/ops/kernels.h"
#include "engine/ops/quants_ref.h"

namespace thermocline::ops_internal {
namespace {

constexpr float kGroupMaxEps = 1e-15f;  // below this a group's largest magnitude counts as zero

// A group of n values as x ≈ scale * L - min with L in 0..nmax, min >= 0 (the returned scale,
// *the_min): the first guess spans [min(x, 0), max(x)], then nstep + 1 candidate scales
// (nmax + rmin + rdelta * is spread over the range) are each fitted by weighted least squares
// of scale and min, keeping the one of the smallest weighted error (absolute with use_mad).
float FitScaleMin(int n, int nmax, const float* x, const float* weights, uint8_t* L, float* the_min,
                  uint8_t* Laux, float rmin, float rdelta, int nstep, bool use_mad) {
  float min = x[0], max = x[0];
  float sum_w = weights[0];
  float sum_x = sum_w * x[0];
  for (int i = 1; i < n; ++i) {
    min = std::min(min, x[i]);
    max = std::max(max, x[i]);
    sum_w += weights[i];
    sum_x += weights[i] * x[i];
  }
  if (min > 0) min = 0;
  if (max == min) {
    std::fill_n(L, n, 0);
    *the_min = -min;
    return 0.0f;
  }
  float iscale = nmax / (max - min);
  float scale = 1 / iscale;
  float best_error = 0;
  for (int i = 0; i < n; ++i) {
    L[i] = static_cast<uint8_t>(std::clamp(NearestInt(iscale * (x[i] - min)), 0, nmax));
    const float diff = scale * L[i] + min - x[i];
    best_error += weights[i] * (use_mad ? std::fabs(diff) : diff * diff);
  }
  for (int is = 0; is <= nstep; ++is) {
    iscale = (rmin + rdelta * is + nmax) / (max - min);
    float sum_l = 0, sum_l2 = 0, sum_xl = 0;
    for (int i = 0; i < n; ++i) {
      const int l = std::clamp(NearestInt(iscale * (x[i] - min)), 0, nmax);
      Laux[i] = static_cast<uint8_t>(l);
      sum_l += weights[i] * l;
      sum_l2 += weights[i] * l * l;
      sum_xl += weights[i] * l * x[i];
    }
    const float det = sum_w * sum_l2 - sum_l * sum_l;
    if (det <= 0) continue;
    float this_scale = (sum_w * sum_xl - sum_x * sum_l) / det;
    float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det;
    if (this_min > 0) {
      this_min = 0;
      this_scale = sum_xl / sum_l2;
    }
    float error = 0;
    for (int i = 0; i < n; ++i) {
      const float diff = this_scale * Laux[i] + this_min - x[i];
      error += weights[i] * (use_mad ? std::fabs(diff) : diff * diff);
    }
    if (error < best_error) {
      std::copy_n(Laux, n, L);
      best_error = error;
      scale = this_scale;
      min = this_min;
    }
  }
  *the_min = -min;
  return scale;
}

// A group of n values as x ≈ scale * (L - nmax), L in 0..2 nmax - 1, weights x^2: the scale
// that puts the largest magnitude at -nmax, then 18 nearby ones, each least-squares refitted,
// keeping the best (ggml's make_qx_quants, rmse_type 1).
float FitSymmetric(int n, int nmax, const float* x, int8_t* L) {
  float max = 0, amax = 0;
  for (int i = 0; i < n; ++i) {
    if (std::fabs(x[i]) > amax) {
      amax = std::fabs(x[i]);
      max = x[i];
    }
  }
  if (amax < kGroupMaxEps) {
    std::fill_n(L, n, 0);
    return 0.0f;
  }
  float iscale = -nmax / max;
  float sumlx = 0, suml2 = 0;
  for (int i = 0; i < n; ++i) {
    const int l = std::clamp(NearestInt(iscale * x[i]), -nmax, nmax - 1);
    L[i] = static_cast<int8_t>(l + nmax);
    const float w = x[i] * x[i];
    sumlx += w * x[i] * l;
    suml2 += w * l * l;
  }
  float scale = suml2 != 0 ? sumlx / suml2 : 0.0f;
  float best = scale * sumlx;
  for (int is = -9; is <= 9; ++is) {
    if (is == 0) continue;
    iscale = -(nmax + 0.1f * is) / max;
    sumlx = suml2 = 0;
    for (int i = 0; i < n; ++i) {
      const int l = std::clamp(NearestInt(iscale * x[i]), -nmax, nmax - 1);
      const float w = x[i] * x[i];
      sumlx += w * x[i] * l;
      suml2 += w * l * l;
    }
    if (suml2 > 0 && sumlx * sumlx > best * suml2) {
      for (int i = 0; i < n; ++i) {
        L[i] = static_cast<int8_t>(nmax + std::clamp(NearestInt(iscale * x[i]), -nmax, nmax - 1));
      }
      scale = sumlx / suml2;
      best = scale * sumlx;
    }
  }
  return scale;
}

// Q3_K's group fit (ggml's make_q3_quants with do_rmse): the scale that puts the largest
// magnitude at -nmax, then up to 5 passes that move single quants where that improves the
// weighted (x^2) least-squares fit. L in 0..2 nmax - 1 (offset nmax).
float FitQ3(int n, int nmax, const float* x, int8_t* L) {
  float max = 0, amax = 0;
  for (int i = 0; i < n; ++i) {
    if (std::fabs(x[i]) > amax) {
      amax = std::fabs(x[i]);
      max = x[i];
    }
  }
  if (amax < kGroupMaxEps) {
    std::fill_n(L, n, 0);
    return 0.0f;
  }
  const float iscale = -nmax / max;
  float sumlx = 0, suml2 = 0;
  for (int i = 0; i < n; ++i) {
    const int l = std::clamp(NearestInt(iscale * x[i]), -nmax, nmax - 1);
    L[i] = static_cast<int8_t>(l);
    const float w = x[i] * x[i];
    sumlx += w * x[i] * l;
    suml2 += w * l * l;
  }
  for (int pass = 0; pass < 5; ++pass) {
    int changed = 0;
    for (int i = 0; i < n; ++i) {
      const float w = x[i] * x[i];
      float slx = sumlx - w * x[i] * L[i];
      if (slx <= 0) continue;
      float sl2 = suml2 - w * L[i] * L[i];
      const int new_l = std::clamp(NearestInt(x[i] * sl2 / slx), -nmax, nmax - 1);
      if (new_l == L[i]) continue;
      slx += w * x[i] * new_l;
      sl2 += w * new_l * new_l;
      if (sl2 > 0 && slx * slx * suml2 > sumlx * sumlx * sl2) {
        L[i] = static_cast<int8_t>(new_l);
        sumlx = slx;
        suml2 = sl2;
        ++changed;
      }
    }
    if (changed == 0) break;
  }
  for (int i = 0; i < n; ++i) L[i] = static_cast<int8_t>(L[i] + nmax);
  return sumlx / suml2;
}

// Packs 256 values of 2 bits (L in 0..3) as Q2_K / Q3_K do: element 128h + 32s + l at bits
// 2s of qs[32h + l].
void Pack2Bits(const uint8_t* L, uint8_t* qs) {
  for (int h = 0; h < 2; ++h) {
    for (int l = 0; l < 32; ++l) {
      const uint8_t* e = L + 128 * h + l;
      qs[32 * h + l] = static_cast<uint8_t>(e[0] | (e[32] << 2) | (e[64] << 4) | (e[96] << 6));
    }
  }
}

// Q4_K and Q5_K (nmax 15 or 31): groups of 32 fitted with a min, their scales and mins
// quantized to 6 bits against the largest, then every quant recomputed from the stored values.
// Fills scales/d/dmin of the block and L (256 quants in 0..nmax).
template <class Block>
void QuantizeQ45KScales(const float* x, int nmax, float rmin, int nstep, Block* y, uint8_t* L) {
  float scales[8], mins[8], weights[32];
  uint8_t Laux[32];
  float max_scale = 0, max_min = 0;
  for (int j = 0; j < 8; ++j) {
    float sum_x2 = 0;
    for (int l = 0; l < 32; ++l) sum_x2 += x[32 * j + l] * x[32 * j + l];
    const float av_x = std::sqrt(sum_x2 / 32);
    for (int l = 0; l < 32; ++l) weights[l] = av_x + std::fabs(x[32 * j + l]);
    scales[j] = FitScaleMin(32, nmax, x + 32 * j, weights, L + 32 * j, &mins[j], Laux, rmin, 0.1f,
                            nstep, false);
    max_scale = std::max(max_scale, scales[j]);
    max_min = std::max(max_min, mins[j]);
  }
  const float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
  const float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
  for (int j = 0; j < 8; ++j) {
    const uint8_t ls =
        std::min<uint8_t>(63, static_cast<uint8_t>(NearestInt(inv_scale * scales[j])));
    const uint8_t lm = std::min<uint8_t>(63, static_cast<uint8_t>(NearestInt(inv_min * mins[j])));
    if (j < 4) {
      y->scales[j] = ls;
      y->scales[j + 4] = lm;
    } else {
      y->scales[j + 4] = static_cast<uint8_t>((ls & 0xF) | ((lm & 0xF) << 4));
      y->scales[j - 4] |= static_cast<uint8_t>((ls >> 4) << 6);
      y->scales[j] |= static_cast<uint8_t>((lm >> 4) << 6);
    }
  }
  y->d = FloatToHalf(max_scale / 63.f);
  y->dmin = FloatToHalf(max_min / 63.f);
  for (int j = 0; j < 8; ++j) {
    int sc, m;
    Q4KScaleMin(y->scales, j, &sc, &m);
    const float d = HalfToFloat(y->d) * sc;
    if (d == 0.0f) continue;
    const float dm = HalfToFloat(y->dmin) * m;
    for (int l = 0; l < 32; ++l) {
      L[32 * j + l] =
          static_cast<uint8_t>(std::clamp(NearestInt((x[32 * j + l] + dm) / d), 0, nmax));
    }
  }
}

}  // namespace

int NearestInt(float x) { return static_cast<int>(std::lrint(x)); }

void Q4KScaleMin(const uint8_t* q, int j, int* sc, int* m) {
  if (j < 4) {
    *sc = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *sc = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

void Q3KScales(const uint8_t* scales, int32_t out[16]) {
  for (int j = 0; j < 16; ++j) {
    const int low = j < 8 ? scales[j] & 0xF : scales[j - 8] >> 4;
    const int high = (scales[8 + j % 4] >> (2 * (j / 4))) & 3;
    out[j] = (low | (high << 4)) - 32;
  }
}

void DecodeQ2_K(const void* blocks, int64_t b, DecodedBlock* out) {
  const BlockQ2_K& x = static_cast<const BlockQ2_K*>(blocks)[b];
  out->group = 16;
  out->d = HalfToFloat(x.d);
  out->dm = HalfToFloat(x.dmin);
  for (int j = 0; j < 16; ++j) {
    out->sc[j] = x.scales[j] & 0xF;
    out->mn[j] = x.scales[j] >> 4;
  }
  for (int e = 0; e < kQK_K; ++e) {
    const int g = e / 32, l = e % 32;
    out->q[e] = (x.qs[32 * (g / 4) + l] >> (2 * (g % 4))) & 3;
  }
}

void DecodeQ3_K(const void* blocks, int64_t b, DecodedBlock* out) {
  const BlockQ3_K& x = static_cast<const BlockQ3_K*>(blocks)[b];
  out->group = 16;
  out->d = HalfToFloat(x.d);
  out->dm = 0.0f;
  Q3KScales(x.scales, out->sc);
  std::fill_n(out->mn, 16, 0);
  for (int e = 0; e < kQK_K; ++e) {
    const int g = e / 32, l = e % 32;
    const int low = (x.qs[32 * (g / 4) + l] >> (2 * (g % 4))) & 3;
    out->q[e] = low - (((x.hmask[l] >> g) & 1) != 0 ? 0 : 4);
  }
}

void DecodeQ4_K(const void* blocks, int64_t b, DecodedBlock* out) {
  const BlockQ4_K& x = static_cast<const BlockQ4_K*>(blocks)[b];
  out->group = 32;
  out->d = HalfToFloat(x.d);
  out->dm = HalfToFloat(x.dmin);
  for (int j = 0; j < 8; ++j) Q4KScaleMin(x.scales, j, &out->sc[j], &out->mn[j]);
  for (int e = 0; e < kQK_K; ++e) {
    const uint8_t q = x.qs[32 * (e / 64) + e % 32];
    out->q[e] = (e / 32) % 2 == 0 ? q & 0xF : q >> 4;
  }
}

void DecodeQ5_K(const void* blocks, int64_t b, DecodedBlock* out) {
  const BlockQ5_K& x = static_cast<const BlockQ5_K*>(blocks)[b];
  out->group = 32;
  out->d = HalfToFloat(x.d);
  out->dm = HalfToFloat(x.dmin);
  for (int j = 0; j < 8; ++j) Q4KScaleMin(x.scales, j, &out->sc[j], &out->mn[j]);
  for (int e = 0; e < kQK_K; ++e) {
    const int g = e / 32;
    const uint8_t q = x.qs[32 * (e / 64) + e % 32];
    out->q[e] = (g % 2 == 0 ? q & 0xF : q >> 4) | (((x.qh[e % 32] >> g) & 1) << 4);
  }
}

void DecodeQ6_K(const void* blocks, int64_t b, DecodedBlock* out) {
  const BlockQ6_K& x = static_cast<const BlockQ6_K*>(blocks)[b];
  out->group = 16;
  out->d = HalfToFloat(x.d);
  out->dm = 0.0f;
  for (int j = 0; j < 16; ++j) out->sc[j] = x.scales[j];
  std::fill_n(out->mn, 16, 0);
  for (int e = 0; e < kQK_K; ++e) {
    const int h = e / 128, s = (e % 128) / 32, l = e % 32;
    const uint8_t ql = x.ql[64 * h + 32 * (s & 1) + l];
    const int low = s < 2 ? ql & 0xF : ql >> 4;
    const int high = (x.qh[32 * h + l] >> (2 * s)) & 3;
    out->q[e] = (low | (high << 4)) - 32;
  }
}

void QuantizeQ8_K(const float* x, void* dst, int64_t n) {
  BlockQ8_K* y = static_cast<BlockQ8_K*>(dst);
  for (int64_t i = 0; i < n / kQK_K; ++i, x += kQK_K) {
    float max = 0, amax = 0;
    for (int j = 0; j < kQK_K; ++j) {
      if (std::fabs(x[j]) > amax) {
        amax = std::fabs(x[j]);
        max = x[j];
      }
    }
    std::memset(&y[i], 0, sizeof(BlockQ8_K));
    if (amax == 0.0f) continue;
    const float iscale = -127.f / max;
    for (int j = 0; j < kQK_K; ++j) {
      y[i].qs[j] = static_cast<int8_t>(std::min(127, NearestInt(iscale * x[j])));
    }
    for (int j = 0; j < kQK_K / 16; ++j) {
      int sum = 0;
      for (int l = 0; l < 16; ++l) sum += y[i].qs[16 * j + l];
      y[i].bsums[j] = static_cast<int16_t>(sum);
    }
    y[i].d = 1 / iscale;
  }
}

void DequantizeQ8_K(const void* src, float* dst, int64_t n) {
  const BlockQ8_K* x = static_cast<const BlockQ8_K*>(src);
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    for (int j = 0; j < kQK_K; ++j) dst[i * kQK_K + j] = x[i].d * x[i].qs[j];
  }
}

void QuantizeQ2_K(const float* x, void* dst, int64_t n) {
  BlockQ2_K* y = static_cast<BlockQ2_K*>(dst);
  for (int64_t i = 0; i < n / kQK_K; ++i, x += kQK_K) {
    uint8_t L[kQK_K], Laux[16];
    float weights[16], mins[16], scales[16];
    float max_scale = 0, max_min = 0;
    for (int j = 0; j < 16; ++j) {
      for (int l = 0; l < 16; ++l) weights[l] = std::fabs(x[16 * j + l]);
      scales[j] = FitScaleMin(16, 3, x + 16 * j, weights, L + 16 * j, &mins[j], Laux, -0.5f, 0.1f,
                              15, true);
      max_scale = std::max(max_scale, scales[j]);
      max_min = std::max(max_min, mins[j]);
    }
    if (max_scale > 0) {
      const float iscale = 15.f / max_scale;
      for (int j = 0; j < 16; ++j)
        y[i].scales[j] = static_cast<uint8_t>(NearestInt(iscale * scales[j]));
      y[i].d = FloatToHalf(max_scale / 15.f);
    } else {
      std::fill_n(y[i].scales, 16, 0);
      y[i].d = FloatToHalf(0.f);
    }
    if (max_min > 0) {
      const float iscale = 15.f / max_min;
      for (int j = 0; j < 16; ++j) {
        y[i].scales[j] |= static_cast<uint8_t>(NearestInt(iscale * mins[j]) << 4);
      }
      y[i].dmin = FloatToHalf(max_min / 15.f);
    } else {
      y[i].dmin = FloatToHalf(0.f);
    }
    for (int j = 0; j < 16; ++j) {
      const float d = HalfToFloat(y[i].d) * (y[i].scales[j] & 0xF);
      if (d == 0.0f) continue;
      const float dm = HalfToFloat(y[i].dmin) * (y[i].scales[j] >> 4);
      for (int l = 0; l < 16; ++l) {
        L[16 * j + l] =
            static_cast<uint8_t>(std::clamp(NearestInt((x[16 * j + l] + dm) / d), 0, 3));
      }
    }
    Pack2Bits(L, y[i].qs);
  }
}

void QuantizeQ3_K(const float* x, void* dst, int64_t n) {
  BlockQ3_K* y = static_cast<BlockQ3_K*>(dst);
  for (int64_t i = 0; i < n / kQK_K; ++i, x += kQK_K) {
    int8_t L[kQK_K];
    float scales[16];
    float max_scale = 0, amax = 0;
    for (int j = 0; j < 16; ++j) {
      scales[j] = FitQ3(16, 4, x + 16 * j, L + 16 * j);
      if (std::fabs(scales[j]) > amax) {
        amax = std::fabs(scales[j]);
        max_scale = scales[j];
      }
    }
    std::memset(y[i].scales, 0, 12);
    if (max_scale != 0.0f) {
      const float iscale = -32.f / max_scale;
      for (int j = 0; j < 16; ++j) {
        int l = std::clamp(NearestInt(iscale * scales[j]), -32, 31) + 32;
        if (j < 8) {
          y[i].scales[j] = static_cast<uint8_t>(l & 0xF);
        } else {
          y[i].scales[j - 8] |= static_cast<uint8_t>((l & 0xF) << 4);
        }
        l >>= 4;
        y[i].scales[j % 4 + 8] |= static_cast<uint8_t>(l << (2 * (j / 4)));
      }
      y[i].d = FloatToHalf(1 / iscale);
    } else {
      y[i].d = FloatToHalf(0.f);
    }
    int32_t sc[16];
    Q3KScales(y[i].scales, sc);
    for (int j = 0; j < 16; ++j) {
      const float d = HalfToFloat(y[i].d) * sc[j];
      if (d == 0.0f) continue;
      for (int l = 0; l < 16; ++l) {
        L[16 * j + l] = static_cast<int8_t>(std::clamp(NearestInt(x[16 * j + l] / d), -4, 3) + 4);
      }
    }
    // Bit 2 of quant j goes to bit j / 32 of hmask[j % 32]; the low 2 bits are packed as Q2_K's.
    std::memset(y[i].hmask, 0, 32);
    uint8_t low[kQK_K];
    for (int j = 0; j < kQK_K; ++j) {
      int l = L[j];
      if (l > 3) {
        y[i].hmask[j % 32] |= static_cast<uint8_t>(1 << (j / 32));
        l -= 4;
      }
      low[j] = static_cast<uint8_t>(l);
    }
    Pack2Bits(low, y[i].qs);
  }
}

void QuantizeQ4_K(const float* x, void* dst, int64_t n) {
  BlockQ4_K* y = static_cast<BlockQ4_K*>(dst);
  for (int64_t i = 0; i < n / kQK_K; ++i, x += kQK_K) {
    uint8_t L[kQK_K];
    QuantizeQ45KScales(x, 15, -1.f, 20, &y[i], L);
    for (int c = 0; c < 4; ++c) {
      for (int l = 0; l < 32; ++l) {
        y[i].qs[32 * c + l] = static_cast<uint8_t>(L[64 * c + l] | (L[64 * c + 32 + l] << 4));
      }
    }
  }
}

void QuantizeQ5_K(const float* x, void* dst, int64_t n) {
  BlockQ5_K* y = static_cast<BlockQ5_K*>(dst);
  for (int64_t i = 0; i < n / kQK_K; ++i, x += kQK_K) {
    uint8_t L[kQK_K];
    QuantizeQ45KScales(x, 31, -0.5f, 15, &y[i], L);
    std::memset(y[i].qh, 0, 32);
    for (int c = 0; c < 4; ++c) {
      for (int l = 0; l < 32; ++l) {
        int l1 = L[64 * c + l], l2 = L[64 * c + 32 + l];
        if (l1 > 15) {
          l1 -= 16;
          y[i].qh[l] |= static_cast<uint8_t>(1 << (2 * c));
        }
        if (l2 > 15) {
          l2 -= 16;
          y[i].qh[l] |= static_cast<uint8_t>(2 << (2 * c));
        }
        y[i].qs[32 * c + l] = static_cast<uint8_t>(l1 | (l2 << 4));
      }
    }
  }
}

void QuantizeQ6_K(const float* x, void* dst, int64_t n) {
  BlockQ6_K* y = static_cast<BlockQ6_K*>(dst);
  for (int64_t i = 0; i < n / kQK_K; ++i, x += kQK_K) {
    int8_t L[kQK_K];
    float scales[16];
    float max_scale = 0, max_abs_scale = 0;
    for (int j = 0; j < 16; ++j) {
      scales[j] = FitSymmetric(16, 32, x + 16 * j, L + 16 * j);
      if (std::fabs(scales[j]) > max_abs_scale) {
        max_abs_scale = std::fabs(scales[j]);
        max_scale = scales[j];
      }
    }
    if (max_abs_scale < kGroupMaxEps) {
      std::memset(&y[i], 0, sizeof(BlockQ6_K));
      continue;
    }
    const float iscale = -128.f / max_scale;
    y[i].d = FloatToHalf(1 / iscale);
    for (int j = 0; j < 16; ++j) {
      y[i].scales[j] = static_cast<int8_t>(std::min(127, NearestInt(iscale * scales[j])));
    }
    for (int j = 0; j < 16; ++j) {
      const float d = HalfToFloat(y[i].d) * y[i].scales[j];
      if (d == 0.0f) continue;
      for (int l = 0; l < 16; ++l) {
        L[16 * j + l] =
            static_cast<int8_t>(std::clamp(NearestInt(x[16 * j + l] / d), -32, 31) + 32);
      }
    }
    for (int h = 0; h < 2; ++h) {
      const int8_t* e = L + 128 * h;
      for (int l = 0; l < 32; ++l) {
        y[i].ql[64 * h + l] = static_cast<uint8_t>((e[l] & 0xF) | ((e[l + 64] & 0xF) << 4));
        y[i].ql[64 * h + 32 + l] =
            static_cast<uint8_t>((e[l + 32] & 0xF) | ((e[l + 96] & 0xF) << 4));
        y[i].qh[32 * h + l] =
            static_cast<uint8_t>((e[l] >> 4) | ((e[l + 32] >> 4) << 2) | ((e[l + 64] >> 4) << 4) |
                                 ((e[l + 96] >> 4) << 6));
      }
    }
  }
}

}  // namespace thermocline::ops_internal
