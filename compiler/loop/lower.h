// Pass "lower", the first of the kiln backend's loop passes
// (docs/architecture.md §5): what each node of a graph becomes in the loop
// IR, decided node by node and apart from where it will run:
//   - view: an index remap over its base's storage, never a copy
//     (reshape, permute, expand, slice, ... of the registry's view ops);
//   - pointwise: a scalar expression over its operands, one value per
//     point of its output (fuse_pointwise.cc holds the expressions);
//   - reduction: accumulations over named dimensions of one input, with
//     init and combine (sum, mean, amax, amin, var, softmax, log softmax,
//     layer norm);
//   - extern: no loop lowering; it runs through ATen, with the reason.
// The arguments of pointwise and reduction nodes are bound to their schema
// here, so that a malformed one is refused by node name before fusion.
//
// The next pass, "fuse" (fuse.h), places each lowered node into a kernel
// and builds its statements there.
//
// Pure function; thread-safe.
#ifndef KILN_COMPILER_LOOP_LOWER_H_
#define KILN_COMPILER_LOOP_LOWER_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "compiler/ir/graph.h"
#include "compiler/ops/registry.h"

namespace kiln::loop {

enum class NodeKind { kView, kPointwise, kReduction, kExtern };

struct NodeLowering {
  NodeKind kind = NodeKind::kExtern;
  std::string why;  // kExtern: why the node has no loop lowering
  // kPointwise and kReduction: the node's arguments bound to its schema.
  std::optional<ops::OpCall> call;
  // kReduction: the reduced input, its reduced dimensions (sorted, unique)
  // and whether the results keep them as size 1.
  ir::ValueId input = ir::kNoValue;
  std::vector<int> dims;
  bool keepdim = false;
};

// One NodeLowering per node of `graph`, by node index. `graph` must outlive
// the result (the bound calls read its tensors' metadata).
absl::StatusOr<std::vector<NodeLowering>> LowerNodes(const ir::Graph& graph,
                                                     const ops::Registry& registry);

// One line per node ("%n3 = aten.add.Tensor: pointwise over [4, 8]").
std::string PrintNodeLowerings(const ir::Graph& graph, const std::vector<NodeLowering>& nodes);

}  // namespace kiln::loop

#endif  // KILN_COMPILER_LOOP_LOWER_H_
