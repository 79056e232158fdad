// Targets: what the kiln backend generates code for (docs/architecture.md
// §5). A Target bundles, for one device kind, the code generator (its
// emitter and its toolchain) and how its launches are sized:
//   - cpu: C++ with OpenMP for a named x86-64 level, compiled by g++;
//   - cuda: CUDA C++ compiled by NVRTC into a CUBIN for a named SM arch,
//     one block per row for reductions, a grid-stride loop for pointwise
//     kernels.
// The pipeline (compiler/pipeline/pipeline.h) chooses the Target from the
// normalized options and the graph's devices.
//
// Targets are immutable and thread-safe.
#ifndef KILN_COMPILER_TARGET_TARGET_H_
#define KILN_COMPILER_TARGET_TARGET_H_

#include <atomic>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "compiler/codegen/codegen.h"
#include "compiler/ir/graph.h"
#include "compiler/loop/fuse.h"
#include "kiln/v1/artifact.pb.h"

namespace kiln::target {

// Where and how long a target's toolchain may run.
struct ToolchainOptions {
  std::string scratch_dir = "/tmp";
  absl::Duration timeout = absl::Seconds(120);
  std::string cpp_compiler = "g++";  // searched in PATH
  // The NVRTC helper program (codegen.h, CudaOptions::helper); empty: the
  // one installed beside the running program.
  std::string nvrtc_helper;
  // NVRTC's --Ofast-compile level (codegen.h, CudaOptions::fast_compile).
  std::string nvrtc_fast_compile;
  // The target's quick level (a tiered compile's first artifact): shorter
  // native compiles, slower code. cpu: g++ -O1 for -O3; cuda: NVRTC's
  // --Ofast-compile=mid unless nvrtc_fast_compile names a level (kilnd's
  // quick artifacts compile no kernels, server/backend.cc, but for graphs
  // whose joint graph fails there and for injected faults).
  bool quick = false;
  const std::atomic<bool>* cancel = nullptr;
};

class Target {
 public:
  virtual ~Target() = default;
  // "cpu" or "cuda".
  virtual std::string device_type() const = 0;
  // The normalized wire form: every field that enters the key.
  virtual const v1::Target& proto() const = 0;
  // The code generator, writing into and running from `options`.
  virtual std::unique_ptr<codegen::CodegenBackend> MakeCodegen(
      const ToolchainOptions& options) const = 0;
  // Which legal fusions are taken (compiler/loop/fuse.h).
  virtual loop::FusionPolicy fusion_policy() const { return loop::FusionPolicy(); }
  // Reduction kernels that launch fewer blocks than the device has
  // multiprocessors are split to launch at least twice as many
  // (compiler/loop/split_reductions.h). 0: never split.
  virtual int64_t multiprocessors() const { return 0; }
};

// The target `wanted` (normalized options: ir::NormalizeOptions) names, for
// a graph whose tensors live on its device. INVALID_ARGUMENT naming the
// field for an unknown device type or an SM arch that is not "sm_<digits>",
// and naming the value when a tensor of `graph` is on another device type.
absl::StatusOr<std::unique_ptr<Target>> SelectTarget(const v1::Target& wanted,
                                                     const ir::Graph& graph);

}  // namespace kiln::target

#endif  // KILN_COMPILER_TARGET_TARGET_H_
