// Cublas(): dlopen + dlsym, once.
#include "engine/cuda/cublas_loader.h"

#include <dlfcn.h>

#include <string>

#include "absl/strings/str_cat.h"

namespace thermocline::cuda {
namespace {

template <class F>
bool Load(void* lib, const char* name, F* f) {
  *f = reinterpret_cast<F>(dlsym(lib, name));
  return *f != nullptr;
}

absl::StatusOr<CublasApi> LoadCublas() {
  // The major version this binary was compiled against; the toolkit's lib64 beside nvcc is
  // the fallback when the loader path does not have it.
  const std::string soname = absl::StrCat("libcublas.so.", CUBLAS_VER_MAJOR);
  void* lib = dlopen(soname.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    lib =
        dlopen(absl::StrCat(THERMOCLINE_CUDA_LIB_DIR, "/", soname).c_str(), RTLD_NOW | RTLD_LOCAL);
  }
  if (lib == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot load ", soname, " (cuBLAS, for prefill products on the GPU): ", dlerror(),
        "; add the CUDA toolkit's lib64 to LD_LIBRARY_PATH"));
  }
  CublasApi api;
  if (!Load(lib, "cublasCreate_v2", &api.create) || !Load(lib, "cublasDestroy_v2", &api.destroy) ||
      !Load(lib, "cublasSetStream_v2", &api.set_stream) ||
      !Load(lib, "cublasSetWorkspace_v2", &api.set_workspace) ||
      !Load(lib, "cublasGemmEx", &api.gemm_ex) ||
      !Load(lib, "cublasGetStatusString", &api.status_string)) {
    return absl::FailedPreconditionError(
        absl::StrCat(soname, " lacks a cuBLAS function this build needs: ", dlerror()));
  }
  return api;  // the library stays loaded for the process's life
}

}  // namespace

absl::StatusOr<const CublasApi*> Cublas() {
  static const absl::StatusOr<CublasApi>* const api = new absl::StatusOr<CublasApi>(LoadCublas());
  if (!api->ok()) return api->status();
  return &**api;
}

}  // namespace thermocline::cuda
