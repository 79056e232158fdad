// The CUDA backend: loop::Kernels -> one CUDA C++ translation unit -> a CUBIN
// built by NVRTC (in the kiln_nvrtc helper process) for one SM arch. How a
// kernel maps onto threads (layout, block size, register caching, vector
// width, 32-bit indices, launch size) is decided in cuda_schedule.h, and
// written by CudaKernelEmitter (cuda_codegen_internal.h); this file holds
// the backend: generating a module's source, compiling it through the
// NVRTC helper, and sizing launches.
//
// Shape of the generated kernels:
//   - Without reductions, a grid-stride loop over the flattened space, each
//     thread one element (or one 16-byte chunk):
//
//       struct kernel_0_args { void* b[3]; int64_t s[1]; };
//       extern "C" __global__ void __launch_bounds__(256) kernel_0(const kernel_0_args a) {
//         const int64_t s0 = a.s[0];
//         const float* __restrict__ buf0 = static_cast<const float*>(a.b[0]);  // x
//         ...
//         for (int64_t x = ...; x < outer_n * inner_n; x += gridDim.x * 256) {
//           const int64_t o = x / inner_n, i = x - o * inner_n;
//           loads, scalar ops, stores
//         }
//       }
//
//   - With reductions, one block per row (grid-stride over rows), or 32
//     rows per block in the column layout (several groups of 32 where the
//     schedule says so): each pass sweeps the row with the threads, every
//     thread keeping its own accumulators; they are then combined (warp
//     shuffles, then one value per warp through shared memory) so that
//     every thread holds the row's result for the statements after the
//     sweep, whose stores one thread makes. Welford's mean and M2 merge by
//     Chan's formula, per element or, in a sweep by vectors, per chunk.
//
// Values compute as on the CPU (c_family.h): float16 and bfloat16 in float32,
// stored as 16-bit patterns; sums accumulate in the compute type per thread
// and then in a tree. A kernel whose every store is 16-bit is generated
// inside namespace kiln_fast, whose exp and division are the hardware's
// approximations (the CUDA prelude says how close).
#include <algorithm>
#include <atomic>
#include <filesystem>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "common/status_macros.h"
#include "compiler/codegen/c_family.h"
#include "compiler/codegen/codegen.h"
#include "compiler/codegen/cuda_codegen_internal.h"
#include "compiler/codegen/cuda_prelude.h"
#include "compiler/codegen/cuda_schedule.h"
#include "compiler/codegen/toolchain.h"

namespace kiln::codegen {
namespace {

using cuda_internal::CudaKernelEmitter;
using loop::Kernel;

// The CUDA version ("13.0") of the NVRTC that `helper` runs, asked once per
// helper.
absl::StatusOr<std::string> NvrtcVersion(const std::string& helper, absl::Duration timeout) {
  static absl::Mutex mu(absl::kConstInit);
  static auto* versions = new std::map<std::string, std::string>();
  {
    absl::MutexLock lock(&mu);
    auto it = versions->find(helper);
    if (it != versions->end()) return it->second;
  }
  const std::vector<std::string> argv = {helper, "--version"};
  ASSIGN_OR_RETURN(CommandResult run, RunCommand(argv, timeout, nullptr));
  if (!Succeeded(run)) return CompilerFailed("NVRTC", absl::StrJoin(argv, " "), run);
  const std::string version(absl::StripAsciiWhitespace(run.log));
  absl::MutexLock lock(&mu);
  (*versions)[helper] = version;
  return version;
}

}  // namespace

std::string NvrtcHelper(const std::string& configured) {
  if (!configured.empty()) return configured;
  std::error_code ec;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    const std::filesystem::path beside = self.parent_path() / "kiln_nvrtc";
    if (std::filesystem::exists(beside, ec)) return beside.string();
  }
  return KILN_NVRTC_HELPER_BUILD_PATH;
}

CompilerWorkers& NvrtcWorkers(const std::string& helper, const std::string& fast_compile) {
  static absl::Mutex mu(absl::kConstInit);
  // Never destroyed: the workers end with kilnd (their stdin closes).
  static auto* workers =
      new std::map<std::pair<std::string, std::string>, std::unique_ptr<CompilerWorkers>>();
  absl::MutexLock lock(&mu);
  std::unique_ptr<CompilerWorkers>& w = (*workers)[{helper, fast_compile}];
  if (w == nullptr) {
    std::vector<std::string> argv = {helper};
    if (!fast_compile.empty()) argv.push_back(absl::StrCat("--fast-compile=", fast_compile));
    argv.push_back("--serve");
    w = std::make_unique<CompilerWorkers>(std::move(argv), kMaxIdleNvrtcWorkers);
  }
  return *w;
}

