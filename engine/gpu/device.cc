// CudaDevice: the Device interface over the CUDA backend's entry points (or gpu_none.cc's).
#include "engine/gpu/device.h"

namespace thermocline::gpu {
namespace {

class Cuda : public Device {
 public:
  absl::StatusOr<DeviceInfo> Probe(int index) const override { return gpu::Probe(index); }
  absl::StatusOr<std::unique_ptr<Queue>> CreateQueue(int index) const override {
    return CreateCudaQueue(index);
  }
  absl::StatusOr<std::unique_ptr<GpuLayers>> CreateLayers(
      const GpuLayersSpec& spec) const override {
    return CreateGpuLayers(spec);
  }
  absl::StatusOr<std::unique_ptr<GpuFfnExecutor>> CreateFfnExecutor(
      const GpuFfnSpec& spec) const override {
    return CreateGpuFfnExecutor(spec);
  }
};

}  // namespace

const Device& CudaDevice() {
  static const Cuda* device = new Cuda();
  return *device;
}

}  // namespace thermocline::gpu
