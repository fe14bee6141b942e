// The probe of a CUDA build (gpu_backend.h) and the helpers of cuda_common.h. Works on a machine
// without a driver or device: cudart is linked statically and loads the driver at run time, so
// the first call reports the missing driver as an error.
#include "absl/strings/str_cat.h"
#include "engine/cuda/cuda_common.h"
#include "engine/gpu/gpu_backend.h"
#include "engine/ops/type_table.h"

namespace thermocline {
namespace cuda {

absl::Status CudaStatus(cudaError_t e, std::string_view what) {
  if (e == cudaSuccess) return absl::OkStatus();
  cudaGetLastError();  // clear a non-sticky error so later calls are not blamed for it
  return absl::InternalError(absl::StrCat("CUDA error in ", std::string(what), ": ",
                                          cudaGetErrorName(e), " (", cudaGetErrorString(e), ")"));
}

CudaQueue::~CudaQueue() {
  cudaSetDevice(device_);
  cudaStreamSynchronize(stream_);
  cudaStreamDestroy(stream_);
}

cudaStream_t StreamOf(gpu::Queue* queue) {
  return queue != nullptr ? static_cast<CudaQueue*>(queue)->stream() : nullptr;
}

absl::StatusOr<KType> KernelType(const WeightView& w) {
  if (w.layout != WeightLayout::kRows) {
    // The engine re-lays only what the CPU alone reads (PackedWeights); device uploads read
    // the model's views.
    return absl::InvalidArgumentError(
        "a matrix re-laid for the CPU's kernels cannot be uploaded: upload the model's rows");
  }
  const WeightTypeRow* row = FindWeightType(w.type);
  if (row == nullptr || row->device == DeviceKernel::kNone) {
    return absl::InvalidArgumentError(
        absl::StrCat("weight type ", TypeName(w.type),
                     " has no CUDA kernels; quantize the model to a type that has (",
                     WeightTypeNames(), ") or run it on the CPU"));
  }
  const KType t = row->device;
  const int64_t block = TypeInfo(w.type).block_size;
  if (w.cols % block != 0 || w.cols <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("a ", TypeName(w.type), " row of ", w.cols,
                                                   " elements is not a whole number of blocks"));
  }
  if (w.rows > 0 && w.row_bytes < RowBytes(w.type, w.cols)) {
    return absl::InvalidArgumentError("weight rows overlap (row_bytes shorter than a row)");
  }
  return t;
}

}  // namespace cuda

namespace gpu {

bool CudaCompiledIn() { return true; }

bool TypeSupported(GgmlType type) {
  const WeightTypeRow* row = FindWeightType(type);
  return row != nullptr && row->device != DeviceKernel::kNone;
}

absl::StatusOr<DeviceInfo> Probe(int index) {
  int count = 0;
  if (cudaError_t e = cudaGetDeviceCount(&count); e != cudaSuccess) {
    cudaGetLastError();
    return absl::UnavailableError(
        absl::StrCat("no CUDA device: ", cudaGetErrorString(e),
                     " (is an NVIDIA GPU and its driver installed?); running on the CPU"));
  }
  if (count == 0) {
    return absl::UnavailableError(
        "no CUDA device: none is visible (check CUDA_VISIBLE_DEVICES); running on the CPU");
  }
  if (index < 0 || index >= count) {
    return absl::NotFoundError(absl::StrCat("CUDA device ", index, " does not exist; devices 0..",
                                            count - 1, " are visible"));
  }
  cudaDeviceProp prop;
  if (cudaError_t e = cudaGetDeviceProperties(&prop, index); e != cudaSuccess) {
    return cuda::CudaStatus(e, "cudaGetDeviceProperties");
  }
  if (prop.major < 8) {
    return absl::UnavailableError(absl::StrCat(
        "no usable CUDA device: ", prop.name, " has compute capability ", prop.major, ".",
        prop.minor, ", Thermocline's kernels need 8.0 or newer; running on the CPU"));
  }
  DeviceInfo info;
  info.index = index;
  info.name = prop.name;
  info.compute_major = prop.major;
  info.compute_minor = prop.minor;
  info.total_bytes = prop.totalGlobalMem;
  info.multiprocessors = prop.multiProcessorCount;
  size_t free_bytes = 0, total_bytes = 0;
  TC_CUDA_RETURN_IF_ERROR(cudaSetDevice(index), "cudaSetDevice");
  TC_CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo");
  info.free_bytes = free_bytes;
  return info;
}

bool DeviceAvailable() { return Probe(0).ok(); }

absl::StatusOr<std::unique_ptr<Queue>> CreateCudaQueue(int index) {
  absl::StatusOr<DeviceInfo> info = Probe(index);
  if (!info.ok()) return info.status();
  TC_CUDA_RETURN_IF_ERROR(cudaSetDevice(index), "cudaSetDevice");
  cudaStream_t stream = nullptr;
  TC_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking),
                          "cudaStreamCreate");
  return std::unique_ptr<Queue>(new cuda::CudaQueue(index, stream));
}

}  // namespace gpu
}  // namespace thermocline
