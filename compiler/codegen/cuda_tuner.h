// Autotuning for the CUDA backend: the threads per block of each kernel
// chosen by timing candidates on a real GPU, when the compiling process has
// one (kilnd --autotune; without a GPU, the schedule's heuristics stand).
//
// For each kernel whose sizes and strides are all constants, the block sizes
// BlockCandidates lists (the heuristic's among them) are generated as
// variants of the kernel, compiled by the backend's toolchain as up to
// `compile_jobs` modules at once (compiler/codegen/modules.h), loaded
// through the driver API (common/cuda_driver.h) and
// launched on buffers of the sizes the kernel reaches (zero-filled; the
// kernels' timing does not depend on the values). Each candidate runs for
// at least ~0.2 ms per repetition, three repetitions, the fastest taken. A
// candidate must beat the heuristic by 3% to replace it, so that noise does
// not change the code. A candidate that fails to launch (too many
// registers for its block) is passed over.
//
// The choice is cached by the kernel's printed loop IR (sizes, strides and
// statements, without its name, node names or buffer names) and the SM arch:
// no kernel is tuned twice in a process. Symbolic kernels, kernels with one
// candidate, and kernels whose buffers take under 32 MiB (about 10 us of
// memory traffic on an H100: not worth their variants' compile time) or
// over 4 GiB keep the heuristic.
//
// Tuning is one kernel at a time on the device (concurrent timings would
// disturb each other). Thread-safe.
#ifndef KILN_COMPILER_CODEGEN_CUDA_TUNER_H_
#define KILN_COMPILER_CODEGEN_CUDA_TUNER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "compiler/codegen/codegen.h"
#include "compiler/loop/kernel.h"

namespace kiln::codegen {

class CudaTuner {
 public:
  // The tuner of CUDA device `device`. UNAVAILABLE when this process has no
  // driver or no such device (the message says which).
  static absl::StatusOr<std::unique_ptr<CudaTuner>> Open(int device = 0);

  // Sets `block` of each kernel of `kernels` that tuning finds faster than
  // the heuristic; records a line per kernel in `decisions` ("tune: ...").
  // `backend` generates and compiles the variants; its arch must be one the
  // device runs (else FAILED_PRECONDITION naming both, and nothing is
  // changed). On an error, kernels tuned before keep their cached choice
  // and the rest the heuristic.
  absl::Status Tune(const CodegenBackend& backend, const std::string& sm_arch,
                    const std::vector<std::string>& symbols, std::vector<loop::Kernel>* kernels,
                    std::vector<std::string>* decisions, int compile_jobs = 1)
      ABSL_LOCKS_EXCLUDED(mu_);

  // Makes the device's context now rather than at the first Tune.
  absl::Status Warm();

  // The device's name and compute capability ("NVIDIA H100 80GB HBM3, sm_90").
  const std::string& device_name() const { return device_name_; }
  int64_t kernels_tuned() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  CudaTuner(int device, std::string device_name, int major, int minor)
      : device_(device), device_name_(std::move(device_name)), major_(major), minor_(minor) {}

  const int device_;
  const std::string device_name_;
  const int major_, minor_;
  mutable absl::Mutex mu_;
  // Held while timing: one kernel at a time on the device.
  absl::Mutex device_mu_ ABSL_ACQUIRED_AFTER(mu_);
  // (arch, anonymized kernel) -> threads per block, 0 for the heuristic.
  absl::flat_hash_map<std::string, int> chosen_ ABSL_GUARDED_BY(mu_);
  int64_t tuned_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace kiln::codegen

#endif  // KILN_COMPILER_CODEGEN_CUDA_TUNER_H_
