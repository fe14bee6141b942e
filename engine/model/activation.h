// The FFN's gating nonlinearity and its names.
#pragma once

#include <string>

#include "absl/status/statusor.h"

namespace thermocline {

// SwiGLU silu(gate)*up, ReGLU relu(gate)*up, dReLU relu(gate)*relu(up), and GeGLU with the tanh
// approximation of GELU, gelu(gate)*up (Gemma). The order is the CUDA kernels' numbering.
enum class FfnActivation { kSilu, kRelu, kDRelu, kGeluTanh };
const char* ActivationName(FfnActivation a);
// Accepts "silu"/"swiglu", "relu"/"reglu", "drelu": the choices a llama file's
// feed_forward_activation or a caller's override has. GELU is a family's own (Gemma).
absl::StatusOr<FfnActivation> ParseActivation(const std::string& name);
// ReGLU and dReLU: the activation is zero wherever the gate is <= 0, so a neuron whose gate does
// not fire needs neither its up row nor its down row.
inline bool GateDecides(FfnActivation a) {
  return a == FfnActivation::kRelu || a == FfnActivation::kDRelu;
}

}  // namespace thermocline
