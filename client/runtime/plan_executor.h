// PlanExecutor: runs a graph compiled by the `kiln` backend (a CompiledGraph:
// an ExecutionPlan plus the modules of generated code it launches) on the
// caller's tensors (docs/architecture.md §6).
//
// The contract of a plan, as the executor reads it:
//   - Values are named tensors. The plan's inputs define the first ones; each
//     Alloc, View and Extern output defines a new one; no name is defined
//     twice. A step may only read values that are defined and not yet freed.
//   - Symbols: the kernels receive one int64 per distinct symbol of
//     plan.symbols, in order of first appearance; a symbol's value is size
//     `dim` of input `input`. A symbol bound more than once must get the same
//     value from every binding.
//   - SymInt expressions (sizes, strides, offsets, symbolic Extern
//     arguments) use the symbols of plan.symbols only, in the syntax of
//     compiler/ir/sym_expr.h (+ - * // % Min Max, Python's floor semantics).
//   - Inputs must have the dtype, rank and device type of plan.inputs, every
//     size the placeholder's size expression gives, and, for sizes above 1,
//     the strides the placeholder gives (when it gives any): generated
//     kernels address them with those strides.
//   - Alloc: at::empty_strided with exactly the sizes and strides given
//     (the caching allocator is used). With `reuse`, the new tensor is laid
//     over the storage of that freed value instead, when the storage is large
//     enough and nothing else still references it (no view of it is alive);
//     otherwise it is a fresh allocation, so reuse never changes results.
//   - Launch: the module's function `symbol`, with the ABI of
//     compiler/codegen/codegen.h:
//       extern "C" void symbol(void* const* buffers, const int64_t* symbols);
//     buffers[i] = data_ptr() of buffers[i] (storage offset included).
//     A cuda module's kernel (cuda_module.h) is launched with the Launch's
//     grid (an expression) and block (a constant) on torch's current stream
//     of the GPU all its buffers are on; an artifact whose arch that GPU
//     cannot run is refused naming both.
//   - View: at::as_strided(base, sizes, strides, storage_offset), never a
//     copy. Extern: the ATen op called boxed through the dispatcher (BoundOp,
//     interpreter.h); its outputs define the node's output names, each
//     converted to the dtype the node gives it when the kernel returned
//     another, and copied into the strides it gives when ATen laid it out
//     otherwise (outputs nothing reads are left as they are).
//   - Free: the value is dead; its tensor is dropped (or kept for an Alloc
//     that reuses it).
//   - Outputs are the named values as the steps left them: an Alloc'd output
//     has exactly the strides its Alloc promised.
//   - Autograd is disabled while a plan runs: outputs carry no grad_fn.
//     Training goes through a compiled forward and backward
//     (compiled_function.h).
//
// Create does all the work that does not depend on the inputs: it checks the
// plan, loads the modules (ModuleLoader), resolves every Launch's function,
// binds every Extern node to its operator and parses every expression. Run
// only evaluates sizes and executes the steps.
//
// Thread-safe: a PlanExecutor is immutable after Create; Run keeps its state
// on the stack and may be called concurrently from any number of threads.
#ifndef KILN_CLIENT_RUNTIME_PLAN_EXECUTOR_H_
#define KILN_CLIENT_RUNTIME_PLAN_EXECUTOR_H_

#include <ATen/core/Tensor.h>

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "client/runtime/module_loader.h"
#include "kiln/v1/artifact.pb.h"

namespace kiln::runtime {

class PlanExecutor {
 public:
  // Prepares `graph` for running, loading its modules through
  // ModuleLoader::Shared(). INVALID_ARGUMENT naming the step and the value
  // when the plan breaks the contract above (unknown, redefined or freed
  // values, malformed or unbound expressions, a bad module index, a bad
  // reuse); NOT_FOUND naming the symbol when a module lacks a Launch's
  // function, or naming the node when ATen lacks an Extern's operator;
  // FAILED_PRECONDITION for a module language this runtime cannot load (cuda
  // in a runtime built without CUDA);
  // INTERNAL when a module cannot be loaded.
  // `sm_arch` is the artifact's target.sm_arch, which cuda modules need.
  static absl::StatusOr<std::unique_ptr<PlanExecutor>> Create(const v1::CompiledGraph& graph,
                                                              absl::string_view sm_arch = "");
  // The same through `loader`, which need only live while Create runs: the
  // executor holds its modules itself.
  static absl::StatusOr<std::unique_ptr<PlanExecutor>> Create(const v1::CompiledGraph& graph,
                                                              ModuleLoader& loader,
                                                              absl::string_view sm_arch = "");

  PlanExecutor(const PlanExecutor&) = delete;
  PlanExecutor& operator=(const PlanExecutor&) = delete;
  ~PlanExecutor();

  // Runs the plan on `inputs` (one per plan input, in order) and returns its
  // outputs. INVALID_ARGUMENT naming the input (and dim) on a wrong count,
  // dtype, rank, device, size or stride, or when the bindings of a symbol
  // disagree; INVALID_ARGUMENT naming the step when an expression cannot be
  // evaluated (division by zero, a negative size); an ATen error becomes
  // INTERNAL naming the step (RESOURCE_EXHAUSTED when the device is out of
  // memory).
  absl::StatusOr<std::vector<at::Tensor>> Run(const std::vector<at::Tensor>& inputs) const;

  int num_inputs() const;
  int num_outputs() const;

 private:
  struct Impl;
  explicit PlanExecutor(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kiln::runtime

#endif  // KILN_CLIENT_RUNTIME_PLAN_EXECUTOR_H_
