// Lowering, fusion and memory planning for the `kiln` backend (pass names
// "lower", "fuse", "plan"): from a graph of registry ops to fused loop-level
// kernels (compiler/loop/kernel.h) and the execution plan that runs them
// (v1::ExecutionPlan), with every op that has no lowering left as an extern
// call through ATen (matmul, convolution, pooling, embedding, ...).
//
// Lowering: pointwise ops become scalar expressions; reductions (sum, mean,
// amax, amin, var, softmax, log_softmax, layer norm) become accumulations
// with init/combine (variance and layer norm: a sum and then the squared
// deviations over short rows, Welford over long ones); views become
// index remaps over their base's storage and never copy.
//
// Fusion is decided greedily in topological order, legality apart from
// profitability:
//   - legal: a node may join an open kernel when its output lies in the
//     kernel's iteration space (the whole space, or one value per row for
//     reduction results), every operand it reads from outside the kernel was
//     produced by a step scheduled before the kernel (so no cycle can form),
//     and nothing it reads is memory the kernel itself writes;
//   - vertical: a pointwise chain, and a reduction with its pointwise
//     prologue and epilogue (softmax and layer norm are one kernel, in
//     several passes over each row);
//   - horizontal: siblings over the same iteration space land in the same
//     kernel (they read the same inputs once per point);
//   - profitability: always fuse when legal (every fusion removes a store
//     and a load of a whole tensor);
//   - recomputation: a kernel reading a pointwise value another kernel
//     computes computes it again from what that value reads (a few nodes,
//     at most two whole-space tensors it does not read yet) instead of
//     reading it from memory, so the other kernel need not store it and the
//     reader can fuse what follows (a norm's backward: the products feeding
//     both the weight's gradient over the rows and the input's within each
//     row); and a broadcast of a per-row value is that value inside its
//     kernel.
// Every decision and refusal is recorded with its reason for the debug trace.
//
// Memory planning: a buffer is allocated for each value a kernel stores
// that something outside the kernel reads; it is freed after its last use,
// and a later allocation of the same dtype and size reuses its storage.
//
// Pure function; thread-safe.
#ifndef KILN_COMPILER_LOOP_LOWERING_H_
#define KILN_COMPILER_LOOP_LOWERING_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "compiler/ir/graph.h"
#include "compiler/loop/kernel.h"
#include "compiler/ops/registry.h"
#include "kiln/v1/artifact.pb.h"

namespace kiln::loop {

struct LoweredGraph {
  std::vector<Kernel> kernels;
  v1::ExecutionPlan plan;              // modules not filled in; launches name kernels by symbol
  std::vector<std::string> symbols;    // symbol order of the kernel ABI
  std::vector<std::string> decisions;  // "fuse: ...", "refuse: ...", "extern: ..."
};

absl::StatusOr<LoweredGraph> LowerGraph(const ir::Graph& graph,
                                        const ops::Registry& registry = ops::DefaultRegistry());

// The plan and kernels as readable text (for the debug trace).
std::string PrintLowered(const LoweredGraph& lowered);

}  // namespace kiln::loop

#endif  // KILN_COMPILER_LOOP_LOWERING_H_
