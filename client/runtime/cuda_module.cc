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
#include "common/hashing.h"

#ifdef KILN_RUNTIME_CUDA
#include <c10/cuda/CUDAStream.h>
#include <cuda.h>
#include <dlfcn.h>
#endif

namespace kiln::runtime {
namespace {

struct Arch {
  int major = 0;
  int minor = 0;
  bool exact = false;  // "sm_90a": only 9.0 runs it
};

absl::StatusOr<Arch> ParseArch(absl::string_view sm_arch) {
  absl::string_view digits = sm_arch;
  Arch arch;
  if (absl::ConsumePrefix(&digits, "sm_")) arch.exact = absl::ConsumeSuffix(&digits, "a");
  int number = 0;
  if (digits.size() < 2 || digits.size() > 3 || !absl::c_all_of(digits, absl::ascii_isdigit) ||
      !absl::StartsWith(sm_arch, "sm_") || !absl::SimpleAtoi(digits, &number)) {
    return absl::InvalidArgumentError(
        absl::StrCat("the artifact's sm_arch '", sm_arch, "' is not an SM arch like sm_90"));
  }
  arch.major = number / 10;
  arch.minor = number % 10;
  return arch;
}

}  // namespace

#ifdef KILN_RUNTIME_CUDA
namespace {

// The driver functions the runtime calls, from libcuda.so.1. cuda.h maps
// some names to versioned symbols (cuCtxPushCurrent -> cuCtxPushCurrent_v2):
// the symbol looked up is the one the name expands to.
#define KILN_CU_STR2(x) #x
#define KILN_CU_STR(x) KILN_CU_STR2(x)
// clang-format off
#define KILN_CU_FUNCTIONS(X)                                                   \
  X(cuInit) X(cuGetErrorString) X(cuDeviceGet) X(cuDeviceGetAttribute)         \
  X(cuDeviceGetName) X(cuDevicePrimaryCtxRetain) X(cuCtxGetCurrent)            \
  X(cuCtxPushCurrent) X(cuCtxPopCurrent) X(cuModuleLoadData)                   \
  X(cuModuleGetFunction) X(cuLaunchKernel)
// clang-format on

struct Driver {
#define KILN_CU_MEMBER(name) decltype(&::name) name = nullptr;
  KILN_CU_FUNCTIONS(KILN_CU_MEMBER)
#undef KILN_CU_MEMBER
  // Device -> its primary context, retained once (kMaxDevices entries; set
  // under PrimaryMutex, then read without it).
  std::atomic<CUcontext> primary[64] = {};

  absl::Status Check(CUresult rc, absl::string_view what) const {
    if (rc == CUDA_SUCCESS) return absl::OkStatus();
    const char* text = nullptr;
    cuGetErrorString(rc, &text);
    return absl::InternalError(
        absl::StrCat(what, ": ", text != nullptr ? text : absl::StrCat("error ", rc)));
  }
};

// The driver, opened once; UNAVAILABLE (kept) when it cannot be.
absl::StatusOr<Driver*> GetDriver() {
  static const absl::StatusOr<Driver*>* const driver = [] {
    auto* d = new Driver;
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
      return new absl::StatusOr<Driver*>(absl::UnavailableError(
          absl::StrCat("cannot load the CUDA driver (libcuda.so.1): ", dlerror())));
    }
#define KILN_CU_LOAD(name)                                                          \
  d->name = reinterpret_cast<decltype(&::name)>(dlsym(lib, KILN_CU_STR(name)));     \
  if (d->name == nullptr) {                                                         \
    return new absl::StatusOr<Driver*>(absl::UnavailableError(                      \
        absl::StrCat("the CUDA driver (libcuda.so.1) lacks ", KILN_CU_STR(name)))); \
  }
    KILN_CU_FUNCTIONS(KILN_CU_LOAD)
#undef KILN_CU_LOAD
    if (absl::Status s = d->Check(d->cuInit(0), "cuInit"); !s.ok()) {
      return new absl::StatusOr<Driver*>(absl::UnavailableError(s.message()));
    }
    return new absl::StatusOr<Driver*>(d);
  }();
  return *driver;
}

absl::Mutex& PrimaryMutex() {
  static absl::Mutex* mu = new absl::Mutex;
  return *mu;
}

// The primary context of `device` (torch's), retained once for the process.
absl::StatusOr<CUcontext> PrimaryContext(Driver& d, int device) {
  if (device < 0 || device >= 64) {
    return absl::InvalidArgumentError(absl::StrCat("device ", device, " is out of range"));
  }
  if (CUcontext ctx = d.primary[device].load(std::memory_order_acquire)) return ctx;
  absl::MutexLock lock(&PrimaryMutex());
  if (CUcontext ctx = d.primary[device].load(std::memory_order_acquire)) return ctx;
  CUdevice dev;
  if (absl::Status s = d.Check(d.cuDeviceGet(&dev, device), "cuDeviceGet"); !s.ok()) return s;
  CUcontext ctx;
  if (absl::Status s = d.Check(d.cuDevicePrimaryCtxRetain(&ctx, dev), "cuDevicePrimaryCtxRetain");
      !s.ok()) {
    return s;
  }
  d.primary[device].store(ctx, std::memory_order_release);
  return ctx;
}

// Makes `ctx` current for its lifetime when it is not already.
class ScopedContext {
 public:
  ScopedContext(Driver& d, CUcontext ctx) : d_(d) {
    CUcontext current = nullptr;
    d_.cuCtxGetCurrent(&current);
    if (current != ctx) pushed_ = d_.cuCtxPushCurrent(ctx) == CUDA_SUCCESS;
  }
  ~ScopedContext() {
    if (pushed_) {
      CUcontext popped;
      d_.cuCtxPopCurrent(&popped);
    }
  }
  ScopedContext(const ScopedContext&) = delete;
  ScopedContext& operator=(const ScopedContext&) = delete;

 private:
  Driver& d_;
  bool pushed_ = false;
};

}  // namespace

bool CudaRuntimeAvailable() { return true; }

absl::Status CheckCudaArch(absl::string_view sm_arch, int index) {
  absl::StatusOr<Arch> want = ParseArch(sm_arch);
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
  if (major == want->major && minor >= want->minor && (!want->exact || minor == want->minor)) {
    return absl::OkStatus();
  }
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
  return d.Check(d.cuLaunchKernel(static_cast<CUfunction>(fn), static_cast<unsigned>(grid), 1, 1,
                                  static_cast<unsigned>(block), 1, 1, 0, stream, nullptr, extra),
                 absl::StrCat("cuLaunchKernel(", name_, ")"));
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
  if (absl::StatusOr<Arch> a = ParseArch(sm_arch); !a.ok()) return a.status();
  return NoCuda();
}

absl::StatusOr<void*> CudaModule::Function(absl::string_view, int) { return NoCuda(); }

absl::Status CudaKernel::Launch(int, int64_t, int, const uint64_t*, size_t) const {
  return NoCuda();
}

#endif  // KILN_RUNTIME_CUDA

absl::StatusOr<std::shared_ptr<CudaModule>> CudaModule::Shared(absl::string_view binary,
                                                               absl::string_view sm_arch) {
  if (absl::StatusOr<Arch> a = ParseArch(sm_arch); !a.ok()) return a.status();
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
