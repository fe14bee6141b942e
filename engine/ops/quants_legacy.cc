// Q4_1, Q5_0, Q5_1 (ggml's 32-element types with a min or a fifth bit) and the non-linear IQ4_NL
// and IQ4_XS, scalar: each block decoded into integers (quants_ref.h's DecodedBlock) and the
// quantizers llama-quantize runs for them without an importance matrix.
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>

#include "engine/ops/kernels.h"
#include "engine/ops/quants_ref.h"

namespace thermocline::ops_internal {
namespace {

constexpr float kGroupMaxEps = 1e-15f;

// Element j (< 32) of a block's nibbles: low nibble of qs[j] for j < 16, high of qs[j - 16].
int Nibble(const uint8_t* qs, int j) { return j < 16 ? qs[j] & 0xF : qs[j - 16] >> 4; }
// Bit j of a 32-bit little-endian mask.
int Bit(const uint8_t* qh, int j) { return (qh[j / 8] >> (j % 8)) & 1; }

// Packs 32 quants in 0..31: the low 4 bits as nibbles (element j and j + 16 share byte j),
// bit 4 of element j into bit j of qh.
void PackFive(const int* q, uint8_t* qs, uint8_t* qh) {
  uint32_t high = 0;
  for (int j = 0; j < 16; ++j) {
    qs[j] = static_cast<uint8_t>((q[j] & 0xF) | ((q[j + 16] & 0xF) << 4));
    high |= static_cast<uint32_t>((q[j] & 0x10) >> 4) << j;
    high |= static_cast<uint32_t>((q[j + 16] & 0x10) >> 4) << (j + 16);
  }
  std::memcpy(qh, &high, 4);
}

// The index of the value nearest x in a sorted table of 16 (ties to the lower).
int NearestValue(const int8_t* values, float x) {
  if (x <= values[0]) return 0;
  if (x >= values[15]) return 15;
  int lo = 0, hi = 15;
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    if (x < values[mid]) {
      hi = mid;
    } else {
      lo = mid;
    }
  }
  return x - values[hi - 1] < values[hi] - x ? hi - 1 : hi;
}

// IQ4 quantization of one super-block of n (32 for IQ4_NL, 256 for IQ4_XS) in groups of 32,
// weights x^2 (ggml's quantize_row_iq4_nl_impl with 7 tries and no importance matrix): each
// group's scale is the best least-squares fit over 15 trial scales; with several groups the
// scales are then quantized to 6 bits against d = -max / 32 and the quants recomputed.
// Writes *d (fp16 bits), the packed quants and, with several groups, the 6-bit scales.
void QuantizeIq4Block(const float* x, int n, uint16_t* d_out, uint8_t* q4, uint16_t* scales_h,
                      uint8_t* scales_l) {
  constexpr int kTries = 7;
  const int8_t* values = kIq4nlValues;
  uint8_t L[kQK_K];
  float scales[8], weight[32];
  std::memset(q4, 0, n / 2);
  *d_out = FloatToHalf(0.f);
  float max_scale = 0, amax_scale = 0;
  for (int ib = 0; ib < n / 32; ++ib) {
    const float* xb = x + 32 * ib;
    uint8_t* Lb = L + 32 * ib;
    for (int j = 0; j < 32; ++j) weight[j] = xb[j] * xb[j];
    float amax = 0, max = 0;
    for (int j = 0; j < 32; ++j) {
      if (std::fabs(xb[j]) > amax) {
        amax = std::fabs(xb[j]);
        max = xb[j];
      }
    }
    if (amax < kGroupMaxEps) {
      scales[ib] = 0;
      continue;
    }
    float d = -max / values[0];
    float id = 1 / d;
    float sumqx = 0, sumq2 = 0;
    for (int j = 0; j < 32; ++j) {
      const int l = NearestValue(values, id * xb[j]);
      Lb[j] = static_cast<uint8_t>(l);
      const float q = values[l];
      sumqx += weight[j] * q * xb[j];
      sumq2 += weight[j] * q * q;
    }
    d = sumqx / sumq2;
    float best = d * sumqx;
    for (int itry = -kTries; itry <= kTries; ++itry) {
      id = (itry + values[0]) / max;
      sumqx = sumq2 = 0;
      for (int j = 0; j < 32; ++j) {
        const float q = values[NearestValue(values, id * xb[j])];
        sumqx += weight[j] * q * xb[j];
        sumq2 += weight[j] * q * q;
      }
      if (sumq2 > 0 && sumqx * sumqx > best * sumq2) {
        d = sumqx / sumq2;
        best = d * sumqx;
      }
    }
    scales[ib] = d;
    if (std::fabs(d) > amax_scale) {
      amax_scale = std::fabs(d);
      max_scale = d;
    }
  }
  if (n > 32) {
    *scales_h = 0;
    const float d = -max_scale / 32;
    *d_out = FloatToHalf(d);
    const float id = d != 0.0f ? 1 / d : 0.f;
    for (int ib = 0; ib < n / 32; ++ib) {
      int l = std::clamp(NearestInt(id * scales[ib]), -32, 31);
      const float dl = d * l;
      const float idl = dl != 0.0f ? 1 / dl : 0.f;
      for (int j = 0; j < 32; ++j) {
        L[32 * ib + j] = static_cast<uint8_t>(NearestValue(values, idl * x[32 * ib + j]));
      }
      l += 32;
      if (ib % 2 == 0) {
        scales_l[ib / 2] = static_cast<uint8_t>(l & 0xF);
      } else {
        scales_l[ib / 2] |= static_cast<uint8_t>((l & 0xF) << 4);
      }
      *scales_h |= static_cast<uint16_t>((l >> 4) << (2 * ib));
    }
  } else {
    *d_out = FloatToHalf(scales[0]);
    const float id = scales[0] != 0.0f ? 1 / scales[0] : 0;
    for (int j = 0; j < 32; ++j) L[j] = static_cast<uint8_t>(NearestValue(values, id * x[j]));
  }
  for (int i = 0; i < n / 32; ++i) {
    for (int j = 0; j < 16; ++j) {
      q4[16 * i + j] = static_cast<uint8_t>(L[32 * i + j] | (L[32 * i + 16 + j] << 4));
    }
  }
}

// The min and max of a block of 32, for the types x = d * q + min.
void MinMax(const float* x, float* min, float* max) {
  *min = FLT_MAX;
  *max = -FLT_MAX;
  for (int j = 0; j < 32; ++j) {
    *min = std::min(*min, x[j]);
    *max = std::max(*max, x[j]);
  }
}

}  // namespace

