// Per-type compute kernels (dequantize, quantize, dot with activations, the axpy of the sparse
// down projection), each with a scalar reference that is always compiled and SIMD versions
// chosen once at start-up for the best ISA the CPU has. The weight-type table (type_table.h)
// holds them, one row per type; it feeds both the dispatch and the parity tests.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/ops/ggml_types.h"

namespace thermocline {

// kAvx512Vnni: the AVX-512 kernels with VNNI int8 dot products (vpdpbusd).
enum class Isa { kScalar, kAvx2, kAvx512, kAvx512Vnni };
const char* IsaName(Isa isa);

// The ISAs this CPU can run, scalar first; the last is the best. THERMOCLINE_ISA=<name> (as
// IsaName prints it) caps the list at that ISA, for benchmarks and bisecting.
const std::vector<Isa>& AvailableIsas();
Isa BestIsa();

struct TypeKernels {
  // The format activations are converted to before vec_dot: F32 for float weights, Q8_0 for the
  // 32-element quantized types and Q8_K for the 256-element ones (int8 dot products, as
  // llama.cpp does).
  GgmlType vec_dot_type;
  // dst[0..n) = dequantized src. n a multiple of the block size.
  void (*to_float)(const void* src, float* dst, int64_t n);
  // Converts n floats into this type as ggml's CPU from_float does: how activations become the
  // vec_dot_type of a dot. For Q8_0 and Q8_1 that is ggml's x86 quantizer (x · (127 / amax),
  // ties to even), which every llama.cpp build on a PC computes with; it differs from the
  // reference quantizer of weights below in the last rounding, enough to move an activation
  // across a step now and then. Every other type rounds as ggml's reference does.
  void (*from_float)(const float* src, void* dst, int64_t n);
  // Dot product of a weight row w (this type) with x (vec_dot_type), n elements.
  float (*vec_dot)(int64_t n, const void* w, const void* x);
  // The same weight row against k activation rows at once (x rows x_stride bytes apart):
  // out[j] = dot(w, x + j * x_stride). Reuses the unpacked weights across the k rows; k <= 8.
  void (*vec_dot_multi)(int64_t n, const void* w, const void* x, int64_t x_stride, int k,
                        float* out);
  // Quantizes n floats into weights of this type bit for bit as ggml's reference quantizer
  // (llama-quantize) does, for files and load-time copies; nullptr where from_float is that
  // quantizer (every type but Q8_0). Call it through QuantizeWeights.
  void (*from_float_ref)(const float* src, void* dst, int64_t n) = nullptr;
};

// n floats into weights of the type whose kernels `k` are, as llama-quantize rounds them.
inline void QuantizeWeights(const TypeKernels& k, const float* src, void* dst, int64_t n) {
  (k.from_float_ref != nullptr ? k.from_float_ref : k.from_float)(src, dst, n);
}

// The kernels of `type` for the best ISA; nullptr when the type is not computable.
const TypeKernels* KernelsFor(GgmlType type);
// The kernels of `type` for a given ISA (for the parity harness); nullptr when unavailable.
const TypeKernels* KernelsFor(GgmlType type, Isa isa);

// The axpy of the sparse down projection over rows of one weight type:
// acc[0..n) += Σ_{r<k} a[r] · rows[r][0..n), k <= kMaxAxpyRows (one load and store of acc for
// all k rows); n a multiple of the type's block size.
inline constexpr int kMaxAxpyRows = 8;
using AxpyFn = void (*)(int64_t n, int k, const float* a, const uint8_t* const* rows, float* acc);
// The axpy kernel of `type` on `isa`; nullptr when the type has none or the CPU lacks the ISA.
AxpyFn AxpyFor(GgmlType type, Isa isa);

// One query head's attention for one token over n_kv cached positions: scores[j] =
// scale · q·k_j, p = softmax(scores), out = Σ_j p_j v_j. k_j and v_j are rows of head_dim floats,
// k_stride and v_stride floats apart; scores is scratch for n_kv floats. The second form runs
// the kernel of a given ISA (for the parity harness).
void AttendHead(int64_t n_kv, int64_t head_dim, const float* q, const float* k, int64_t k_stride,
                const float* v, int64_t v_stride, float scale, float* scores, float* out);
void AttendHead(Isa isa, int64_t n_kv, int64_t head_dim, const float* q, const float* k,
                int64_t k_stride, const float* v, int64_t v_stride, float scale, float* scores,
                float* out);
// The general form: q and the k rows of k_dim floats, the v rows and out of v_dim, and when
// softcap > 0 each score capped to softcap · tanh(score / softcap) before the softmax (Gemma 2).
void AttendHead(int64_t n_kv, int64_t k_dim, int64_t v_dim, const float* q, const float* k,
                int64_t k_stride, const float* v, int64_t v_stride, float scale, float softcap,
                float* scores, float* out);
void AttendHead(Isa isa, int64_t n_kv, int64_t k_dim, int64_t v_dim, const float* q, const float* k,
                int64_t k_stride, const float* v, int64_t v_stride, float scale, float softcap,
                float* scores, float* out);

// The rows of one KV head in a cache laid out in tiles of 2^tile_shift positions: the row of
// position p at data + (p >> tile_shift) · tile_stride + (p mod 2^tile_shift) · row_stride, and
// row j of an attention at position first + j. Strided: rows row_stride apart throughout (one
// tile per position). A cache whose tiles hold each head's positions together (the session's)
// gives every head long runs of adjacent rows, which the hardware prefetchers stream, where
// positions side by side give each head pieces of a row a whole row apart.
struct HalfRows {
  const uint16_t* data = nullptr;
  int64_t row_stride = 0;   // halves
  int64_t tile_stride = 0;  // halves
  int64_t first = 0;
  int tile_shift = 0;

