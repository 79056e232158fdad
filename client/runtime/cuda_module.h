// CudaModule: the CUBIN of a CompiledModule of language "cuda", loaded
// through the CUDA driver API and launched on torch's current stream.
//
// The driver library is opened with dlopen("libcuda.so.1"), the driver's own
// (never a link-time stub), on first use: a process without a GPU can create
// plan executors of cuda plans and fails, clearly, only when it runs one.
// A module is loaded (cuModuleLoadData) into the primary context of each
// device it runs on, the context torch's CUDA runtime uses, once per device;
// loaded modules are never unloaded. Before the first load on a device the
// device's compute capability is checked against the module's arch: a CUBIN
// for sm_XY runs on major X at minor Y or above ("sm_90a" only on 9.0), and
// anything else is refused naming both.
//
// Launches follow the kernel ABI of compiler/codegen/codegen.h: one
// parameter buffer of 8-byte fields, the buffers' data pointers then the
// plan's symbol values.
//
// Thread-safe.
#ifndef KILN_CLIENT_RUNTIME_CUDA_MODULE_H_
#define KILN_CLIENT_RUNTIME_CUDA_MODULE_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace kiln::runtime {

// Whether this runtime was built with CUDA support (torch's c10_cuda).
bool CudaRuntimeAvailable();

// OK when device `index` can run a CUBIN built for `sm_arch`;
// FAILED_PRECONDITION naming both otherwise (and saying which arch to ask
// for), INVALID_ARGUMENT for an arch that is not of the form sm_XY[a],
// UNAVAILABLE when there is no driver.
absl::Status CheckCudaArch(absl::string_view sm_arch, int index);

class CudaModule {
 public:
  // The module of `binary` for `sm_arch`: one object per distinct (binary,
  // arch) in the process. INVALID_ARGUMENT for an empty binary or a
  // malformed arch; FAILED_PRECONDITION when this runtime has no CUDA.
  static absl::StatusOr<std::shared_ptr<CudaModule>> Shared(absl::string_view binary,
                                                            absl::string_view sm_arch);

  CudaModule(const CudaModule&) = delete;
  CudaModule& operator=(const CudaModule&) = delete;

  // The CUfunction `name` on device `device`, loading the module into the
  // device (and checking its arch) first when it is not there yet. NOT_FOUND
  // naming the kernel when the module lacks it; FAILED_PRECONDITION when the
  // device cannot run the arch; UNAVAILABLE without a driver; INTERNAL with
  // the driver's message when a driver call fails.
  absl::StatusOr<void*> Function(absl::string_view name, int device) ABSL_LOCKS_EXCLUDED(mu_);

  const std::string& sm_arch() const { return sm_arch_; }

 private:
  CudaModule(std::string binary, std::string sm_arch)
      : binary_(std::move(binary)), sm_arch_(std::move(sm_arch)) {}

  const std::string binary_;
  const std::string sm_arch_;
  absl::Mutex mu_;
  absl::flat_hash_map<int, void*> modules_ ABSL_GUARDED_BY(mu_);  // device -> CUmodule
};

// One kernel of a CudaModule, with its function per device resolved once.
class CudaKernel {
 public:
  CudaKernel(std::shared_ptr<CudaModule> module, std::string name)
      : module_(std::move(module)), name_(std::move(name)) {}

  // Launches the kernel on device `device` with `grid` x `block` threads on
  // torch's current stream of that device; `params` holds `count` 8-byte
  // values (the kernel ABI's parameter buffer). Errors as Function's, and
  // INTERNAL naming the kernel when the launch fails.
  absl::Status Launch(int device, int64_t grid, int block, const uint64_t* params,
                      size_t count) const;

  const std::string& name() const { return name_; }

 private:
  static constexpr int kMaxDevices = 64;
  const std::shared_ptr<CudaModule> module_;
  const std::string name_;
  mutable std::atomic<void*> functions_[kMaxDevices] = {};  // per device, once resolved
};

}  // namespace kiln::runtime

#endif  // KILN_CLIENT_RUNTIME_CUDA_MODULE_H_
