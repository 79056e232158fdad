#include "server/backend.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"

namespace kiln::server {
namespace {

class EagerBackend final : public Backend {
 public:
  std::string name() const override { return "eager"; }

  absl::StatusOr<v1::Artifact> Compile(const CompileInput& input,
                                       PhaseTimes* times) const override {
    v1::Artifact artifact = NewArtifact(input, name());
    pipeline::RunEager(input.graph, times, &artifact);
    return artifact;
  }
};

// `aot_eager`: the joint forward/backward graph, split by the min-cut
// partitioner; the runtime runs both halves op by op as one autograd
// function. Which inputs need gradients comes from their metadata.
class AotEagerBackend final : public Backend {
 public:
  std::string name() const override { return "aot_eager"; }

  absl::StatusOr<v1::Artifact> Compile(const CompileInput& input,
                                       PhaseTimes* times) const override {
    v1::Artifact artifact = NewArtifact(input, name());
    RETURN_IF_ERROR(pipeline::RunAotEager(input.graph, times, &artifact));
    return artifact;
  }
};

// `kiln`: fused kernels for the target (C++ through g++, CUDA C++ through
// NVRTC) and the execution plan that runs them; training graphs are split by
// the partitioner first and both halves compiled.
class KilnBackend final : public Backend {
 public:
  explicit KilnBackend(const BackendOptions& options) : options_(options) {}

  std::string name() const override { return "kiln"; }

  absl::StatusOr<v1::Artifact> Compile(const CompileInput& input,
                                       PhaseTimes* times) const override {
    if (input.quick) {
      absl::StatusOr<v1::Artifact> interpreted = Interpreted(input, times);
      if (interpreted.ok()) return interpreted;
      // A graph whose joint graph failed here, or with an injected fault,
      // gets quick kernels instead (g++ -O1, NVRTC's --Ofast-compile=mid).
    }
    v1::Artifact artifact = NewArtifact(input, name());
    pipeline::KilnOptions kiln;
    kiln.toolchain.scratch_dir = options_.scratch_dir;
    kiln.toolchain.timeout = options_.native_compile_timeout;
    kiln.toolchain.cpp_compiler = options_.native_compiler;
    kiln.toolchain.nvrtc_helper = options_.nvrtc_helper;
    kiln.toolchain.nvrtc_fast_compile = options_.nvrtc_fast_compile;
    kiln.toolchain.cancel = input.cancel;
    kiln.toolchain.quick = input.quick;
    kiln.compile_jobs = options_.compile_jobs;
    kiln.compile_slots = options_.compile_slots.get();
    kiln.kernel_cache = options_.kernel_cache.get();
    kiln.channels_last = options_.channels_last;
    bool tune = options_.tune_every_compile;
    for (const auto& o : input.options.options()) {
      if (o.name() == kAutotuneOption) tune = o.value() == "on";
      if (o.name() != kInjectFaultOption) continue;
      ASSIGN_OR_RETURN(kiln.fault, pipeline::ParseFault(o.value()));
    }
    if (tune && !input.quick) kiln.tuner = options_.tuner.get();
    RETURN_IF_ERROR(pipeline::RunKiln(input.graph, input.options.target(), kiln, times, input.trace,
                                      &artifact));
    return artifact;
  }

  bool has_quick_level() const override { return true; }

 private:
  // The quick level: no native compile at all. The runtime runs the graph
  // op by op on ATen's kernels (as `eager`, or as `aot_eager` when an input
  // requires grad, whose backward graph it runs as well) until the
  // optimized artifact arrives. NVRTC takes 60-130 ms on one kernel even at
  // its quickest level (g++ -O1 longer), and quick kernels compiled beside
  // the optimized ones take cores from them; this artifact takes a few
  // milliseconds. Not with an injected fault, which is a kernel's.
  static absl::StatusOr<v1::Artifact> Interpreted(const CompileInput& input, PhaseTimes* times) {
    for (const auto& o : input.options.options()) {
      if (o.name() == kInjectFaultOption) {
        return absl::FailedPreconditionError("a fault is injected into the kernels");
      }
    }
    const bool training = pipeline::AnyInputRequiresGrad(input.graph);
    v1::Artifact artifact = NewArtifact(input, training ? "aot_eager" : "eager");
    if (!training) {
      pipeline::RunEager(input.graph, times, &artifact);
      return artifact;
    }
    RETURN_IF_ERROR(pipeline::RunAotEager(input.graph, times, &artifact));
    return artifact;
  }

  const BackendOptions options_;
};

}  // namespace

v1::Artifact NewArtifact(const CompileInput& input, const std::string& backend) {
  v1::Artifact a;
  a.set_format_version(kArtifactFormatVersion);
  a.set_backend(backend);
  a.set_compiler_version(KILN_COMPILER_VERSION);
  *a.mutable_target() = input.options.target();
  *a.mutable_guards() = input.guards;
  a.set_key(input.key);
  return a;
}

std::unique_ptr<Backend> MakeEagerBackend() { return std::make_unique<EagerBackend>(); }

BackendRegistry BackendRegistry::Default(const BackendOptions& options) {
  BackendRegistry r;
  r.Add(MakeEagerBackend());
  r.Add(std::make_unique<AotEagerBackend>());
  r.Add(std::make_unique<KilnBackend>(options));
  return r;
}

void BackendRegistry::Add(std::unique_ptr<Backend> backend) {
  std::string name = backend->name();
  backends_[name] = std::shared_ptr<const Backend>(std::move(backend));
}

absl::StatusOr<const Backend*> BackendRegistry::Find(const std::string& name) const {
  auto it = backends_.find(name);
  if (it != backends_.end()) return it->second.get();
  std::vector<std::string> known;
  for (const auto& [n, b] : backends_) known.push_back(n);
  return absl::InvalidArgumentError(absl::StrCat("options.backend: unknown backend '", name,
                                                 "' (known: ", absl::StrJoin(known, ", "), ")"));
}

}  // namespace kiln::server
