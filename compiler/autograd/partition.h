// The min-cut partitioner (pass name "partition"): splits a joint graph into
// a forward graph, which returns its outputs plus the values saved for the
// backward, and a backward graph, which takes the saved values and the
// tangents and returns the gradients.
//
// Construction. Every joint-graph value v that can be computed without
// tangents becomes two vertices v_in -> v_out: cutting that edge means
// saving v. Its capacity is what saving v costs in memory traffic: v's size
// in bytes for a value that exists anyway (a primal, a forward output, a
// matmul's or a convolution's result or operand, a value read on both
// sides of a matmul), which the backward reads; twice that for any other,
// which the forward must also write. Each use u -> w adds u_out -> w_in
// with infinite capacity. The source feeds, with infinite capacity, the
// primals, every value the forward outputs need (it is computed in the
// forward anyway), and every value that must not be recomputed (anything but
// pointwise ops and views: matmuls, convolutions, reductions, random ops,
// externs); with three times v's bytes, a recomputable value that a
// backward matmul reads (recomputing it costs the backward a read of what it
// is computed from, a write of it and the matmul's read of it, where saving
// it costs the read, and the write where the forward does not write it
// anyway); and a boolean
// computed from floating-point values that the backward reads (relu's
// mask), which the backward would otherwise recompute from wider values
// in every kernel that needs it. Every value a tangent-dependent node
// reads drains into the sink.
// A minimum cut is then the cheapest set of values to save such that
// everything else the backward needs can be recomputed from them by cheap
// ops. The classification lives apart from the solver (Dinic's max-flow).
//
// Worked example, y = sum(relu(x) * w), x and w needing gradients:
//   forward-able: a = relu(x), b = a * w, y = sum(b)
//                 m = a <= 0 (relu's mask)
//   backward:     gb = expand(ty); ga = gb * w; gw = gb * a; gx = masked_fill(ga, m, 0)
//   backward reads: w, a, m   (x is not read)
//   m, a boolean, is saved (2|m|, a quarter of |x| for float32). Saving a
//   and w costs 2|a| + |w| (the forward would write a only to save it);
//   recomputing a = relu(x) instead needs x, a primal: |x| + |w|. The cut
//   saves x, w and m, and the backward recomputes relu(x). With several
//   pointwise ops after relu whose results the backward reads, saving x
//   alone wins over saving each of them all the more.
//
// Pure functions; thread-safe.
#ifndef KILN_COMPILER_AUTOGRAD_PARTITION_H_
#define KILN_COMPILER_AUTOGRAD_PARTITION_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "compiler/autograd/joint_graph.h"

namespace kiln::autograd {

struct PartitionOptions {
  // Size assumed for a symbolic dimension when weighing bytes.
  int64_t symbolic_size_hint = 64;
  // false: save every forward value the backward reads (no recomputation);
  // the baseline the benchmark compares the min-cut with.
  bool min_cut = true;
};

struct Partition {
  // Inputs: the primals. Outputs: the forward outputs, then the saved values.
  ir::Graph forward;
  // Inputs: the saved values (in the forward's order), then the tangents.
  // Outputs: one gradient per primal that has one (JointGraph order).
  ir::Graph backward;
  int num_forward_outputs = 0;
  std::vector<std::string> saved;  // names of the saved values, in order
  int64_t saved_bytes = 0;
  std::vector<std::string> recomputed;  // forward values the backward recomputes
};

absl::StatusOr<Partition> PartitionJointGraph(const JointGraph& joint,
                                              const PartitionOptions& options = {});

// Bytes of a value of this metadata (symbolic dimensions take `hint`).
int64_t ValueBytes(const ir::TensorMeta& meta, int64_t hint = 64);

}  // namespace kiln::autograd

#endif  // KILN_COMPILER_AUTOGRAD_PARTITION_H_
