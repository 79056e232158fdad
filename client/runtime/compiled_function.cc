// CompiledFunction (compiled_function.h): the artifact's graphs, each run by
// the reference interpreter or (for `kiln`) a plan executor, plus the
// bookkeeping that splits the forward graph's outputs into outputs and saved
// values and maps the backward graph's outputs back to the primals.
#include "client/runtime/compiled_function.h"
#include "common/hashing.h"
#include "common/signing.h"
#include "compiler/ir/canonical.h"

#include <ATen/ops/zeros.h>
#include <c10/core/GradMode.h>

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "client/runtime/cpu_features.h"
#include "common/status_macros.h"
#include "compiler/ir/graph.h"

namespace kiln::runtime {
namespace {

// The newest artifact format this runtime reads (the server's
// kArtifactFormatVersion, server/backend.h).
constexpr uint32_t kMaxArtifactFormatVersion = 1;

// `status` with `context` in front of its message, same code.
absl::Status Annotate(const absl::Status& status, const std::string& context) {
  return absl::Status(status.code(), absl::StrCat(context, ": ", status.message()));
}

absl::StatusOr<std::unique_ptr<Interpreter>> Load(const v1::Graph& proto,
                                                  const std::string& field) {
  absl::StatusOr<ir::Graph> graph = ir::Graph::FromProto(proto);
  if (!graph.ok()) return Annotate(graph.status(), field);
  absl::StatusOr<std::unique_ptr<Interpreter>> interpreter = Interpreter::Create(*std::move(graph));
  if (!interpreter.ok()) return Annotate(interpreter.status(), field);
  return interpreter;
}

absl::StatusOr<std::unique_ptr<PlanExecutor>> LoadPlan(const v1::CompiledGraph& graph,
                                                       const std::string& field,
                                                       const v1::Target& target) {
  absl::StatusOr<std::unique_ptr<PlanExecutor>> plan =
      PlanExecutor::Create(graph, target.device_type() == "cuda" ? target.sm_arch() : "");
  if (!plan.ok()) return Annotate(plan.status(), field);
  return plan;
}

std::string SizesString(at::IntArrayRef sizes) {
  std::string s = "[";
  for (size_t i = 0; i < sizes.size(); ++i) absl::StrAppend(&s, i ? ", " : "", sizes[i]);
  return s + "]";
}

}  // namespace

CompiledFunction::~CompiledFunction() = default;

absl::StatusOr<std::vector<at::Tensor>> CompiledFunction::Runner::Run(
    const std::vector<at::Tensor>& inputs) const {
  if (interpreter != nullptr) return interpreter->Run(inputs);
  return plan->Run(inputs);
}

absl::StatusOr<std::unique_ptr<CompiledFunction>> CompiledFunction::CreateVerified(
    const v1::Artifact& artifact, const std::string& digest, const std::string& signature,
    const std::string& public_key_pem) {
  const std::string actual = Sha256Hex(ir::DeterministicBytes(artifact));
  if (actual != digest) {
    return absl::PermissionDeniedError(
        absl::StrCat("the artifact's bytes hash to ", actual, ", not to its digest ", digest));
  }
  RETURN_IF_ERROR(VerifySignature(public_key_pem, digest, signature));
  return Create(artifact);
}

absl::Status CheckArtifactHeader(uint32_t format_version, absl::string_view device_type,
                                 const std::string& cpu_isa) {
  if (format_version > kMaxArtifactFormatVersion) {
    return absl::FailedPreconditionError(absl::StrCat("artifact.format_version ", format_version,
                                                      " is newer than this runtime reads (",
                                                      kMaxArtifactFormatVersion, ")"));
  }
  if (device_type == "cuda") return absl::OkStatus();
  return CheckCpuSupports(cpu_isa);
}

absl::StatusOr<std::unique_ptr<CompiledFunction>> CompiledFunction::Create(
    const v1::Artifact& artifact) {
  RETURN_IF_ERROR(CheckArtifactHeader(artifact.format_version(), artifact.target().device_type(),
                                      artifact.target().cpu_isa()));
  std::unique_ptr<CompiledFunction> fn(new CompiledFunction());
  fn->backend_ = artifact.backend();

  if (artifact.backend() == "eager") {
    if (!artifact.has_graph()) {
      return absl::FailedPreconditionError("eager artifact: artifact.graph is missing");
    }
    ASSIGN_OR_RETURN(fn->forward_.interpreter, Load(artifact.graph(), "artifact.graph"));
    const ir::Graph& g = fn->forward_.interpreter->graph();
    fn->name_ = g.name();
    fn->num_inputs_ = static_cast<int>(g.inputs().size());
    fn->num_outputs_ = static_cast<int>(g.outputs().size());
    fn->inputs_need_grad_.assign(fn->num_inputs_, false);
    fn->outputs_receive_grad_.assign(fn->num_outputs_, false);
    return fn;
  }

  if (artifact.backend() == "kiln") {
    fn->name_ = artifact.graph().name();
    if (!artifact.has_compiled_forward() && !artifact.has_compiled_backward()) {
      if (!artifact.has_compiled()) {
        return absl::FailedPreconditionError(
            "kiln artifact: neither artifact.compiled nor artifact.compiled_forward is present");
      }
      ASSIGN_OR_RETURN(fn->forward_.plan,
                       LoadPlan(artifact.compiled(), "artifact.compiled", artifact.target()));
      fn->num_inputs_ = fn->forward_.plan->num_inputs();
      fn->num_outputs_ = fn->forward_.plan->num_outputs();
      fn->inputs_need_grad_.assign(fn->num_inputs_, false);
      fn->outputs_receive_grad_.assign(fn->num_outputs_, false);
      return fn;
    }
    for (const auto& [present, field] :
         {std::pair{artifact.has_compiled_forward(), "artifact.compiled_forward"},
          std::pair{artifact.has_compiled_backward(), "artifact.compiled_backward"},
          std::pair{artifact.has_autograd(), "artifact.autograd"}}) {
      if (!present) {
        return absl::FailedPreconditionError(
            absl::StrCat("kiln training artifact: ", field, " is missing"));
      }
    }
    ASSIGN_OR_RETURN(fn->forward_.plan, LoadPlan(artifact.compiled_forward(),
                                                 "artifact.compiled_forward", artifact.target()));
    ASSIGN_OR_RETURN(fn->backward_.plan, LoadPlan(artifact.compiled_backward(),
                                                  "artifact.compiled_backward", artifact.target()));
    if (fn->name_.empty()) fn->name_ = artifact.autograd().forward().name();
    fn->num_inputs_ = fn->forward_.plan->num_inputs();
    RETURN_IF_ERROR(fn->InitAutograd(artifact.autograd(), fn->forward_.plan->num_outputs(),
                                     "artifact.compiled_backward", fn->backward_.plan->num_inputs(),
                                     fn->backward_.plan->num_outputs()));
    return fn;
  }

  if (artifact.backend() != "aot_eager") {
    return absl::FailedPreconditionError(
        absl::StrCat("artifact.backend '", artifact.backend(),
                     "': this runtime runs only 'eager', 'aot_eager' and 'kiln' artifacts"));
  }
  const v1::AutogradGraphs& ag = artifact.autograd();
  if (!artifact.has_autograd()) {
    return absl::FailedPreconditionError("aot_eager artifact: artifact.autograd is missing");
  }
  if (!ag.has_forward()) {
    return absl::FailedPreconditionError(
        "aot_eager artifact: artifact.autograd.forward is missing");
  }
  if (!ag.has_backward()) {
    return absl::FailedPreconditionError(
        "aot_eager artifact: artifact.autograd.backward is missing");
  }
  ASSIGN_OR_RETURN(fn->forward_.interpreter, Load(ag.forward(), "artifact.autograd.forward"));
  ASSIGN_OR_RETURN(fn->backward_.interpreter, Load(ag.backward(), "artifact.autograd.backward"));
  const ir::Graph& fwd = fn->forward_.interpreter->graph();
  const ir::Graph& bwd = fn->backward_.interpreter->graph();
  fn->name_ = artifact.graph().name().empty() ? fwd.name() : artifact.graph().name();
  fn->num_inputs_ = static_cast<int>(fwd.inputs().size());
  RETURN_IF_ERROR(fn->InitAutograd(
      ag, static_cast<int>(fwd.outputs().size()), "artifact.autograd.backward",
      static_cast<int>(bwd.inputs().size()), static_cast<int>(bwd.outputs().size())));
  return fn;
}

// The autograd bookkeeping, checked against the forward and backward graphs'
// counts; num_inputs_ is set.
absl::Status CompiledFunction::InitAutograd(const v1::AutogradGraphs& ag, int fwd_outputs,
                                            const std::string& backward_field, int bwd_inputs,
                                            int bwd_outputs) {
  has_backward_ = true;
  num_outputs_ = ag.num_forward_outputs();
  num_saved_ = ag.saved_size();
  if (num_outputs_ < 0 || num_outputs_ + num_saved_ != fwd_outputs) {
    return absl::InvalidArgumentError(
        absl::StrCat("artifact.autograd: num_forward_outputs (", num_outputs_, ") + saved (",
                     num_saved_, ") must equal the forward graph's ", fwd_outputs, " outputs"));
  }
  if (ag.inputs_need_grad_size() != num_inputs_) {
    return absl::InvalidArgumentError(
        absl::StrCat("artifact.autograd.inputs_need_grad has ", ag.inputs_need_grad_size(),
                     " entries; the forward graph has ", num_inputs_, " inputs"));
  }
  if (ag.outputs_receive_grad_size() != num_outputs_) {
    return absl::InvalidArgumentError(
        absl::StrCat("artifact.autograd.outputs_receive_grad has ", ag.outputs_receive_grad_size(),
                     " entries; num_forward_outputs is ", num_outputs_));
  }
  inputs_need_grad_.assign(ag.inputs_need_grad().begin(), ag.inputs_need_grad().end());
  outputs_receive_grad_.assign(ag.outputs_receive_grad().begin(), ag.outputs_receive_grad().end());
  int tangents = 0;
  for (bool b : outputs_receive_grad_) tangents += b ? 1 : 0;
  if (bwd_inputs != num_saved_ + tangents) {
    return absl::InvalidArgumentError(absl::StrCat(backward_field, " takes ", bwd_inputs,
                                                   " inputs; expected ", num_saved_,
                                                   " saved values + ", tangents, " tangents"));
  }
  if (ag.grad_input_index_size() != bwd_outputs) {
    return absl::InvalidArgumentError(
        absl::StrCat("artifact.autograd.grad_input_index has ", ag.grad_input_index_size(),
                     " entries; the backward graph has ", bwd_outputs, " outputs"));
  }
  std::vector<bool> seen(num_inputs_, false);
  for (int k = 0; k < ag.grad_input_index_size(); ++k) {
    const int i = ag.grad_input_index(k);
    if (i < 0 || i >= num_inputs_ || !inputs_need_grad_[i] || seen[i]) {
      return absl::InvalidArgumentError(
          absl::StrCat("artifact.autograd.grad_input_index[", k, "] = ", i,
                       ": not a primal that needs a gradient, or one that already has one"));
    }
    seen[i] = true;
    grad_input_index_.push_back(i);
  }
  return absl::OkStatus();
}

absl::StatusOr<CompiledFunction::ForwardResult> CompiledFunction::forward(
    const std::vector<at::Tensor>& inputs) const {
  if (static_cast<int>(inputs.size()) != num_inputs_) {
    return absl::InvalidArgumentError(absl::StrCat("compiled function '", name_, "' takes ",
                                                   num_inputs_, " inputs, got ", inputs.size()));
  }
  ForwardResult result;
  if (!has_backward_) {
    if (forward_.plan != nullptr && c10::GradMode::is_enabled()) {
      for (size_t i = 0; i < inputs.size(); ++i) {
        if (inputs[i].defined() && inputs[i].requires_grad()) {
          return absl::FailedPreconditionError(absl::StrCat(
              "compiled function '", name_, "': input ", i,
              " requires grad, but the kiln artifact was compiled for inference (its outputs "
              "cannot have a grad_fn); run it under no_grad or compile it for training"));
        }
      }
    }
    // eager: autograd as the caller has it; kiln: the plan runs without.
    ASSIGN_OR_RETURN(result.outputs, forward_.Run(inputs));
    return result;
  }

  std::vector<at::Tensor> all;
  {
    c10::AutoGradMode no_grad(false);
    ASSIGN_OR_RETURN(all, forward_.Run(inputs));
  }
  result.outputs.assign(std::make_move_iterator(all.begin()),
                        std::make_move_iterator(all.begin() + num_outputs_));
  Saved& saved = result.saved;
  saved.owner_ = this;
  saved.tensors_.assign(std::make_move_iterator(all.begin() + num_outputs_),
                        std::make_move_iterator(all.end()));
  saved.output_sizes_.reserve(num_outputs_);
  saved.output_options_.reserve(num_outputs_);
  for (const at::Tensor& out : result.outputs) {
    if (out.defined()) {
      saved.output_sizes_.push_back(out.sizes().vec());
      saved.output_options_.push_back(out.options());
    } else {
      saved.output_sizes_.emplace_back();
      saved.output_options_.emplace_back();
    }
  }
  return result;
}

absl::StatusOr<std::vector<at::Tensor>> CompiledFunction::backward(
    const Saved& saved, const std::vector<at::Tensor>& grad_outputs) const {
  if (!has_backward_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "compiled function '", name_, "': ",
        backend_ == "eager"
            ? "the eager backend compiles no backward graph (its forward records ATen's autograd)"
            : "the artifact was compiled for inference; it has no backward graph"));
  }
  if (static_cast<int>(grad_outputs.size()) != num_outputs_) {
    return absl::InvalidArgumentError(absl::StrCat("compiled function '", name_,
                                                   "': backward takes one gradient per forward "
                                                   "output (",
                                                   num_outputs_, "), got ", grad_outputs.size()));
  }
  if (saved.owner_ != this || static_cast<int>(saved.tensors_.size()) != num_saved_) {
    return absl::InvalidArgumentError(
        absl::StrCat("compiled function '", name_,
                     "': backward needs the Saved returned by a forward of this same function"));
  }

  std::vector<at::Tensor> args = saved.tensors_;
  for (int i = 0; i < num_outputs_; ++i) {
    if (!outputs_receive_grad_[i]) continue;
    const at::Tensor& g = grad_outputs[i];
    const std::vector<int64_t>& sizes = saved.output_sizes_[i];
    const at::TensorOptions& options = saved.output_options_[i];
    if (!g.defined()) {
      args.push_back(at::zeros(sizes, options));
      continue;
    }
    const at::ScalarType dtype = c10::typeMetaToScalarType(options.dtype());
    if (g.sizes() != at::IntArrayRef(sizes) || g.scalar_type() != dtype) {
      return absl::InvalidArgumentError(
          absl::StrCat("compiled function '", name_, "': grad_outputs[", i, "] is ",
                       c10::toString(g.scalar_type()), SizesString(g.sizes()), "; output ", i,
                       " is ", c10::toString(dtype), SizesString(sizes)));
    }
    // The backward graph was traced with contiguous tangents (as AOTAutograd
    // forces them); a view there would fail on a strided one.
    args.push_back(g.contiguous());
  }

  std::vector<at::Tensor> out;
  {
    c10::AutoGradMode no_grad(false);
    ASSIGN_OR_RETURN(out, backward_.Run(args));
  }
  std::vector<at::Tensor> grads(num_inputs_);
  for (size_t k = 0; k < out.size(); ++k) grads[grad_input_index_[k]] = std::move(out[k]);
  return grads;
}

}  // namespace kiln::runtime
