#include "server/backend.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "compiler/autograd/joint_graph.h"
#include "compiler/autograd/partition.h"
#include "compiler/codegen/codegen.h"
#include "compiler/ir/canonical.h"
#include "compiler/ir/printer.h"
#include "compiler/loop/lowering.h"

namespace kiln::server {
namespace {

class EagerBackend final : public Backend {
 public:
  std::string name() const override { return "eager"; }

  absl::StatusOr<v1::Artifact> Compile(const CompileInput& input,
                                       PhaseTimes* times) const override {
    v1::Artifact artifact = NewArtifact(input, name());
    *artifact.mutable_graph() =
        times->Time("canonicalize", [&] { return ir::Canonicalize(input.graph); });
    artifact.mutable_graph()->set_name(input.graph.name());
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
    *artifact.mutable_graph() =
        times->Time("canonicalize", [&] { return ir::Canonicalize(input.graph); });
    artifact.mutable_graph()->set_name(input.graph.name());
    ASSIGN_OR_RETURN(autograd::JointGraph joint, times->Time("joint-graph", [&] {
      return autograd::BuildJointGraph(input.graph, autograd::JointOptions());
    }));
    ASSIGN_OR_RETURN(autograd::Partition split, times->Time("partition", [&] {
      return autograd::PartitionJointGraph(joint);
    }));
    FillAutograd(joint, split, artifact.mutable_autograd());
    return artifact;
  }
};

// `kiln`: fused kernels generated as C++ and compiled with g++, plus the
// execution plan that runs them; training graphs are split by the
// partitioner first and both halves compiled.
class KilnBackend final : public Backend {
 public:
  explicit KilnBackend(const BackendOptions& options) : options_(options) {}

  std::string name() const override { return "kiln"; }

  absl::StatusOr<v1::Artifact> Compile(const CompileInput& input,
                                       PhaseTimes* times) const override {
    v1::Artifact artifact = NewArtifact(input, name());
    auto& trace = *input.trace;
    trace["input_graph.txt"] = ir::PrintReadable(input.graph);
    codegen::CppOptions cpp;
    cpp.isa = input.options.target().cpu_isa();
    cpp.scratch_dir = options_.scratch_dir;
    cpp.timeout = options_.native_compile_timeout;
    cpp.cancel = input.cancel;
    cpp.compiler = options_.native_compiler;
    std::unique_ptr<codegen::CodegenBackend> backend = codegen::MakeCppBackend(cpp);

    bool training = false;
    for (const auto& in : input.graph.inputs()) {
      training = training || input.graph.value(in.value).meta.requires_grad;
    }
    if (!training) {
      ASSIGN_OR_RETURN(*artifact.mutable_compiled(),
                       CompileGraph(input.graph, "", *backend, times, &trace));
      return artifact;
    }
    ASSIGN_OR_RETURN(autograd::JointGraph joint, times->Time("joint-graph", [&] {
      return autograd::BuildJointGraph(input.graph, autograd::JointOptions());
    }));
    ASSIGN_OR_RETURN(autograd::Partition split, times->Time("partition", [&] {
      return autograd::PartitionJointGraph(joint);
    }));
    trace["joint_graph.txt"] = ir::PrintReadable(joint.graph);
    trace["forward_graph.txt"] = ir::PrintReadable(split.forward);
    trace["backward_graph.txt"] = ir::PrintReadable(split.backward);
    FillAutograd(joint, split, artifact.mutable_autograd());
    ASSIGN_OR_RETURN(*artifact.mutable_compiled_forward(),
                     CompileGraph(split.forward, "forward_", *backend, times, &trace));
    ASSIGN_OR_RETURN(*artifact.mutable_compiled_backward(),
                     CompileGraph(split.backward, "backward_", *backend, times, &trace));
    return artifact;
  }

 private:
  const BackendOptions options_;

  static absl::StatusOr<v1::CompiledGraph> CompileGraph(const ir::Graph& graph,
                                                        const std::string& prefix,
                                                        const codegen::CodegenBackend& backend,
                                                        PhaseTimes* times,
                                                        std::map<std::string, std::string>* trace) {
    (*trace)[prefix + "ir_before_fusion.txt"] = ir::PrintReadable(graph);
    ASSIGN_OR_RETURN(loop::LoweredGraph lowered, times->Time(prefix + "lower-fuse-plan", [&] {
      return loop::LowerGraph(graph);
    }));
    (*trace)[prefix + "ir_after_fusion.txt"] = loop::PrintLowered(lowered);
    v1::CompiledGraph out;
    *out.mutable_plan() = lowered.plan;
    if (lowered.kernels.empty()) return out;
    ASSIGN_OR_RETURN(std::string source, times->Time(prefix + "codegen", [&] {
      return backend.Generate(lowered.kernels, lowered.symbols);
    }));
    (*trace)[prefix + "generated_code.cc"] = source;
    auto module = times->Time(prefix + "native-compile", [&] { return backend.Compile(source); });
    if (!module.ok()) {
      // The whole compiler log, when the code generator attached it.
      auto log = module.status().GetPayload(codegen::kCompilerLogPayload);
      (*trace)[prefix + "compile_error.txt"] =
          log.has_value() ? std::string(*log) : std::string(module.status().message());
      return module.status();
    }
    *out.add_modules() = *std::move(module);
    return out;
  }
};

}  // namespace

void FillAutograd(const autograd::JointGraph& joint, const autograd::Partition& split,
                  v1::AutogradGraphs* out) {
  split.forward.ToProto(out->mutable_forward());
  split.backward.ToProto(out->mutable_backward());
  joint.graph.ToProto(out->mutable_joint());
  out->set_num_forward_outputs(split.num_forward_outputs);
  for (const auto& s : split.saved) out->add_saved(s);
  out->set_saved_bytes(split.saved_bytes);
  for (bool b : joint.inputs_need_grad) out->add_inputs_need_grad(b);
  for (bool b : joint.outputs_receive_grad) out->add_outputs_receive_grad(b);
  std::vector<int> by_output(joint.graph.outputs().size() - joint.num_forward_outputs, -1);
  for (size_t i = 0; i < joint.grad_output_index.size(); ++i) {
    if (joint.grad_output_index[i] >= 0) {
      by_output[joint.grad_output_index[i] - joint.num_forward_outputs] = static_cast<int>(i);
    }
  }
  for (int i : by_output) out->add_grad_input_index(i);
  for (const auto& r : split.recomputed) out->add_recomputed(r);
}

void PhaseTimes::Add(const std::string& name, int64_t micros) {
  v1::PhaseTime t;
  t.set_phase(name);
  t.set_micros(micros);
  phases_.push_back(std::move(t));
}

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
