// The block layouts of the weight types beyond Q8_0 / Q4_0, checked on blocks built by hand from
// the layout descriptions of ggml_types.h (scales, mins and quants chosen, each element's value
// computed here): every ISA's to_float gives those values, and the reference quantizers give
// back the same blocks. Also the Q8_K activation quantizer on every ISA.
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "engine/ops/kernels.h"
#include "engine/ops/type_table.h"

namespace thermocline {
namespace {

constexpr uint16_t kHalfOne = 0x3C00;   // 1.0
constexpr uint16_t kHalfHalf = 0x3800;  // 0.5
constexpr uint16_t kHalfTwo = 0x4000;   // 2.0

// A block of `type` as raw bytes and the value of each of its elements.
struct HandBlock {
  GgmlType type;
  std::vector<uint8_t> bytes;
  std::vector<float> values;
};

template <class Block>
std::vector<uint8_t> Bytes(const Block& b) {
  std::vector<uint8_t> v(sizeof(Block));
  std::memcpy(v.data(), &b, sizeof(Block));
  return v;
}

// Quant j of a 32-element block: low nibble of byte j (j < 16), high nibble of byte j - 16.
void PutNibble(uint8_t* qs, int j, int q) {
  if (j < 16) {
    qs[j] = static_cast<uint8_t>((qs[j] & 0xF0) | q);
  } else {
    qs[j - 16] = static_cast<uint8_t>((qs[j - 16] & 0x0F) | (q << 4));
  }
}

std::vector<HandBlock> HandBlocks() {
  std::vector<HandBlock> out;
  {  // Q4_1: d = 0.5, m = -1, q = j % 16: x = 0.5 q - 1
    BlockQ4_1 b{};
    b.d = kHalfHalf;
    b.m = 0xBC00;  // -1
    std::vector<float> v(32);
    for (int j = 0; j < 32; ++j) {
      PutNibble(b.qs, j, j % 16);
      v[j] = 0.5f * (j % 16) - 1.0f;
    }
    out.push_back({GgmlType::kQ4_1, Bytes(b), v});
  }
  {  // Q5_0: d = 2, q = j (0..31): x = 2 (j - 16); bit 4 of q in bit j of qh
    BlockQ5_0 b{};
    b.d = kHalfTwo;
    uint32_t qh = 0;
    std::vector<float> v(32);
    for (int j = 0; j < 32; ++j) {
      PutNibble(b.qs, j, j & 15);
      qh |= static_cast<uint32_t>(j >> 4) << j;
      v[j] = 2.0f * (j - 16);
    }
    std::memcpy(b.qh, &qh, 4);
    out.push_back({GgmlType::kQ5_0, Bytes(b), v});
  }
  {  // Q5_1: d = 1, m = 0.5, q = 31 - j: x = 31 - j + 0.5
    BlockQ5_1 b{};
    b.d = kHalfOne;
    b.m = kHalfHalf;
    uint32_t qh = 0;
    std::vector<float> v(32);
    for (int j = 0; j < 32; ++j) {
      const int q = 31 - j;
      PutNibble(b.qs, j, q & 15);
      qh |= static_cast<uint32_t>(q >> 4) << j;
      v[j] = q + 0.5f;
    }
    std::memcpy(b.qh, &qh, 4);
    out.push_back({GgmlType::kQ5_1, Bytes(b), v});
  }
  {  // IQ4_NL: d = 0.5, q = j % 16: x = 0.5 * table[q]
    BlockIQ4_NL b{};
    b.d = kHalfHalf;
    std::vector<float> v(32);
    for (int j = 0; j < 32; ++j) {
      PutNibble(b.qs, j, (j * 7) % 16);
      v[j] = 0.5f * kIq4nlValues[(j * 7) % 16];
    }
    out.push_back({GgmlType::kIQ4_NL, Bytes(b), v});
  }
  {  // Q2_K: group g (of 16) scale g % 16, min 15 - g; d = 1, dmin = 0.5; q = e % 4
    BlockQ2_K b{};
    b.d = kHalfOne;
    b.dmin = kHalfHalf;
    std::vector<float> v(256);
    for (int g = 0; g < 16; ++g) b.scales[g] = static_cast<uint8_t>(g | ((15 - g) << 4));
    for (int e = 0; e < 256; ++e) {
      const int q = (e / 3) % 4;
      b.qs[32 * (e / 128) + e % 32] |= static_cast<uint8_t>(q << (2 * ((e % 128) / 32)));
      v[e] = 1.0f * (e / 16) * q - 0.5f * (15 - e / 16);
    }
    out.push_back({GgmlType::kQ2_K, Bytes(b), v});
  }
  {  // Q3_K: scale of group g = g - 8 (6-bit g + 24), d = 0.5; q = e % 8 - 4
    BlockQ3_K b{};
    b.d = kHalfHalf;
    for (int g = 0; g < 16; ++g) {
      const int l = g - 8 + 32;  // stored value
      if (g < 8) {
        b.scales[g] |= static_cast<uint8_t>(l & 0xF);
      } else {
        b.scales[g - 8] |= static_cast<uint8_t>((l & 0xF) << 4);
      }
      b.scales[8 + g % 4] |= static_cast<uint8_t>((l >> 4) << (2 * (g / 4)));
    }
    std::vector<float> v(256);
    for (int e = 0; e < 256; ++e) {
      const int u = (e * 5) % 8;  // 0..7, value u - 4
      b.qs[32 * (e / 128) + e % 32] |= static_cast<uint8_t>((u & 3) << (2 * ((e % 128) / 32)));
      if (u & 4) b.hmask[e % 32] |= static_cast<uint8_t>(1 << (e / 32));
      v[e] = 0.5f * (e / 16 - 8) * (u - 4);
    }
    out.push_back({GgmlType::kQ3_K, Bytes(b), v});
  }
  // Q4_K and Q5_K: group j (of 32) scale 3 + 7 j (6 bits), min 60 - 8 j; d = 0.5, dmin = 0.25.
  const auto pack_k4 = [](uint8_t* scales, int j, int sc, int m) {
    if (j < 4) {
      scales[j] = static_cast<uint8_t>(sc);
      scales[j + 4] = static_cast<uint8_t>(m);
    } else {
      scales[j + 4] = static_cast<uint8_t>((sc & 0xF) | ((m & 0xF) << 4));
      scales[j - 4] |= static_cast<uint8_t>((sc >> 4) << 6);
      scales[j] |= static_cast<uint8_t>((m >> 4) << 6);
    }
  };
  for (const bool five : {false, true}) {
    BlockQ5_K b{};  // Q4_K is Q5_K without qh
    b.d = kHalfHalf;
    b.dmin = 0x3400;  // 0.25
    for (int j = 0; j < 8; ++j) pack_k4(b.scales, j, 3 + 7 * j, 60 - 8 * j);
    std::vector<float> v(256);
    for (int e = 0; e < 256; ++e) {
      const int j = e / 32;
      const int q = five ? (e * 11) % 32 : (e * 11) % 16;
      uint8_t& byte = b.qs[32 * (e / 64) + e % 32];
      byte |= static_cast<uint8_t>((q & 15) << (j % 2 == 0 ? 0 : 4));
      if (q & 16) b.qh[e % 32] |= static_cast<uint8_t>(1 << j);
      v[e] = 0.5f * (3 + 7 * j) * q - 0.25f * (60 - 8 * j);
    }
    if (five) {
      out.push_back({GgmlType::kQ5_K, Bytes(b), v});
    } else {
      BlockQ4_K b4{};
      b4.d = b.d;
      b4.dmin = b.dmin;
      std::memcpy(b4.scales, b.scales, 12);
      std::memcpy(b4.qs, b.qs, 128);
      out.push_back({GgmlType::kQ4_K, Bytes(b4), v});
    }
  }
  {  // Q6_K: group scale 9 g - 70 (int8), d = 0.25; q = e % 64 - 32
    BlockQ6_K b{};
    b.d = 0x3400;
    for (int g = 0; g < 16; ++g) b.scales[g] = static_cast<int8_t>(9 * g - 70);
    std::vector<float> v(256);
    for (int e = 0; e < 256; ++e) {
      const int h = e / 128, s = (e % 128) / 32, l = e % 32;
      const int q = (e * 13) % 64;
      b.ql[64 * h + 32 * (s & 1) + l] |= static_cast<uint8_t>((q & 15) << (s < 2 ? 0 : 4));
      b.qh[32 * h + l] |= static_cast<uint8_t>((q >> 4) << (2 * s));
      v[e] = 0.25f * (9 * (e / 16) - 70) * (q - 32);
    }
    out.push_back({GgmlType::kQ6_K, Bytes(b), v});
  }
  {  // IQ4_XS: group scale 5 j - 20 (6 bits + 32), d = 0.5; value table[(e * 3) % 16]
    BlockIQ4_XS b{};
    b.d = kHalfHalf;
    for (int j = 0; j < 8; ++j) {
      const int ls = 5 * j - 20 + 32;
      b.scales_l[j / 2] |= static_cast<uint8_t>((ls & 0xF) << (4 * (j % 2)));
      b.scales_h |= static_cast<uint16_t>((ls >> 4) << (2 * j));
    }
    std::vector<float> v(256);
    for (int e = 0; e < 256; ++e) {
      const int q = (e * 3) % 16;
      PutNibble(b.qs + 16 * (e / 32), e % 32, q);
      v[e] = 0.5f * (5 * (e / 32) - 20) * kIq4nlValues[q];
    }
    out.push_back({GgmlType::kIQ4_XS, Bytes(b), v});
  }
  return out;
}

TEST_CASE("hand-built blocks of every new type dequantize to their values", "[kernels]") {
  for (const HandBlock& hb : HandBlocks()) {
    const int64_t n = TypeInfo(hb.type).block_size;
    REQUIRE(static_cast<int64_t>(hb.values.size()) == n);
    REQUIRE(static_cast<int64_t>(hb.bytes.size()) == TypeInfo(hb.type).type_size);
    for (Isa isa : AvailableIsas()) {
      INFO(TypeName(hb.type) << " " << IsaName(isa));
      std::vector<float> got(static_cast<size_t>(n));
      KernelsFor(hb.type, isa)->to_float(hb.bytes.data(), got.data(), n);
      for (int64_t e = 0; e < n; ++e) {
        INFO("element " << e);
        // Products of small integers and powers of two: exact in float.
        CHECK(got[e] == hb.values[e]);
      }
    }
  }
}

TEST_CASE("the reference quantizers reproduce hand-built blocks of exact values", "[kernels]") {
  // Values exactly on a block's grid quantize back to the same block for the types whose
  // quantizer keeps the grid (Q5_0's d = max / -16 and Q4_1/Q5_1's min-max fit are exact here).
  for (const HandBlock& hb : HandBlocks()) {
    if (hb.type != GgmlType::kQ5_0 && hb.type != GgmlType::kQ4_1 && hb.type != GgmlType::kQ5_1) {
      continue;
    }
    INFO(TypeName(hb.type));
    std::vector<uint8_t> got(hb.bytes.size());
    KernelsFor(hb.type, Isa::kScalar)->from_float(hb.values.data(), got.data(), 32);
    std::vector<float> back(32);
    KernelsFor(hb.type, Isa::kScalar)->to_float(got.data(), back.data(), 32);
    CHECK(back == hb.values);
  }
}

TEST_CASE("quantizing then dequantizing stays within each type's step", "[kernels]") {
  std::mt19937 rng(3);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> x(1024);
  for (float& f : x) f = dist(rng);
  // Root-mean-square error relative to the data's, for unit Gaussian weights; bounds a little
  // above what each type's bits give (Q2_K's 2 bits: ~0.3 of the spread).
  struct Case {
    GgmlType type;
    double max_rel_rms;
  };
  for (Case c :
       {Case{GgmlType::kQ4_1, 0.12}, Case{GgmlType::kQ5_0, 0.07}, Case{GgmlType::kQ5_1, 0.06},
        Case{GgmlType::kIQ4_NL, 0.12}, Case{GgmlType::kQ2_K, 0.40}, Case{GgmlType::kQ3_K, 0.22},
        Case{GgmlType::kQ4_K, 0.12}, Case{GgmlType::kQ5_K, 0.06}, Case{GgmlType::kQ6_K, 0.03},
        Case{GgmlType::kIQ4_XS, 0.12}}) {
    std::vector<uint8_t> q(RowBytes(c.type, 1024));
    std::vector<float> back(1024);
    KernelsFor(c.type, Isa::kScalar)->from_float(x.data(), q.data(), 1024);
    KernelsFor(c.type, Isa::kScalar)->to_float(q.data(), back.data(), 1024);
    double err = 0, ref = 0;
    for (int i = 0; i < 1024; ++i) {
      err += (back[i] - x[i]) * (back[i] - x[i]);
      ref += x[i] * x[i];
    }
    INFO(TypeName(c.type) << " relative rms error " << std::sqrt(err / ref));
    CHECK(std::sqrt(err / ref) < c.max_rel_rms);
  }
}

TEST_CASE("Q8_K activations: every ISA quantizes as the reference, on known blocks", "[kernels]") {
  std::vector<float> x(512);
  std::mt19937 rng(8);
  std::uniform_real_distribution<float> dist(-2.0f, 2.0f);
  for (float& f : x) f = dist(rng);
  x[37] = -5.0f;  // the largest magnitude, negative: d = -5 / -127 > 0
  for (int j = 256; j < 512; ++j) x[j] = 0.0f;  // an all-zero block: d = 0, quants 0
  x[300] = 2.5f;
  std::vector<uint8_t> want(RowBytes(GgmlType::kQ8_K, 512)), got(want.size());
  KernelsFor(GgmlType::kQ8_K, Isa::kScalar)->from_float(x.data(), want.data(), 512);
  const BlockQ8_K* b = reinterpret_cast<const BlockQ8_K*>(want.data());
  CHECK(b[0].qs[37] == -127);
  CHECK(b[0].d == 1 / (-127.f / -5.0f));
  CHECK(b[1].qs[300 - 256] == -127);  // max 2.5 > 0: iscale < 0, q = -127
  for (int j = 0; j < 16; ++j) {
    int sum = 0;
    for (int l = 0; l < 16; ++l) sum += b[0].qs[16 * j + l];
    CHECK(b[0].bsums[j] == sum);
  }
  for (Isa isa : AvailableIsas()) {
    INFO(IsaName(isa));
    KernelsFor(GgmlType::kQ8_K, isa)->from_float(x.data(), got.data(), 512);
    CHECK(std::memcmp(want.data(), got.data(), want.size()) == 0);
  }
}

// The activations of Q4_1 and Q5_1 (ggml's block_q8_1): Q8_0's quants and scale, and s, the
// sum of the quants times the unrounded scale amax / 127, rounded to half. Its rounding is what
// the weights' min multiplies, so every ISA must give the same bits, and the dot must use s, not
// d * Σ q (which differs from s by up to half an fp16 ulp of s).
TEST_CASE("Q8_1 activations: s is sum(q) times amax / 127 in half, on every ISA", "[kernels]") {
  std::vector<float> x(256);
  std::mt19937 rng(81);
  std::uniform_real_distribution<float> dist(-1.0f, 1.5f);
  for (float& f : x) f = dist(rng);
  x[5] = 1.7f;
  std::vector<uint8_t> want(RowBytes(GgmlType::kQ8_1, 256)), got(want.size());
  REQUIRE(want.size() == 8 * sizeof(BlockQ8_1));
  KernelsFor(GgmlType::kQ8_1, Isa::kScalar)->from_float(x.data(), want.data(), 256);
  const BlockQ8_1* b = reinterpret_cast<const BlockQ8_1*>(want.data());
  CHECK(b[0].qs[5] == 127);
  CHECK(b[0].d == FloatToHalf(1.7f / 127));
  int mismatched = 0;  // blocks where d_half * sum rounds to another half than s
  for (int k = 0; k < 8; ++k) {
    int sum = 0;
    float amax = 0;
    for (int j = 0; j < 32; ++j) {
      sum += b[k].qs[j];
      amax = std::max(amax, std::fabs(x[32 * k + j]));
    }
    CHECK(b[k].s == FloatToHalf(static_cast<float>(sum) * (amax / 127)));
    mismatched += b[k].s != FloatToHalf(static_cast<float>(sum) * HalfToFloat(b[k].d));
  }
  for (Isa isa : AvailableIsas()) {
    INFO(IsaName(isa));
    KernelsFor(GgmlType::kQ8_1, isa)->from_float(x.data(), got.data(), 256);
    CHECK(std::memcmp(want.data(), got.data(), want.size()) == 0);
    // The Q4_1 dot of weights all equal to their min (q = 0, d = 0, m = 1) is Σ s exactly.
    std::vector<BlockQ4_1> w(8, BlockQ4_1{FloatToHalf(0.0f), FloatToHalf(1.0f), {}});
    double s_total = 0;
    for (int k = 0; k < 8; ++k) s_total += HalfToFloat(b[k].s);
    CHECK(KernelsFor(GgmlType::kQ4_1, isa)->vec_dot(256, w.data(), want.data()) ==
          static_cast<float>(s_total));
  }
  INFO("blocks whose s differs from d_half * sum: " << mismatched);
}

}  // namespace
}  // namespace thermocline
