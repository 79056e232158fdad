// Argument-kind checking against ATen operator schemas.
//
// A table of schema strings in ATen's own syntax
//   "add.Tensor(Tensor self, Tensor other, *, Scalar alpha=1) -> Tensor"
// is parsed once into typed parameter lists. CheckArguments holds a node
// against the schema of its target: positional count, keyword names,
// required parameters, the kind of each argument, and the number of outputs.
// Targets outside the table are not checked here (the op registry, later,
// decides whether a backend can run them).
//
// Thread-safe: the parsed table is immutable after first use.
#ifndef KILN_COMPILER_IR_SCHEMA_H_
#define KILN_COMPILER_IR_SCHEMA_H_

#include "absl/status/status.h"
#include "compiler/ir/graph.h"

namespace kiln::ir {

// INVALID_ARGUMENT naming the node and the argument when `node` does not fit
// the schema of its target.
absl::Status CheckArguments(const Node& node, const Graph& graph);

}  // namespace kiln::ir

#endif  // KILN_COMPILER_IR_SCHEMA_H_
