// Code generation backends: turn a graph's fused kernels into one source
// file and compile it for a target: C++ for CPUs (g++), CUDA C++ for NVIDIA
// GPUs (NVRTC).
//
// Kernel ABI of the C++ backend:
//   extern "C" void <kernel.name>(void* const* buffers, const int64_t* symbols);
// `buffers` holds the data pointers (at::Tensor::data_ptr(), storage offset
// included) of kernel.buffers in order; `symbols` the values of the plan's
// symbols, in the order given to Generate.
//
// Kernel ABI of the CUDA backend: one __global__ function per kernel, named
// kernel.name, taking one parameter: a struct of 8-byte fields, the data
// pointers of kernel.buffers in order followed by the values of all the
// plan's symbols in order. A launcher passes it as one parameter buffer
// (cuLaunchKernel's CU_LAUNCH_PARAM_BUFFER_POINTER) of 8 * (buffers +
// symbols) bytes, with the grid and block LaunchSize gives, no dynamic
// shared memory, on the caller's stream.
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

// How a GPU kernel is launched: a one-dimensional grid (an expression of
// the plan's symbols) of blocks of `block` threads.
struct LaunchSize {
  ir::SymInt grid{int64_t{1}};
  int block = 1;
  // Of a reduction kernel: the rows each block reduces at once.
  int64_t rows_per_block = 1;
  // Each block sweeps its rows with every thread at the same elements of
  // each row, kept in registers: the kernel can take sums across rows
  // (loop::StmtKind::kAccumulate).
  bool row_in_registers = false;
  // Per buffer of the kernel: the bytes its data pointer must be a
  // multiple of, which its vector accesses assume (0: any). Empty: none
  // needs alignment. The plan's Launch carries it to the launcher.
  std::vector<int> alignment;
};

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

  // What besides the source decides Compile's binary (the compiler, its
  // target and options), for keys of compiled code (kernel_cache.h).
  virtual std::string CompileIdentity() const = 0;

  // For GPU backends: how `kernel` (as Generate emits it) is launched.
  // CPU backends have no launch sizes: UNIMPLEMENTED.
  virtual absl::StatusOr<LaunchSize> Launch(const loop::Kernel& /*kernel*/) const {
    return absl::UnimplementedError(language() + " kernels have no launch size");
  }
};

struct CppOptions {
  std::string compiler = "g++";
  // The target ISA, e.g. "x86-64-v3" (-march=); part of the cache key
  // through CompileOptions.target.cpu_isa. Empty: the machine's own
  // ("native").
  std::string isa;
  bool openmp = true;
  // g++'s optimization level: -O3, or -O1 for a tiered compile's quick
  // artifact (target.h, ToolchainOptions::quick).
  std::string optimization = "-O3";
  std::string scratch_dir = "/tmp";  // where sources and objects are written
  // The compiler is killed (with everything it started) past this, and
  // Compile fails with DEADLINE_EXCEEDED.
  absl::Duration timeout = absl::Seconds(120);
  // When set and it turns true, the compiler is killed and Compile fails
  // with CANCELLED. Must outlive Compile.
  const std::atomic<bool>* cancel = nullptr;
};

std::unique_ptr<CodegenBackend> MakeCppBackend(const CppOptions& options);

struct CudaOptions {
  std::string sm_arch = "sm_90";  // NVRTC's --gpu-architecture
  // The CUDA version the code is for ("13.0"); Compile fails with
  // FAILED_PRECONDITION naming both when NVRTC is another. Empty: any.
  std::string cuda_version;
  // The program that runs NVRTC (compiler/codegen/nvrtc_main.cc): NVRTC runs
  // in a process of its own, under the time limit and killed on cancel like
  // g++, and a crash in it cannot take the server down. Empty: the
  // kiln_nvrtc beside the running program, else the one of the build tree.
  std::string helper;
  // NVRTC's --Ofast-compile level: "min", "mid" or "max" (shorter compiles,
  // less optimized code); empty: full optimization. Not in the key: code
  // compiled at any level computes the same.
  std::string fast_compile;
  std::string scratch_dir = "/tmp";
  absl::Duration timeout = absl::Seconds(120);
  const std::atomic<bool>* cancel = nullptr;
};

// NVRTC's --Ofast-compile level of a tiered compile's quick artifact
// (compiler/target/target.h, ToolchainOptions::quick), where it has kernels:
// kilnd's quick artifact runs the graph through ATen instead, and compiles
// quick kernels only for a graph that artifact does not take and for
// injected faults (server/backend.cc).
inline constexpr char kQuickNvrtcLevel[] = "mid";

// language() "cuda"; modules hold a CUBIN. NVRTC runs in helpers that stay
// between compiles (kiln_nvrtc --serve; toolchain.h): NVRTC's first compile
// in a process costs several times the next ones.
std::unique_ptr<CodegenBackend> MakeCudaBackend(const CudaOptions& options);

// Starts `helpers` serving NVRTC helpers at once (at most as many as stay
// idle between compiles), each compiling a small kernel, so that the
// compiles that follow do not pay NVRTC's start-up (kilnd does this as it
// starts). Returns how many compiled; what failed is left for those
// compiles to report.
int WarmCudaCompiles(const CudaOptions& options, int helpers);

}  // namespace kiln::codegen

#endif  // KILN_COMPILER_CODEGEN_CODEGEN_H_
