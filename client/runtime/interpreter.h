// The reference interpreter: runs a graph op by op through ATen's dispatcher.
//
// Every node's target ("aten.add.Tensor") is looked up once with
// c10::Dispatcher::findSchema; its arguments are converted to IValues by the
// schema's argument types (positional and keyword, with the schema's
// defaults) and the op is called through the boxed interface — one generic
// path for every op, no per-op table. It is the runtime of the `eager` and
// `aot_eager` backends and the reference for every correctness test.
//
// Thread-safe: an Interpreter is immutable after Create; Run may be called
// concurrently.
#ifndef KILN_CLIENT_RUNTIME_INTERPRETER_H_
#define KILN_CLIENT_RUNTIME_INTERPRETER_H_

#include <ATen/core/Tensor.h>

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "compiler/ir/graph.h"

namespace kiln::runtime {

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
