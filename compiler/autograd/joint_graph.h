// The joint forward/backward graph (pass name "joint-graph").
//
// Given a forward graph, which inputs need gradients and which outputs
// receive them, builds one graph whose inputs are the forward inputs
// ("primals") followed by one tangent per differentiable output, and whose
// outputs are the forward outputs followed by the gradient of each input
// that needs one. Backward ops come from the registry's derivative rules,
// emitted in reverse topological order; a value used more than once
// accumulates its gradients with aten.add.Tensor; forward nodes whose
// outputs carry no gradient emit nothing; gradient nodes nobody reads are
// dropped (dead gradient elimination). Multi-output ops (native_layer_norm,
// split_with_sizes, native_dropout...) see a gradient per output, or none.
//
// Example, y = relu(x * w), x and w needing gradients:
//   primals: x, w        tangents: ty
//   forward: m = mul(x, w); y = relu(m)
//   backward: gm = threshold_backward(ty, y, 0)
//             gx = mul(gm, w); gw = mul(gm, x)      (summed to size if broadcast)
//   outputs: y, gx, gw
//
// Pure function; thread-safe.
#ifndef KILN_COMPILER_AUTOGRAD_JOINT_GRAPH_H_
#define KILN_COMPILER_AUTOGRAD_JOINT_GRAPH_H_

#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "compiler/ir/graph.h"
#include "compiler/ops/registry.h"

namespace kiln::autograd {

struct JointOptions {
  // One per forward input; empty means: the inputs whose metadata says
  // requires_grad.
  std::vector<bool> inputs_need_grad;
  // One per forward output; empty means: every floating-point output that
  // depends on an input needing a gradient.
  std::vector<bool> outputs_receive_grad;
};

struct JointGraph {
  ir::Graph graph;
  int num_primals = 0;
  int num_tangents = 0;
  int num_forward_outputs = 0;
  std::vector<bool> inputs_need_grad;      // per primal
  std::vector<bool> outputs_receive_grad;  // per forward output
  // Index of each primal's gradient among the joint graph's outputs, or -1.
  std::vector<int> grad_output_index;
  // Names of the joint graph's nodes that are the forward graph's own (the
  // rest were emitted by derivative rules).
  absl::flat_hash_set<std::string> forward_nodes;
};

// INVALID_ARGUMENT naming the op and the node when a node on a gradient path
// has no derivative rule or no registry entry.
absl::StatusOr<JointGraph> BuildJointGraph(const ir::Graph& forward, const JointOptions& options,
                                           const ops::Registry& registry = ops::DefaultRegistry());

}  // namespace kiln::autograd

#endif  // KILN_COMPILER_AUTOGRAD_JOINT_GRAPH_H_
