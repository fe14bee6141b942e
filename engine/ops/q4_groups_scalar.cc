// The scalar reference of the Q4_0 row-group kernels (kernels_internal.h's layout and
// Q4GroupKernels): always compiled, what the SIMD versions (q4_groups_simd.inc) are tested
// against. Per row and block it computes what they compute per lane: the exact integer dot of
// the unsigned nibbles with the activation quants plus the tile row's correction, then one fused
// multiply-add of it times d_w * d_x into the row's float sum, so every ISA gives the same bits.
#include <cmath>
#include <cstring>

#include "engine/ops/kernels.h"
#include "engine/ops/kernels_internal.h"

namespace thermocline::ops_internal {
namespace {

// ggml's quantize_row_q8_0_ref for each block, into the tile row: quants, float scales, and
// corrections -offset * sum(quants).
void QuantizeTileRowScalar(const float* x, int64_t n, int offset, uint8_t* row) {
  const int64_t nb = n / kQK8_0;
  for (int64_t b = 0; b < nb; ++b) {
    BlockQ8_0 block;
    KernelsFor(GgmlType::kQ8_0, Isa::kScalar)->from_float(x + b * kQK8_0, &block, kQK8_0);
    int32_t sum = 0;
    for (int i = 0; i < kQK8_0; ++i) sum += block.qs[i];
    std::memcpy(row + b * kQK8_0, block.qs, kQK8_0);
    const float d = HalfToFloat(block.d);
    const int32_t corr = -offset * sum;
    std::memcpy(row + nb * kQK8_0 + 4 * b, &d, 4);
    std::memcpy(row + nb * (kQK8_0 + 4) + 4 * b, &corr, 4);
  }
}

// Row i of the group at `group`, against a tile row.
float GroupRowDot(int64_t nb, const uint8_t* group, int i, const uint8_t* act) {
  const int8_t* xq = reinterpret_cast<const int8_t*>(act);
  float sum = 0.0f;
  for (int64_t b = 0; b < nb; ++b) {
    float dx;
    int32_t dot;
    std::memcpy(&dx, act + nb * kQK8_0 + 4 * b, 4);
    std::memcpy(&dot, act + nb * (kQK8_0 + 4) + 4 * b, 4);
    for (int c = 0; c < 4; ++c) {
      const uint8_t* q = group + b * kQ4GroupBlockBytes + (c * kQ4GroupRows + i) * 4;
      for (int k = 0; k < 4; ++k) {
        dot += (q[k] & 0x0F) * xq[b * kQK8_0 + 4 * c + k];
        dot += (q[k] >> 4) * xq[b * kQK8_0 + 16 + 4 * c + k];
      }
    }
    uint16_t d_bits;
    std::memcpy(&d_bits, group + nb * kQ4GroupBlockBytes + (b * kQ4GroupRows + i) * 2, 2);
    sum = std::fma(static_cast<float>(dot), HalfToFloat(d_bits) * dx, sum);
  }
  return sum;
}

void MatVecScalar(int64_t n, const uint8_t* w, size_t group_bytes, int64_t rows, const uint8_t* act,
                  float* y) {
  for (int64_t r = 0; r < rows; ++r) {
    y[r] = GroupRowDot(n / kQK8_0, w + r / kQ4GroupRows * group_bytes,
                       static_cast<int>(r % kQ4GroupRows), act);
  }
}

void GemmScalar(int64_t n, const uint8_t* w, size_t group_bytes, int rows, const uint8_t* act,
                size_t act_stride, int64_t n_tokens, float* y, int64_t y_stride) {
  for (int64_t t = 0; t < n_tokens; ++t) {
    MatVecScalar(n, w, group_bytes, rows, act + t * act_stride, y + t * y_stride);
  }
}

}  // namespace

Q4GroupKernels ScalarQ4GroupKernels() {
  return {QuantizeTileRowScalar, MatVecScalar, GemmScalar, kQ4GroupRows};
}

}  // namespace thermocline::ops_internal
