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
//   - gather: a load at positions that index tensors name (embedding,
//     index_select, gather, advanced indexing): one value per point of its
//     output, read from its source in memory;
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

enum class NodeKind { kView, kPointwise, kReduction, kGather, kScatter, kExtern };

// What a gather node reads, in its output's coordinates: out[p] =
// source[offset + sum_d p_d * source_over[d] + sum_k wrap(index_k[p]) *
// strides[k]], where index tensor k is read at p with the strides
// index_over[k] over the output's dims, and indexes a dimension of
// sizes[k] elements of the source. Strides are of the source's view, whose
// offset is its own (meta.storage_offset).
struct GatherSpec {
  ir::ValueId source = ir::kNoValue;
  std::vector<ir::SymInt> source_over;
  std::vector<ir::ValueId> indices;
  std::vector<std::vector<ir::SymInt>> index_over;
  std::vector<ir::SymInt> strides;
  std::vector<ir::SymInt> sizes;
  // Negative indices count from the end (advanced indexing); elsewhere
  // they are out of range, as in torch.
  bool wraps = false;
};

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
  // kGather; kScatter (below).
  GatherSpec gather;
  // kScatter: a scatter-add (index_put with accumulation, index_add,
  // embedding_dense_backward): the output starts as a copy of `base`
  // (zeros where it is kNoValue), then for each point p of `space`,
  // `values` (read as an operand broadcast over the space) is added to it
  // at the position `gather` addresses (its `source` is the output; its
  // strides are the output's). Indices equal to `skip` (>= 0: embedding's
  // padding_idx) add nothing.
  std::vector<ir::SymInt> space;
  ir::ValueId values = ir::kNoValue;
  ir::ValueId base = ir::kNoValue;
  int64_t skip = -1;
};

// One NodeLowering per node of `graph`, by node index. `graph` must outlive
// the result (the bound calls read its tensors' metadata).
absl::StatusOr<std::vector<NodeLowering>> LowerNodes(const ir::Graph& graph,
                                                     const ops::Registry& registry);

// One line per node ("%n3 = aten.add.Tensor: pointwise over [4, 8]").
std::string PrintNodeLowerings(const ir::Graph& graph, const std::vector<NodeLowering>& nodes);

}  // namespace kiln::loop

#endif  // KILN_COMPILER_LOOP_LOWER_H_
