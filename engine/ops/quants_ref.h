// Internal to engine/ops: the scalar reference of the weight types beyond Q8_0/Q4_0 (Q4_1,
// Q5_0, Q5_1, IQ4_NL, the K-quants Q2_K..Q6_K, IQ4_XS) and of the Q8_K activations: each block
// decoded into integers, and the quantizers llama.cpp's llama-quantize runs for these types
// without an importance matrix (quants_legacy.cc, quants_k.cc). The scalar kernel table
// (kernels_scalar.cc) and the SIMD tables' slow paths are built on these.
#pragma once

#include <cstdint>

#include "engine/ops/ggml_types.h"

namespace thermocline::ops_internal {

// One block of a weight type as integers: element e of group g (`group` elements each) is
//   w[e] = d * sc[g] * q[e] - dm * mn[g]
// with offsets folded into q (Q5_0's q - 16, Q6_K's q - 32, ...), so that evaluating it in float
// in that order gives ggml's dequantized value. Groups: 32-element blocks are one group.
struct DecodedBlock {
  int group = 32;
  float d = 0.0f, dm = 0.0f;
  int32_t sc[16] = {};
  int32_t mn[16] = {};
  int32_t q[kQK_K] = {};
};
// Decodes block `b` of a row of blocks of the type into *out.
using DecodeFn = void (*)(const void* blocks, int64_t b, DecodedBlock* out);

void DecodeQ4_1(const void* blocks, int64_t b, DecodedBlock* out);
void DecodeQ5_0(const void* blocks, int64_t b, DecodedBlock* out);
void DecodeQ5_1(const void* blocks, int64_t b, DecodedBlock* out);
void DecodeIQ4_NL(const void* blocks, int64_t b, DecodedBlock* out);
void DecodeQ2_K(const void* blocks, int64_t b, DecodedBlock* out);
void DecodeQ3_K(const void* blocks, int64_t b, DecodedBlock* out);
void DecodeQ4_K(const void* blocks, int64_t b, DecodedBlock* out);
void DecodeQ5_K(const void* blocks, int64_t b, DecodedBlock* out);
void DecodeQ6_K(const void* blocks, int64_t b, DecodedBlock* out);
void DecodeIQ4_XS(const void* blocks, int64_t b, DecodedBlock* out);

// Q4_K / Q5_K: the 6-bit scale and min of group j (0..7) from the 12 packed bytes.
void Q4KScaleMin(const uint8_t* scales, int j, int* sc, int* m);
// Q3_K: the 16 signed 6-bit scales (-32..31) from the 12 packed bytes.
void Q3KScales(const uint8_t* scales, int32_t out[16]);

// The quantizers (n a multiple of the block size). Q4_1, Q5_0, Q5_1 and the K-quants are
// ggml's quantize_row_*_ref; IQ4_NL and IQ4_XS are ggml's quantize_iq4_nl / quantize_iq4_xs
// without weights (what llama-quantize writes; their _ref variants search less).
void QuantizeQ4_1(const float* x, void* dst, int64_t n);
void QuantizeQ5_0(const float* x, void* dst, int64_t n);
void QuantizeQ5_1(const float* x, void* dst, int64_t n);
void QuantizeIQ4_NL(const float* x, void* dst, int64_t n);
void QuantizeIQ4_XS(const float* x, void* dst, int64_t n);
void QuantizeQ2_K(const float* x, void* dst, int64_t n);
void QuantizeQ3_K(const float* x, void* dst, int64_t n);
void QuantizeQ4_K(const float* x, void* dst, int64_t n);
void QuantizeQ5_K(const float* x, void* dst, int64_t n);
void QuantizeQ6_K(const float* x, void* dst, int64_t n);
// ggml's quantize_row_q8_K_ref: d = max / -127 of the element of largest magnitude, q =
// nearest(x / d) capped at 127, bsums the sums of 16.
void QuantizeQ8_K(const float* x, void* dst, int64_t n);
void DequantizeQ8_K(const void* src, float* dst, int64_t n);

// Round to nearest, ties to even (ggml's nearest_int, for |x| < 2^22).
int NearestInt(float x);

}  // namespace thermocline::ops_internal
