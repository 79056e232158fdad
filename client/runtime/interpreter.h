// The reference interpreter: runs a graph op by op through ATen's dispatcher.
//
// Every node's target ("aten.add.Tensor") is looked up once with
// c10::Dispatcher::findSchema; its arguments are converted to IValues by the
// schema's argument types (positional and keyword, with the schema's
// defaults) and the op is called through the boxed interface — one generic
// path for every op, no per-op table. It is the runtime of the `eager` and
// `aot_eager` backends and the reference for every correctness test.
//
// BoundOp is that per-node step on its own: one node bound to its operator,
// called on an environment of tensors indexed by ValueId. The interpreter
// runs a graph of them; the plan executor (plan_executor.h) uses one per
// Extern step.
//
// Thread-safe: an Interpreter and a BoundOp are immutable after Create; Run
// and Call may be called concurrently.
#ifndef KILN_CLIENT_RUNTIME_INTERPRETER_H_
#define KILN_CLIENT_RUNTIME_INTERPRETER_H_

#include <ATen/core/Tensor.h>

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "compiler/ir/graph.h"
#include "kiln/v1/graph.pb.h"

namespace kiln::runtime {

// One node bound to its ATen operator. Create looks the operator up with
// c10::Dispatcher::findSchema and converts the node's arguments to the
// schema's parameters (positional and keyword, with the schema's defaults);
// Call only fills in the tensors, calls the op boxed and stores its results.
class BoundOp {
 public:
  // The value of a symbolic SymInt argument, given its expression text
  // ("s0", "2*s0"). An error is reported as the argument's.
  using SymIntEvaluator = absl::FunctionRef<absl::StatusOr<int64_t>(const std::string& expr)>;

  // Binds a copy of `node`. NOT_FOUND naming the node when ATen has no such
  // operator; INVALID_ARGUMENT naming the node and the argument when an
  // argument does not fit its parameter or the node names a different number
  // of outputs than the operator returns.
  static absl::StatusOr<BoundOp> Create(const ir::Node& node);
  BoundOp(BoundOp&&) noexcept;
  BoundOp& operator=(BoundOp&&) noexcept;
  ~BoundOp();

  // Calls the operator with the tensors env[v] for the node's operands and
  // stores its results in env[node.outputs[i]]. `env` must be large enough
  // for every ValueId the node names. Symbolic SymInt arguments are
  // evaluated through `evaluate`. An ATen error becomes INTERNAL naming the
  // node (its first line, without c10's backtrace).
  absl::Status Call(std::vector<at::Tensor>& env, SymIntEvaluator evaluate) const;

  const ir::Node& node() const;
  // The symbolic expressions among the arguments, each once, in argument
  // order: what `evaluate` may be asked for.
  std::vector<std::string> SymbolicExprs() const;

 private:
  struct Impl;
  explicit BoundOp(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// The ATen dtype of a wire dtype; INVALID_ARGUMENT for one ATen lacks.
absl::StatusOr<at::ScalarType> ScalarTypeFromProto(v1::DType dtype);

class Interpreter {
 public:
  // Resolves every node's operator. NOT_FOUND naming the node when ATen has
  // no such operator.
  static absl::StatusOr<std::unique_ptr<Interpreter>> Create(ir::Graph graph);
  ~Interpreter();

  // Runs the graph on `inputs` (one per graph input, in order) and returns
  // the graph's outputs. INVALID_ARGUMENT on a wrong input count; an ATen
  // error becomes INTERNAL naming the node. Autograd is not disabled: inputs
  // that require grad yield outputs with a grad_fn, as eager ATen would.
  absl::StatusOr<std::vector<at::Tensor>> Run(const std::vector<at::Tensor>& inputs) const;

  const ir::Graph& graph() const;

 private:
  struct Impl;
  explicit Interpreter(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Create + Run in one call.
absl::StatusOr<std::vector<at::Tensor>> RunGraph(const ir::Graph& graph,
                                                 const std::vector<at::Tensor>& inputs);

}  // namespace kiln::runtime

#endif  // KILN_CLIENT_RUNTIME_INTERPRETER_H_
