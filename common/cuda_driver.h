// The CUDA driver API, opened at run time with dlopen("libcuda.so.1") (the
// driver's own library, never a link-time stub), for the runtime's module
// loader (client/runtime/cuda_module.h) and the compiler's autotuner
// (compiler/codegen/cuda_tuner.h). A process without a GPU or a driver gets
// UNAVAILABLE, once, when it first asks.
//
// Also the SM arch names ("sm_90", "sm_90a") and whether a device of a
// given compute capability runs code built for one; these need no driver.
//
// Thread-safe.
#ifndef KILN_COMMON_CUDA_DRIVER_H_
#define KILN_COMMON_CUDA_DRIVER_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kiln::cuda {

struct SmArch {
  int major = 0;
  int minor = 0;
  bool exact = false;  // "sm_90a": only 9.0 runs it
};

// "sm_XY" or "sm_XYa" (two or three digits); INVALID_ARGUMENT naming the
// text otherwise.
absl::StatusOr<SmArch> ParseSmArch(absl::string_view sm_arch);

// Whether a device of compute capability major.minor runs a CUBIN for
// `arch`: the same major at the arch's minor or above (exactly it for
// "sm_XYa").
inline bool Runs(const SmArch& arch, int major, int minor) {
  return major == arch.major && minor >= arch.minor && (!arch.exact || minor == arch.minor);
}

}  // namespace kiln::cuda

#ifdef KILN_HAVE_CUDA_DRIVER
#include <cuda.h>

#include <atomic>

namespace kiln::cuda {

// The driver functions Kiln calls. cuda.h maps some names to versioned
// symbols (cuMemAlloc -> cuMemAlloc_v2): the symbol looked up is the one the
// name expands to.
// clang-format off
#define KILN_CU_FUNCTIONS(X)                                                   \
  X(cuInit) X(cuGetErrorString) X(cuDeviceGet) X(cuDeviceGetCount)             \
  X(cuDeviceGetAttribute) X(cuDeviceGetName) X(cuDevicePrimaryCtxRetain)       \
  X(cuCtxGetCurrent) X(cuCtxPushCurrent) X(cuCtxPopCurrent)                    \
  X(cuCtxSynchronize) X(cuModuleLoadData) X(cuModuleUnload)                    \
  X(cuModuleGetFunction) X(cuLaunchKernel) X(cuMemAlloc) X(cuMemFree)          \
  X(cuMemsetD8) X(cuEventCreate) X(cuEventDestroy) X(cuEventRecord)            \
  X(cuEventSynchronize) X(cuEventElapsedTime)
// clang-format on

struct Driver {
#define KILN_CU_MEMBER(name) decltype(&::name) name = nullptr;
  KILN_CU_FUNCTIONS(KILN_CU_MEMBER)
#undef KILN_CU_MEMBER
  // Device -> its primary context, retained once (set under a mutex, then
  // read without it).
  static constexpr int kMaxDevices = 64;
  std::atomic<CUcontext> primary[kMaxDevices] = {};

  // OK for CUDA_SUCCESS; else INTERNAL naming `what` and the driver's text.
  absl::Status Check(CUresult rc, absl::string_view what) const;
};

// The driver, opened and initialized once; UNAVAILABLE (kept) when it
// cannot be.
absl::StatusOr<Driver*> GetDriver();

// The primary context of `device` (the one torch's CUDA runtime uses),
// retained once for the process.
absl::StatusOr<CUcontext> PrimaryContext(Driver& d, int device);

// Makes `ctx` current for its lifetime when it is not already.
class ScopedContext {
 public:
  ScopedContext(Driver& d, CUcontext ctx);
  ~ScopedContext();
  ScopedContext(const ScopedContext&) = delete;
  ScopedContext& operator=(const ScopedContext&) = delete;

 private:
  Driver& d_;
  bool pushed_ = false;
};

}  // namespace kiln::cuda

#endif  // KILN_HAVE_CUDA_DRIVER

#endif  // KILN_COMMON_CUDA_DRIVER_H_
