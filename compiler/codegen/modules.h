// A graph's kernels compiled as several modules at once: one native compiler
// process (g++ or the NVRTC helper) per part, the parts run in parallel, so
// that a graph of many kernels compiles in about the time of its largest
// part rather than of all of them.
//
// Kernels are dealt to at most `jobs` parts by the size of their generated
// code (the largest first, each to the part with the least code so far), a
// rough measure of what each costs the compiler; within a part they keep
// their order. The deal depends only on the kernels, so the same graph
// always compiles into the same modules.
#ifndef KILN_COMPILER_CODEGEN_MODULES_H_
#define KILN_COMPILER_CODEGEN_MODULES_H_

#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "compiler/codegen/codegen.h"
#include "compiler/codegen/kernel_cache.h"
#include "compiler/loop/kernel.h"
#include "kiln/v1/artifact.pb.h"

namespace kiln::codegen {

// The part (0..parts-1) of each item of `costs`, for min(parts, items)
// parts, none of them empty: the largest cost first, each to the part with
// the least total so far (the lowest-numbered on ties).
std::vector<int> DealByCost(const std::vector<int64_t>& costs, int parts);

struct CompiledModules {
  std::vector<v1::CompiledModule> modules;
  std::map<std::string, int> module_of;  // kernel name -> index in `modules`
  // Kernels served by a KernelCache under another name: kernel name -> the
  // name its module defines (what the plan must launch).
  std::map<std::string, std::string> symbol_of;
  // The kernels served by a KernelCache, in order.
  std::vector<std::string> reused;
};

// A bound on the native compiles that run at once across everything that
// shares it: kilnd's one instance (--compile_jobs slots) covers every graph
// it compiles, the two halves of a training graph and concurrent requests
// alike. A module waits for a free slot, so that a training graph's halves
// may each be dealt as many modules as there are slots: the half done first
// leaves its slots to the other's modules, where a fixed share each left
// one half's cores idle while the other still had three kernels a module.
class CompileSlots {
 public:
  explicit CompileSlots(int slots) : free_(std::max(1, slots)) {}
  CompileSlots(const CompileSlots&) = delete;
  CompileSlots& operator=(const CompileSlots&) = delete;

  // Waits for a free slot. An `urgent` compile (a tiered compile's quick
  // artifact, which a caller waits for) takes one before any other that
  // waits (the optimized compile running beside it in the background).
  void Acquire(bool urgent = false);
  void Release();

 private:
  bool FreeForOrdinary() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return free_ > 0 && urgent_waiting_ == 0;
  }

  absl::Mutex mu_;
  int free_ ABSL_GUARDED_BY(mu_);
  int urgent_waiting_ ABSL_GUARDED_BY(mu_) = 0;
};

// Generates and compiles `kernels` as at most `jobs` modules (at least one),
// in parallel, each compile in a slot of `slots` where given. A compile
// error is the first failed part's, in part order, with its compiler log.
//
// With a `cache`, each kernel it holds is served from it as a module of its
// own, and the rest are dealt and compiled as above; what compiled as a
// module of one kernel is then kept in it. The cached modules follow the
// compiled ones. `urgent`: the slots are taken as CompileSlots::Acquire's.
absl::StatusOr<CompiledModules> CompileModules(const CodegenBackend& backend,
                                               const std::vector<loop::Kernel>& kernels,
                                               const std::vector<std::string>& symbols, int jobs,
                                               CompileSlots* slots = nullptr,
                                               KernelCache* cache = nullptr, bool urgent = false);

}  // namespace kiln::codegen

#endif  // KILN_COMPILER_CODEGEN_MODULES_H_
