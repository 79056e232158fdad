// CompiledFunction: runs what kilnd compiled for one graph — the artifact of
// the `eager`, `aot_eager` or `kiln` backend — on the caller's tensors, as a
// function with a forward and, for training artifacts, a backward
// (docs/architecture.md §6).
//
// `eager`: forward runs artifact.graph through the reference interpreter.
// Autograd is left as the caller has it, so inputs that require grad give
// outputs with a grad_fn, as eager ATen would; there is no backward graph.
//
// `aot_eager`: forward runs artifact.autograd.forward with autograd disabled
// and returns the graph's outputs; the values the backward needs come back
// separately, in a Saved, which the caller hands to backward together with
// one gradient per forward output. backward runs artifact.autograd.backward
// (also with autograd disabled) and returns one gradient per forward input.
// `kiln`: the graphs are compiled (CompiledGraph: generated code and an
// execution plan) and run by a PlanExecutor (plan_executor.h) instead of
// the interpreter. With artifact.compiled alone it is an inference
// function: forward runs the plan with autograd off, and refuses
// (FAILED_PRECONDITION) inputs that require grad while grad mode is on, as
// it could not give their outputs a grad_fn. With
// artifact.compiled_forward, artifact.compiled_backward and
// artifact.autograd it is a training function with exactly the `aot_eager`
// conventions: the compiled forward takes the primals and returns the
// outputs then the saved values; the compiled backward takes the saved
// values then the tangents and returns the gradients.
//
// This is the shape of a torch.autograd.Function, and what a caller wraps in
// one to train with it:
//
//   ASSIGN_OR_RETURN(auto fn, CompiledFunction::Create(response.artifact()));
//   ASSIGN_OR_RETURN(CompiledFunction::ForwardResult r, fn->forward({w, x}));
//   // ... loss from r.outputs, its gradient dy ...
//   ASSIGN_OR_RETURN(std::vector<at::Tensor> grads, fn->backward(r.saved, {dy}));
//   // grads[0] is dloss/dw; grads[1] is undefined (x does not require grad).
//
// Thread-safe: a CompiledFunction is immutable after Create; forward and
// backward may be called concurrently from any number of threads. Each
// forward's saved values live in the Saved it returns, not in the function,
// so concurrent forward/backward pairs cannot mix up their tensors. A Saved
// may be passed to backward any number of times; drop it to free the saved
// tensors.
#ifndef KILN_CLIENT_RUNTIME_COMPILED_FUNCTION_H_
#define KILN_CLIENT_RUNTIME_COMPILED_FUNCTION_H_

#include <ATen/core/Tensor.h>
#include <c10/core/TensorOptions.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "client/runtime/interpreter.h"
#include "client/runtime/plan_executor.h"
#include "kiln/v1/artifact.pb.h"

namespace kiln::runtime {

// Whether this runtime can run an artifact with this header: its
// format_version is one this runtime reads, and a cpu artifact's code was
// compiled for an ISA level this CPU has (cpu_features.h). A cuda artifact's
// arch is checked per device when its kernels load (cuda_module.h).
// FAILED_PRECONDITION naming the field otherwise.
absl::Status CheckArtifactHeader(uint32_t format_version, absl::string_view device_type,
                                 const std::string& cpu_isa);

class CompiledFunction {
 public:
  // What one forward call keeps for its backward: the saved values, and the
  // sizes and options of the outputs that receive gradients (a gradient the
  // caller leaves undefined becomes zeros of that shape). Only backward of
  // the CompiledFunction that produced it reads it.
  class Saved {
   public:
    Saved() = default;
    // The saved tensors, in artifact.autograd.saved order.
    const std::vector<at::Tensor>& tensors() const { return tensors_; }

   private:
    friend class CompiledFunction;
    const CompiledFunction* owner_ = nullptr;
    std::vector<at::Tensor> tensors_;
    std::vector<std::vector<int64_t>> output_sizes_;  // per forward output
    std::vector<at::TensorOptions> output_options_;   // per forward output
  };

  struct ForwardResult {
    std::vector<at::Tensor> outputs;  // one per forward output
    Saved saved;                      // empty for `eager`
  };

