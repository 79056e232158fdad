// CudaModule and CudaKernel (cuda_module.h).
#include "client/runtime/cuda_module.h"

#include <atomic>
#include <map>
#include <utility>

#include "absl/algorithm/container.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/cuda_driver.h"
#include "common/hashing.h"

#ifdef KILN_RUNTIME_CUDA
#include <c10/cuda/CUDAStream.h>
#endif

namespace kiln::runtime {
namespace {

absl::StatusOr<cuda::SmArch> ParseArch(absl::string_view sm_arch) {
  absl::StatusOr<cuda::SmArch> arch = cuda::ParseSmArch(sm_arch);
  if (!arch.ok())
    return absl::InvalidArgumentError(
        absl::StrCat("the artifact's sm_arch ", arch.status().message()));
  return arch;
}

}  // namespace

#ifdef KILN_RUNTIME_CUDA

using cuda::Driver;
using cuda::GetDriver;
using cuda::PrimaryContext;
using cuda::ScopedContext;

bool CudaRuntimeAvailable() { return true; }

absl::Status CheckCudaArch(absl::string_view sm_arch, int index) {
  absl::StatusOr<cuda::SmArch> want = ParseArch(sm_arch);
  if (!want.ok()) return want.status();
  absl::StatusOr<Driver*> driver = GetDriver();
  if (!driver.ok()) return driver.status();
  Driver& d = **driver;
  CUdevice dev;
  if (absl::Status s =
          d.Check(d.cuDeviceGet(&dev, index), absl::StrCat("cuDeviceGet(", index, ")"));
      !s.ok()) {
    return s;
  }
  int major = 0, minor = 0;
  d.cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev);
  d.cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev);
  if (cuda::Runs(*want, major, minor)) return absl::OkStatus();
  char name[256] = {};
  d.cuDeviceGetName(name, sizeof(name) - 1, dev);
  return absl::FailedPreconditionError(absl::StrCat(
      "the artifact was compiled for ", sm_arch, ", but cuda:", index, " is sm_", major, minor,
      " (", name, "): compile with options.target.sm_arch = 'sm_", major, minor, "'"));
}

absl::StatusOr<void*> CudaModule::Function(absl::string_view name, int device) {
  absl::StatusOr<Driver*> driver = GetDriver();
  if (!driver.ok()) return driver.status();
  Driver& d = **driver;
  absl::StatusOr<CUcontext> ctx = PrimaryContext(d, device);
  if (!ctx.ok()) return ctx.status();
  absl::MutexLock lock(&mu_);
  auto it = modules_.find(device);
  if (it == modules_.end()) {
    if (absl::Status s = CheckCudaArch(sm_arch_, device); !s.ok()) return s;
  }
  // Module calls act on the current context: the device's, for their span.
  ScopedContext scoped(d, *ctx);
  if (it == modules_.end()) {
    CUmodule module;
    if (absl::Status s = d.Check(d.cuModuleLoadData(&module, binary_.data()), "cuModuleLoadData");
        !s.ok()) {
      return s;
    }
    it = modules_.emplace(device, module).first;
  }
  CUfunction fn;
  const CUresult rc =
      d.cuModuleGetFunction(&fn, static_cast<CUmodule>(it->second), std::string(name).c_str());
  if (rc == CUDA_ERROR_NOT_FOUND) {
    return absl::NotFoundError(absl::StrCat("the CUDA module defines no kernel '", name, "'"));
  }
  if (absl::Status s = d.Check(rc, absl::StrCat("cuModuleGetFunction(", name, ")")); !s.ok()) {
    return s;
  }
  return static_cast<void*>(fn);
}

absl::Status CudaKernel::Launch(int device, int64_t grid, int block, const uint64_t* params,
                                size_t count) const {
  if (grid <= 0) return absl::OkStatus();  // nothing to compute (an empty tensor)
  if (device < 0 || device >= kMaxDevices) {
    return absl::InvalidArgumentError(absl::StrCat("device ", device, " is out of range"));
  }
  if (grid > 0x7fffffff) {
    return absl::InvalidArgumentError(
        absl::StrCat("grid of ", grid, " blocks is over CUDA's limit of 2^31 - 1"));
  }
  void* fn = functions_[device].load(std::memory_order_acquire);
  if (fn == nullptr) {
    absl::StatusOr<void*> resolved = module_->Function(name_, device);
    if (!resolved.ok()) return resolved.status();
    fn = *resolved;
    functions_[device].store(fn, std::memory_order_release);
  }
  Driver& d = **GetDriver();  // resolved above, by this call or an earlier one
  absl::StatusOr<CUcontext> ctx = PrimaryContext(d, device);
  if (!ctx.ok()) return ctx.status();
  ScopedContext scoped(d, *ctx);
  size_t size = 8 * count;
  void* extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, const_cast<uint64_t*>(params),
                   CU_LAUNCH_PARAM_BUFFER_SIZE, &size, CU_LAUNCH_PARAM_END};
  CUstream stream = c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(device)).stream();
  const CUresult rc =
      d.cuLaunchKernel(static_cast<CUfunction>(fn), static_cast<unsigned>(grid), 1, 1,
                       static_cast<unsigned>(block), 1, 1, 0, stream, nullptr, extra);
  if (rc == CUDA_SUCCESS) return absl::OkStatus();  // no message to make
  return d.Check(rc, absl::StrCat("cuLaunchKernel(", name_, ")"));
}

#else  // !KILN_RUNTIME_CUDA

namespace {
absl::Status NoCuda() {
  return absl::FailedPreconditionError(
      "this runtime was built without CUDA (torch's c10_cuda or the CUDA toolkit's cuda.h was "
      "not found when it was built): it cannot run cuda modules");
}
}  // namespace

bool CudaRuntimeAvailable() { return false; }

absl::Status CheckCudaArch(absl::string_view sm_arch, int) {
  if (absl::StatusOr<cuda::SmArch> a = ParseArch(sm_arch); !a.ok()) return a.status();
  return NoCuda();
}

absl::StatusOr<void*> CudaModule::Function(absl::string_view, int) { return NoCuda(); }

absl::Status CudaKernel::Launch(int, int64_t, int, const uint64_t*, size_t) const {
  return NoCuda();
}

#endif  // KILN_RUNTIME_CUDA

absl::StatusOr<std::shared_ptr<CudaModule>> CudaModule::Shared(absl::string_view binary,
                                                               absl::string_view sm_arch) {
  if (absl::StatusOr<cuda::SmArch> a = ParseArch(sm_arch); !a.ok()) return a.status();
  if (binary.empty()) return absl::InvalidArgumentError("the cuda module has no binary");
  if (!CudaRuntimeAvailable()) return CheckCudaArch(sm_arch, 0);
  static absl::Mutex* mu = new absl::Mutex;
  // (SHA-256 of the binary, arch) -> module; modules are never unloaded.
  static auto* modules =
      new std::map<std::pair<std::string, std::string>, std::shared_ptr<CudaModule>>;
  auto key = std::make_pair(Sha256Hex(binary), std::string(sm_arch));
  absl::MutexLock lock(mu);
  auto it = modules->find(key);
  if (it == modules->end()) {
    std::shared_ptr<CudaModule> module(new CudaModule(std::string(binary), key.second));
    it = modules->emplace(std::move(key), std::move(module)).first;
  }
  return it->second;
}

}  // namespace kiln::runtime