namespace {

class CudaBackend : public CodegenBackend {
 public:
  explicit CudaBackend(CudaOptions options) : options_(std::move(options)) {}

  std::string language() const override { return "cuda"; }

  absl::StatusOr<std::string> Generate(const std::vector<loop::Kernel>& kernels,
                                       const std::vector<std::string>& symbols) const override {
    return GenerateUnit(kCudaPrelude, kernels, symbols,
                        [](const Kernel& kernel, const SymbolTable& table) {
                          return CudaKernelEmitter(kernel, table).Emit();
                        });
  }

  absl::StatusOr<v1::CompiledModule> Compile(const std::string& source) const override {
    ASSIGN_OR_RETURN(TempFile src, TempFile::Create(options_.scratch_dir, ".cu"));
    ASSIGN_OR_RETURN(TempFile cubin, TempFile::Create(options_.scratch_dir, ".cubin"));
    RETURN_IF_ERROR(WriteFile(src.path(), source));
    const std::string helper = NvrtcHelper(options_.helper);
    if (!options_.cuda_version.empty()) {
      ASSIGN_OR_RETURN(std::string version, NvrtcVersion(helper, options_.timeout));
      if (version != options_.cuda_version) {
        return absl::FailedPreconditionError(
            absl::StrCat("options.target.cuda_version is ", options_.cuda_version,
                         ", but this server's NVRTC is ", version, ": compile with cuda_version ",
                         version, " or on a server that has ", options_.cuda_version));
      }
    }
    std::vector<std::string> argv = {helper};
    if (!options_.fast_compile.empty()) {
      argv.push_back(absl::StrCat("--fast-compile=", options_.fast_compile));
    }
    for (const std::string& a :
         {absl::StrCat("--arch=", options_.sm_arch), std::string("-o"), cubin.path(), src.path()}) {
      argv.push_back(a);
    }
    const std::string command = absl::StrJoin(argv, " ");
    // A serving helper first; the helper run once when none can serve.
    absl::StatusOr<CommandResult> run = absl::UnavailableError("");
    const std::string request =
        absl::StrCat(options_.sm_arch, "\n", src.path(), "\n", cubin.path(), "\n");
    if (absl::StrContains(options_.sm_arch, '\n') || absl::StrContains(src.path(), '\n') ||
        absl::StrContains(cubin.path(), '\n')) {
      run = absl::UnavailableError("a line break in a path");
    } else {
      run = NvrtcWorkers(helper, options_.fast_compile)
                .Run(request, options_.timeout, options_.cancel);
    }
    if (absl::IsUnavailable(run.status())) {
      run = RunCommand(argv, options_.timeout, options_.cancel);
    }
    if (!run.ok()) return run.status();
    if (!Succeeded(*run)) return CompilerFailed("NVRTC", command, *run);
    ASSIGN_OR_RETURN(std::string binary, ReadFile(cubin.path()));
    v1::CompiledModule module;
    module.set_language(language());
    module.set_source(source);
    module.set_binary(std::move(binary));
    module.set_compile_command(command);
    return module;
  }

  absl::StatusOr<LaunchSize> Launch(const loop::Kernel& kernel) const override {
    return SizeLaunch(kernel);
  }

  std::string CompileIdentity() const override {
    return absl::StrCat("nvrtc ", NvrtcHelper(options_.helper), " --arch=", options_.sm_arch,
                        " cuda_version=", options_.cuda_version,
                        " fast_compile=", options_.fast_compile);
  }

 private:
  const CudaOptions options_;
};

}  // namespace

std::unique_ptr<CodegenBackend> MakeCudaBackend(const CudaOptions& options) {
  return std::make_unique<CudaBackend>(options);
}

int WarmCudaCompiles(const CudaOptions& options, int helpers) {
  helpers = std::min(helpers, kMaxIdleNvrtcWorkers);  // more would not stay
  const CudaBackend backend(options);
  std::atomic<int> compiled{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < helpers; ++i) {
    threads.emplace_back([&] {
      if (backend.Compile("extern \"C\" __global__ void kiln_warm(float* x) { x[0] = 1.0f; }\n")
              .ok()) {
        ++compiled;
      }
    });
  }
  for (std::thread& t : threads) t.join();
  return compiled.load();
}

}  // namespace kiln::codegen
