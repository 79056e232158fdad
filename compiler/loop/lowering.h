// The kiln backend's loop passes, from a graph of registry ops to fused
// loop-level kernels (compiler/loop/kernel.h) and the execution plan that
// runs them (v1::ExecutionPlan), every op without a lowering left as an
// extern call through ATen (matmul, convolution, pooling, embedding, ...).
// Each pass is a file with one entry point and a dump:
//
//   lower         lower.h         LowerNodes   PrintNodeLowerings
//   fuse          fuse.h          Fuse         PrintFused
//   plan          plan_build.h    BuildPlan    PrintLowered
//   (cuda: split-reductions, split_reductions.h)
//   cat-in-place  cat_in_place.h  WriteCatsInPlace
//   (cuda: sweep-order, sweep_order.h)
//   share-kernels share_kernels.h ShareIdenticalKernels
//   memory-plan   memory_plan.h   PlanMemory   PrintSteps
//
// LowerGraph runs them in that order, for callers that want the result
// only; the compile pipeline (compiler/pipeline/pipeline.h) runs them one by
// one, timing each and keeping its dump in the debug trace.
//
// Pure functions; thread-safe.
#ifndef KILN_COMPILER_LOOP_LOWERING_H_
#define KILN_COMPILER_LOOP_LOWERING_H_

#include <string>

#include "absl/status/statusor.h"
#include "compiler/ir/graph.h"
#include "compiler/loop/cat_in_place.h"
#include "compiler/loop/fuse.h"
#include "compiler/loop/lower.h"
#include "compiler/loop/memory_plan.h"
#include "compiler/loop/plan_build.h"
#include "compiler/loop/share_kernels.h"
#include "compiler/ops/registry.h"

namespace kiln::loop {

// lower, fuse, plan, cat-in-place, share-kernels and memory-plan.
absl::StatusOr<LoweredGraph> LowerGraph(const ir::Graph& graph,
                                        const ops::Registry& registry = ops::DefaultRegistry(),
                                        const FusionPolicy& policy = FusionPolicy());

// The decisions, kernels and plan as readable text (for the debug trace).
std::string PrintLowered(const LoweredGraph& lowered);

}  // namespace kiln::loop

#endif  // KILN_COMPILER_LOOP_LOWERING_H_
