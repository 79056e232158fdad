// How torch 2's FX graphs differ from the core-ATen schemas, and the rewrite
// that takes a graph from the one to the other. Graph::FromProto applies it,
// so every stage (and every cache key, on the server and in the C++ client)
// sees the rewritten form.
//
// torch 2's Dynamo, AOTAutograd and torch.export record calls as they were
// made, not as the schemas spell them:
//   - A Python number (or SymInt) where the schema wants a Tensor:
//     `aten.add.Tensor(x, 1e-06)`. ATen wraps such a number into a tensor
//     that promotes like a Scalar. The node moves to the overload of the same
//     op that takes the number as it is (aten.add.Scalar), when one fits all
//     its arguments. Otherwise (`aten.sub.Tensor(1, x)`,
//     `aten.maximum.default(x, 0.0)`) each number becomes a 0-dim tensor made
//     by a new aten.scalar_tensor node, of dtype float32 for a float, int64
//     for an int, bool for a bool, on the device of the node's first tensor
//     argument: a 0-dim tensor promotes with the other operands as the
//     wrapped number would (for float32 as the default dtype).
//   - `aten._assert_tensor_metadata.default(x, size, stride, dtype, device=,
//     layout=)`: checked against x's metadata (INVALID_ARGUMENT naming the
//     node and the field when it disagrees) and then dropped: it computes
//     nothing.
//   - SymInts computed by nodes, as torch.export leaves them:
//     `sym_size_int = aten.sym_size.int(x, 0)`, `mul = _operator.mul(
//     sym_size_int, 16)`, then `view(x, [mul])`. Such nodes (sym_size,
//     sym_numel, sym_stride, sym_storage_offset, and the operator module's
//     add, sub, mul and floordiv) are evaluated over the metadata's sizes and
//     dropped; every argument that names their output (a SymInt whose
//     expression is the name, a tensor reference, a list of such references)
//     takes the value instead: "s0*16", or 64 for static sizes. Their outputs
//     need no metadata. A graph that returns one is INVALID_ARGUMENT.
//
// Pure functions; thread-safe.
#ifndef KILN_COMPILER_IR_TORCH_CONVENTIONS_H_
#define KILN_COMPILER_IR_TORCH_CONVENTIONS_H_

#include <optional>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "compiler/ir/graph.h"

namespace kiln::ir {

// Whether `target` computes a SymInt (aten.sym_size.int, _operator.mul, ...).
bool IsSymIntNode(absl::string_view target);

// The rewritten wire form of `graph`, or nullopt when it already follows the
// schemas.
absl::StatusOr<std::optional<v1::Graph>> RewriteTorchConventions(const Graph& graph);

}  // namespace kiln::ir

#endif  // KILN_COMPILER_IR_TORCH_CONVENTIONS_H_
