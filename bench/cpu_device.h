// A CPU stand-in for the GPU (engine/gpu/device.h), so that the engine's front door, its device
// plan, its one memory budget and the hybrid split and merge run on any machine. Its whole
// layers compute attention, the dense FFN (or the host FFN of a hybrid layer) and the head with
// the CPU's operators and a KV cache of their own; its FFN executor computes the device part of
// a hybrid layer with the scalar row dots and the axpy reference, in both modes (the resident
// one: only the host's partial sum crosses back); an input-sparse whole layer reads its column
// layouts as the CUDA kernel does, a gate-first one the CPU's gate-first rows. Both reserve in the
// spec's budget the bytes the CUDA backend would (gpu::ComputeGpuLayersMemory, the device rows), so
// a cap refuses here what it refuses on a GPU. Test and benchmark use only: it is slow and
// allocates per call.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

#include "engine/gpu/device.h"

namespace thermocline {

// What the CUDA column-sparse mat-vec (engine/cuda/cuda_kernels.h's ColumnMatVec) computes, on
// the host, as the stand-in's input-sparse layers run it: y: (c.out) over the inputs with
// |x_i| > threshold, x_i != 0; per block of 32 inputs the kept entries quantized to int8
// (d = amax / 127, ties to even) and summed against the integer form's quants in integers, or
// the kRows form's rows in floats.
void ColumnMatVecOnHost(const gpu::ColumnLayout& c, const float* x, float threshold, float* y);

class CpuStandInDevice : public gpu::Device {
 public:
  // free_bytes: the device memory Probe reports.
  explicit CpuStandInDevice(uint64_t free_bytes = uint64_t{64} << 30) : free_bytes_(free_bytes) {}

  absl::StatusOr<gpu::DeviceInfo> Probe(int index) const override;
  absl::StatusOr<std::unique_ptr<gpu::Queue>> CreateQueue(int index) const override;
  absl::StatusOr<std::unique_ptr<gpu::GpuLayers>> CreateLayers(
      const gpu::GpuLayersSpec& spec) const override;
  absl::StatusOr<std::unique_ptr<gpu::GpuFfnExecutor>> CreateFfnExecutor(
      const gpu::GpuFfnSpec& spec) const override;

  // Calls into what it created so far: layer runs handed to its layers, FFN launches (either
  // mode), and hybrid layer-tokens run resident (only the host's partial sum crossing back).
  int64_t layer_calls() const { return layer_calls_.load(); }
  int64_t ffn_launches() const { return ffn_launches_.load(); }
  int64_t resident_calls() const { return resident_calls_.load(); }
  // Token-layers its whole layers ran input-sparse (through their column layouts).
  int64_t input_sparse_tokens() const { return input_sparse_tokens_.load(); }
  // Token-layers its whole layers ran gate-first.
  int64_t gate_first_tokens() const { return gate_first_tokens_.load(); }

 private:
  const uint64_t free_bytes_;
  mutable std::atomic<int64_t> layer_calls_{0};
  mutable std::atomic<int64_t> ffn_launches_{0};
  mutable std::atomic<int64_t> resident_calls_{0};
  mutable std::atomic<int64_t> input_sparse_tokens_{0};
  mutable std::atomic<int64_t> gate_first_tokens_{0};
};

}  // namespace thermocline
