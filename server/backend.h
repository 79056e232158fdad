// Compile backends: each names how far the compile pipeline
// (compiler/pipeline/pipeline.h) runs. `eager` stops after canonicalization
// (the runtime runs the graph op by op); `aot_eager` adds the joint graph and
// the min-cut partition; `kiln` adds the target's lowering, fusion, codegen
// and native compilation.
//
// Backends are stateless and thread-safe: workers call Compile concurrently.
#ifndef KILN_SERVER_BACKEND_H_
#define KILN_SERVER_BACKEND_H_

#include <atomic>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "compiler/codegen/cuda_tuner.h"
#include "compiler/codegen/modules.h"
#include "compiler/ir/graph.h"
#include "compiler/pipeline/pipeline.h"
#include "kiln/v1/service.pb.h"

namespace kiln::server {

using pipeline::PhaseTimes;

struct CompileInput {
  const ir::Graph& graph;
  const v1::GuardSet& guards;
  const v1::CompileOptions& options;  // normalized
  const std::string& key;
  // Debug trace files, written as the stages run (so a failed compile still
  // leaves what it got as far as); the engine puts them in the artifact.
  std::map<std::string, std::string>* trace;
  // Set when nobody waits for the result any more: a backend stops at the
  // next point it checks (the native compiler is killed) with CANCELLED.
  const std::atomic<bool>* cancel = nullptr;
  // Build the backend's quick artifact (a tiered compile's first,
  // CompileRequest.quick_first): for `kiln`, the graph run through ATen, or
  // where that cannot be, kernels from shorter native compiles; slower
  // code, no autotuning. Only for backends with has_quick_level(). The
  // engine gives such a compile no worker slot: it must stay cheap.
  bool quick = false;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  // The artifact for `input`; phases are recorded in `times`.
  virtual absl::StatusOr<v1::Artifact> Compile(const CompileInput& input,
                                               PhaseTimes* times) const = 0;
  // Whether Compile has a quick level (CompileInput::quick) that differs
  // from its optimized one.
  virtual bool has_quick_level() const { return false; }
};

// The artifact fields every backend fills the same way.
v1::Artifact NewArtifact(const CompileInput& input, const std::string& backend);

// `eager`: the verified canonical graph and its guards.
std::unique_ptr<Backend> MakeEagerBackend();

// What the backends that run a native compiler need from the server.
struct BackendOptions {
  std::string scratch_dir = "/tmp";  // sources and objects while g++ or NVRTC runs
  absl::Duration native_compile_timeout = absl::Seconds(120);  // per g++ or NVRTC run
  std::string native_compiler = "g++";                         // searched in PATH
  std::string nvrtc_helper;        // empty: kiln_nvrtc beside kilnd (codegen.h, CudaOptions)
  std::string nvrtc_fast_compile;  // NVRTC's --Ofast-compile level; empty: none
  // Native compiler processes per graph (compiler/codegen/modules.h), and
  // the slots every graph's compiles share; null: no bound beyond a
  // graph's own.
  int compile_jobs = 1;
  std::shared_ptr<codegen::CompileSlots> compile_slots;
  // Kernels compiled before, by any graph, served rather than compiled
  // again (compiler/codegen/kernel_cache.h); null: none kept.
  std::shared_ptr<codegen::KernelCache> kernel_cache;
  // The graphs whose convolutions run channels-last on cuda
  // (compiler/pipeline/conv_layouts.h).
  pipeline::KilnOptions::ChannelsLast channels_last =
      pipeline::KilnOptions::ChannelsLast::kInference;
  // Times cuda kernels' block sizes on a GPU of this process, for the
  // requests that ask (kAutotuneOption) or, with tune_every_compile, for
  // all; null: the schedule's heuristics.
  std::shared_ptr<codegen::CudaTuner> tuner;
  bool tune_every_compile = false;
};

// Backends by name.
class BackendRegistry {
 public:
  // Holds every backend this build has.
  static BackendRegistry Default(const BackendOptions& options = {});
  void Add(std::unique_ptr<Backend> backend);
  // INVALID_ARGUMENT listing the known backends when `name` is not one.
  absl::StatusOr<const Backend*> Find(const std::string& name) const;

 private:
  std::map<std::string, std::shared_ptr<const Backend>> backends_;
};

inline constexpr uint32_t kArtifactFormatVersion = 1;

// The backend options (CompileOptions.options) kilnd knows; any other name is
// INVALID_ARGUMENT. inject_fault: "KIND:TARGET" (compiler/pipeline/fault.h).
// debug_function: a regular expression (RE2); only graphs whose name it
// matches get the requested backend, the others `eager`. autotune: "on"
// (time the cuda kernels' block sizes, when kilnd has a GPU: torch.compile's
// mode="max-autotune") or "off".
inline constexpr char kInjectFaultOption[] = "inject_fault";
inline constexpr char kDebugFunctionOption[] = "debug_function";
inline constexpr char kAutotuneOption[] = "autotune";

}  // namespace kiln::server

#endif  // KILN_SERVER_BACKEND_H_
