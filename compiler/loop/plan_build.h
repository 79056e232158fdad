// Pass "plan" (docs/architecture.md §5): the execution plan
// (v1::ExecutionPlan) that runs a fused graph (fuse.h): the graph's inputs
// and the symbols they bind, an allocation for each value a kernel stores
// before the kernel's launch, an extern call for each node left to ATen,
// a view step where a view is needed as a tensor, and the outputs. The
// plan frees nothing yet: that is the memory plan's (memory_plan.h).
//
// Pure function; thread-safe.
#ifndef KILN_COMPILER_LOOP_PLAN_BUILD_H_
#define KILN_COMPILER_LOOP_PLAN_BUILD_H_

#include <string>
#include <vector>

#include "compiler/ir/graph.h"
#include "compiler/loop/fuse.h"
#include "compiler/loop/kernel.h"
#include "kiln/v1/artifact.pb.h"

namespace kiln::loop {

struct LoweredGraph {
  std::vector<Kernel> kernels;
  v1::ExecutionPlan plan;              // modules not filled in; launches name kernels by symbol
  std::vector<std::string> symbols;    // symbol order of the kernel ABI
  std::vector<std::string> decisions;  // "fuse: ...", "new kernel_N: ...", "extern: ...", ...
};

// Takes `fused`'s kernels and decisions.
LoweredGraph BuildPlan(const ir::Graph& graph, FusedGraph fused);

}  // namespace kiln::loop

#endif  // KILN_COMPILER_LOOP_PLAN_BUILD_H_