void DecodeQ4_1(const void* blocks, int64_t b, DecodedBlock* out) {
  const BlockQ4_1& x = static_cast<const BlockQ4_1*>(blocks)[b];
  out->group = 32;
  out->d = HalfToFloat(x.d);
  out->dm = HalfToFloat(x.m);  // w = d q - m (-1): the min is added
  out->sc[0] = 1;
  out->mn[0] = -1;
  for (int j = 0; j < 32; ++j) out->q[j] = Nibble(x.qs, j);
}

void DecodeQ5_0(const void* blocks, int64_t b, DecodedBlock* out) {
  const BlockQ5_0& x = static_cast<const BlockQ5_0*>(blocks)[b];
  out->group = 32;
  out->d = HalfToFloat(x.d);
  out->dm = 0.0f;
  out->sc[0] = 1;
  out->mn[0] = 0;
  for (int j = 0; j < 32; ++j) out->q[j] = (Nibble(x.qs, j) | (Bit(x.qh, j) << 4)) - 16;
}

void DecodeQ5_1(const void* blocks, int64_t b, DecodedBlock* out) {
  const BlockQ5_1& x = static_cast<const BlockQ5_1*>(blocks)[b];
  out->group = 32;
  out->d = HalfToFloat(x.d);
  out->dm = HalfToFloat(x.m);
  out->sc[0] = 1;
  out->mn[0] = -1;
  for (int j = 0; j < 32; ++j) out->q[j] = Nibble(x.qs, j) | (Bit(x.qh, j) << 4);
}

