#include "common/cuda_driver.h"

#include "absl/algorithm/container.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

#ifdef KILN_HAVE_CUDA_DRIVER
#include <dlfcn.h>

#include "absl/synchronization/mutex.h"
#endif

namespace kiln::cuda {

absl::StatusOr<SmArch> ParseSmArch(absl::string_view sm_arch) {
  absl::string_view digits = sm_arch;
  SmArch arch;
  if (absl::ConsumePrefix(&digits, "sm_")) arch.exact = absl::ConsumeSuffix(&digits, "a");
  int number = 0;
  if (digits.size() < 2 || digits.size() > 3 || !absl::c_all_of(digits, absl::ascii_isdigit) ||
      !absl::StartsWith(sm_arch, "sm_") || !absl::SimpleAtoi(digits, &number)) {
    return absl::InvalidArgumentError(absl::StrCat("'", absl::CHexEscape(sm_arch.substr(0, 64)),
                                                   "' is not an SM arch like sm_90"));
  }
  arch.major = number / 10;
  arch.minor = number % 10;
  return arch;
}

#ifdef KILN_HAVE_CUDA_DRIVER

#define KILN_CU_STR2(x) #x
#define KILN_CU_STR(x) KILN_CU_STR2(x)

absl::Status Driver::Check(CUresult rc, absl::string_view what) const {
  if (rc == CUDA_SUCCESS) return absl::OkStatus();
  const char* text = nullptr;
  cuGetErrorString(rc, &text);
  return absl::InternalError(
      absl::StrCat(what, ": ", text != nullptr ? text : absl::StrCat("error ", rc)));
}

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

absl::StatusOr<CUcontext> PrimaryContext(Driver& d, int device) {
  if (device < 0 || device >= Driver::kMaxDevices) {
    return absl::InvalidArgumentError(absl::StrCat("device ", device, " is out of range"));
  }
  if (CUcontext ctx = d.primary[device].load(std::memory_order_acquire)) return ctx;
  static absl::Mutex* const mu = new absl::Mutex;
  absl::MutexLock lock(mu);
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

ScopedContext::ScopedContext(Driver& d, CUcontext ctx) : d_(d) {
  CUcontext current = nullptr;
  d_.cuCtxGetCurrent(&current);
  if (current != ctx) pushed_ = d_.cuCtxPushCurrent(ctx) == CUDA_SUCCESS;
}

ScopedContext::~ScopedContext() {
  if (pushed_) {
    CUcontext popped;
    d_.cuCtxPopCurrent(&popped);
  }
}

#endif  // KILN_HAVE_CUDA_DRIVER

}  // namespace kiln::cuda
