// Structural verification of a graph, beyond what Graph::FromProto already
// guarantees (resolved names, no cycles): the graph computes something, every
// value carries complete metadata, targets are spelled as ATen spells them,
// and every argument has a kind its target's schema can take.
//
// Errors are INVALID_ARGUMENT and name the node, the value or the argument.
#ifndef KILN_COMPILER_IR_VERIFY_H_
#define KILN_COMPILER_IR_VERIFY_H_

#include "absl/status/status.h"
#include "compiler/ir/graph.h"
#include "compiler/ir/limits.h"

namespace kiln::ir {

// Within `limits` (compiler/ir/limits.h): nodes, rank, elements, outputs per
// node, expression length; a refusal names the limit's configuration field.
absl::Status Verify(const Graph& graph, const GraphLimits& limits = GraphLimits());

// A graph of `nodes` nodes within limits.max_nodes; Verify's first check,
// also run on a wire graph before anything is built from it.
absl::Status CheckNodeCount(int64_t nodes, const GraphLimits& limits);

}  // namespace kiln::ir

#endif  // KILN_COMPILER_IR_VERIFY_H_
