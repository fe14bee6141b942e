// cuBLAS, loaded on first use with dlopen: linking libcublas would make every process of the
// project (tests, the daemon) load ~600 MB of libraries at start-up, GPU or not. Internal.
#pragma once

#include <cublas_v2.h>

#include "absl/status/statusor.h"

namespace thermocline::cuda {

// The cuBLAS entry points this backend uses (types from cublas_v2.h, addresses from the library).
struct CublasApi {
  decltype(&cublasCreate_v2) create;
  decltype(&cublasDestroy_v2) destroy;
  decltype(&cublasSetStream_v2) set_stream;
  decltype(&cublasSetWorkspace_v2) set_workspace;
  // cublasGemmEx with int sizes (C++ also declares an int64_t overload).
  cublasStatus_t (*gemm_ex)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int,
                            const void*, const void*, cudaDataType, int, const void*, cudaDataType,
                            int, const void*, void*, cudaDataType, int, cublasComputeType_t,
                            cublasGemmAlgo_t);
  decltype(&cublasGetStatusString) status_string;
};

// Loads libcublas.so.<major> once (thread-safe); FailedPreconditionError naming the library
// when it cannot be loaded (e.g. LD_LIBRARY_PATH lacks the CUDA toolkit's lib64).
absl::StatusOr<const CublasApi*> Cublas();

}  // namespace thermocline::cuda
