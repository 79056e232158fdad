// Code generation backends: turn a graph's fused kernels into one source
// file and compile it for a target. The C++ backend (CPUs, g++) is the first
// implementation; a CUDA backend (NVRTC) is a second one behind the same
// interface.
//
// Kernel ABI, for every backend's CPU-side entry points:
//   extern "C" void <kernel.name>(void* const* buffers, const int64_t* symbols);
// `buffers` holds the data pointers (at::Tensor::data_ptr(), storage offset
// included) of kernel.buffers in order; `symbols` the values of the plan's
// symbols, in the order given to Generate.
//
// Implementations are immutable after construction and thread-safe.
#ifndef KILN_COMPILER_CODEGEN_CODEGEN_H_
#define KILN_COMPILER_CODEGEN_CODEGEN_H_

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "compiler/loop/kernel.h"
#include "kiln/v1/artifact.pb.h"

namespace kiln::codegen {

// Type URL of the absl::Status payload that carries a failed native
// compile's whole log (the message holds its first lines).
inline constexpr char kCompilerLogPayload[] = "kiln.dev/compiler-log";

class CodegenBackend {
 public:
  virtual ~CodegenBackend() = default;
  virtual std::string language() const = 0;  // "c++"

  // One translation unit defining every kernel. `symbols` names the symbolic
  // sizes, in the order the `symbols` argument carries them.
  virtual absl::StatusOr<std::string> Generate(const std::vector<loop::Kernel>& kernels,
                                               const std::vector<std::string>& symbols) const = 0;

  // Compiles `source`. A compiler error is INTERNAL carrying the compiler's
  // log; the module holds the source, the binary and the command.
  virtual absl::StatusOr<v1::CompiledModule> Compile(const std::string& source) const = 0;
};

struct CppOptions {
  std::string compiler = "g++";
  // The target ISA, e.g. "x86-64-v3" (-march=); part of the cache key
  // through CompileOptions.target.cpu_isa. Empty: the machine's own
  // ("native").
  std::string isa;
  bool openmp = true;
  std::string scratch_dir = "/tmp";  // where sources and objects are written
  // The compiler is killed (with everything it started) past this, and
  // Compile fails with DEADLINE_EXCEEDED.
  absl::Duration timeout = absl::Seconds(120);
  // When set and it turns true, the compiler is killed and Compile fails
  // with CANCELLED. Must outlive Compile.
  const std::atomic<bool>* cancel = nullptr;
};

std::unique_ptr<CodegenBackend> MakeCppBackend(const CppOptions& options);

}  // namespace kiln::codegen

#endif  // KILN_COMPILER_CODEGEN_CODEGEN_H_