  static HalfRows Strided(const uint16_t* rows, int64_t stride) {
    return {rows, stride, stride, 0, 0};
  }
  const uint16_t* Row(int64_t j) const {
    const int64_t p = first + j;
    return data + (p >> tile_shift) * tile_stride +
           (p & ((int64_t{1} << tile_shift) - 1)) * row_stride;
  }
};

// Attention over an F16 cache (llama.cpp's default KV type): k and v rows of halves, strides in
// halves. It computes as llama.cpp's CPU build does, operation for operation (q and the softmax
// weights rounded to half, its products' summation orders, its vector exp), so that a file gives
// llama.cpp's numbers bit for bit. `batched`: the token is one of a batch of two or more, which
// llama.cpp multiplies with another kernel (its gemm) than a single token (its dot).
void AttendHeadF16(int64_t n_kv, int64_t k_dim, int64_t v_dim, const float* q, const uint16_t* k,
                   int64_t k_stride, const uint16_t* v, int64_t v_stride, float scale,
                   float softcap, bool batched, float* scores, float* out);
void AttendHeadF16(Isa isa, int64_t n_kv, int64_t k_dim, int64_t v_dim, const float* q,
                   const uint16_t* k, int64_t k_stride, const uint16_t* v, int64_t v_stride,
                   float scale, float softcap, bool batched, float* scores, float* out);
// AttendHeadF16 for n_heads query heads that share the cached rows k and v (grouped-query
// attention): head h's q at q + h · q_stride, its output at out + h · out_stride, scores scratch
// for n_heads · n_kv floats. Each head's output is AttendHeadF16's for it, bit for bit; the
// kernels read each cached row once for the heads they take together, not once per head.
void AttendGroupF16(int64_t n_kv, int64_t k_dim, int64_t v_dim, int n_heads, const float* q,
                    int64_t q_stride, const HalfRows& k, const HalfRows& v, float scale,
                    float softcap, bool batched, float* scores, float* out, int64_t out_stride);
void AttendGroupF16(Isa isa, int64_t n_kv, int64_t k_dim, int64_t v_dim, int n_heads,
                    const float* q, int64_t q_stride, const HalfRows& k, const HalfRows& v,
                    float scale, float softcap, bool batched, float* scores, float* out,
                    int64_t out_stride);

// gate := silu(gate) · up, n elements, as ggml's CPU computes it (its vector expf on each whole
// 16 elements, expf on the rest), so that a SwiGLU FFN gives llama.cpp's numbers bit for bit.
// The second form runs the kernel of a given ISA (for the parity harness).
void SiluMul(float* gate, const float* up, int64_t n);
void SiluMul(Isa isa, float* gate, const float* up, int64_t n);

// Half and bfloat16 conversion, scalar.
float HalfToFloat(uint16_t h);
uint16_t FloatToHalf(float f);
inline float Bf16ToFloat(uint16_t h) {
  uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  __builtin_memcpy(&f, &bits, 4);
  return f;
}
uint16_t FloatToBf16(float f);  // round to nearest even, NaN kept quiet

}  // namespace thermocline