  // Builds the interpreters (or plan executors) for the artifact's graphs;
  // for `kiln` this loads the generated code. FAILED_PRECONDITION
  // for a backend this runtime cannot run, a format_version newer than it
  // reads, or a graph the backend needs that the artifact lacks;
  // INVALID_ARGUMENT naming the field when the graphs, the plans or the
  // autograd bookkeeping (counts, grad_input_index) are malformed or
  // disagree; a plan's other errors as PlanExecutor::Create gives them.
  static absl::StatusOr<std::unique_ptr<CompiledFunction>> Create(const v1::Artifact& artifact);
  // Create, after checking that `artifact` is the one kilnd signed: its
  // deterministic bytes hash to `digest` and `signature` is the Ed25519
  // signature of `digest` by `public_key_pem`'s key (common/signing.h).
  // PERMISSION_DENIED, before any code is loaded, when it is not.
  static absl::StatusOr<std::unique_ptr<CompiledFunction>> CreateVerified(
      const v1::Artifact& artifact, const std::string& digest, const std::string& signature,
      const std::string& public_key_pem);

  CompiledFunction(const CompiledFunction&) = delete;
  CompiledFunction& operator=(const CompiledFunction&) = delete;
  ~CompiledFunction();

  // Runs the forward on `inputs` (one per graph input, in order). For
  // `aot_eager` and `kiln` autograd is off while it runs (on this thread only: grad
  // mode is thread-local), so the outputs carry no grad_fn even when inputs
  // require grad; gradients come from backward. A graph that updates a
  // buffer in place (batch norm's running statistics) updates the caller's
  // tensor. INVALID_ARGUMENT on a wrong count or an undefined input; an ATen
  // error becomes INTERNAL naming the node.
  absl::StatusOr<ForwardResult> forward(const std::vector<at::Tensor>& inputs) const;

  // Runs the backward of the forward that returned `saved`. `grad_outputs`
  // holds one tensor per forward output: the gradient flowing into it, or an
  // undefined tensor for none (zeros are used for an output that receives
  // gradients; for one that does not, the entry is ignored). A defined
  // gradient must have its output's sizes and dtype; it is made contiguous
  // before use, as the backward graph was traced. Returns one tensor per
  // forward input: its gradient, undefined for an input that needs none.
  // FAILED_PRECONDITION for an `eager` or inference `kiln` artifact;
  // INVALID_ARGUMENT on a wrong
  // count, a mismatched gradient, or a Saved from another function.
  absl::StatusOr<std::vector<at::Tensor>> backward(
      const Saved& saved, const std::vector<at::Tensor>& grad_outputs) const;

  const std::string& backend() const { return backend_; }
  int num_inputs() const { return num_inputs_; }
  int num_outputs() const { return num_outputs_; }
  // Per forward input: whether backward returns a gradient for it (all
  // false without a backward).
  const std::vector<bool>& inputs_need_grad() const { return inputs_need_grad_; }

 private:
  // One graph, run by the interpreter or (for `kiln`) by a plan executor:
  // exactly one of the two is set.
  struct Runner {
    std::unique_ptr<Interpreter> interpreter;
    std::unique_ptr<PlanExecutor> plan;
    absl::StatusOr<std::vector<at::Tensor>> Run(const std::vector<at::Tensor>& inputs) const;
  };

  CompiledFunction() = default;
  absl::Status InitAutograd(const v1::AutogradGraphs& ag, int forward_outputs,
                            const std::string& backward_field, int backward_inputs,
                            int backward_outputs);

  std::string backend_;
  std::string name_;  // the graph's name, for messages
  int num_inputs_ = 0;
  int num_outputs_ = 0;
  // Without a backward (`eager`, inference `kiln`): the graph. Otherwise
  // the forward graph, whose outputs are the num_outputs_ outputs followed
  // by the saved values.
  Runner forward_;
  bool has_backward_ = false;
  // Only with a backward.
  Runner backward_;
  int num_saved_ = 0;
  std::vector<bool> inputs_need_grad_;
  std::vector<bool> outputs_receive_grad_;
  std::vector<int> grad_input_index_;  // per backward output: its primal
};

}  // namespace kiln::runtime

#endif  // KILN_CLIENT_RUNTIME_COMPILED_FUNCTION_H_