void DecodeIQ4_NL(const void* blocks, int64_t b, DecodedBlock* out) {
  const BlockIQ4_NL& x = static_cast<const BlockIQ4_NL*>(blocks)[b];
  out->group = 32;
  out->d = HalfToFloat(x.d);
  out->dm = 0.0f;
  out->sc[0] = 1;
  out->mn[0] = 0;
  for (int j = 0; j < 32; ++j) out->q[j] = kIq4nlValues[Nibble(x.qs, j)];
}

void DecodeIQ4_XS(const void* blocks, int64_t b, DecodedBlock* out) {
  const BlockIQ4_XS& x = static_cast<const BlockIQ4_XS*>(blocks)[b];
  out->group = 32;
  out->d = HalfToFloat(x.d);
  out->dm = 0.0f;
  for (int ib = 0; ib < 8; ++ib) {
    const int ls =
        ((x.scales_l[ib / 2] >> (4 * (ib % 2))) & 0xF) | (((x.scales_h >> (2 * ib)) & 3) << 4);
    out->sc[ib] = ls - 32;
    out->mn[ib] = 0;
    for (int j = 0; j < 32; ++j) out->q[32 * ib + j] = kIq4nlValues[Nibble(x.qs + 16 * ib, j)];
  }
}

void QuantizeQ4_1(const float* src, void* dst, int64_t n) {
  BlockQ4_1* y = static_cast<BlockQ4_1*>(dst);
  for (int64_t i = 0; i < n / 32; ++i) {
    const float* x = src + 32 * i;
    float min, max;
    MinMax(x, &min, &max);
    const float d = (max - min) / 15;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[i].d = FloatToHalf(d);
    y[i].m = FloatToHalf(min);
    for (int j = 0; j < 16; ++j) {
      const int q0 = std::min(15, static_cast<int>(static_cast<int8_t>((x[j] - min) * id + 0.5f)));
      const int q1 =
          std::min(15, static_cast<int>(static_cast<int8_t>((x[j + 16] - min) * id + 0.5f)));
      y[i].qs[j] = static_cast<uint8_t>(q0 | (q1 << 4));
    }
  }
}

void QuantizeQ5_0(const float* src, void* dst, int64_t n) {
  BlockQ5_0* y = static_cast<BlockQ5_0*>(dst);
  for (int64_t i = 0; i < n / 32; ++i) {
    const float* x = src + 32 * i;
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < 32; ++j) {
      if (amax < std::fabs(x[j])) {
        amax = std::fabs(x[j]);
        max = x[j];
      }
    }
    const float d = max / -16;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[i].d = FloatToHalf(d);
    int q[32];
    for (int j = 0; j < 32; ++j) {
      q[j] = std::min(31, static_cast<int>(static_cast<int8_t>(x[j] * id + 16.5f)));
    }
    PackFive(q, y[i].qs, y[i].qh);
  }
}

void QuantizeQ5_1(const float* src, void* dst, int64_t n) {
  BlockQ5_1* y = static_cast<BlockQ5_1*>(dst);
  for (int64_t i = 0; i < n / 32; ++i) {
    const float* x = src + 32 * i;
    float min, max;
    MinMax(x, &min, &max);
    const float d = (max - min) / 31;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y[i].d = FloatToHalf(d);
    y[i].m = FloatToHalf(min);
    int q[32];
    for (int j = 0; j < 32; ++j) q[j] = static_cast<uint8_t>((x[j] - min) * id + 0.5f);
    PackFive(q, y[i].qs, y[i].qh);
  }
}

void QuantizeIQ4_NL(const float* x, void* dst, int64_t n) {
  BlockIQ4_NL* y = static_cast<BlockIQ4_NL*>(dst);
  for (int64_t i = 0; i < n / 32; ++i) {
    QuantizeIq4Block(x + 32 * i, 32, &y[i].d, y[i].qs, nullptr, nullptr);
  }
}

void QuantizeIQ4_XS(const float* x, void* dst, int64_t n) {
  BlockIQ4_XS* y = static_cast<BlockIQ4_XS*>(dst);
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    QuantizeIq4Block(x + kQK_K * i, kQK_K, &y[i].d, y[i].qs, &y[i].scales_h, y[i].scales_l);
  }
}

}  // namespace thermocline::ops_internal
