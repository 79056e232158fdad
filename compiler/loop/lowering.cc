// LowerGraph: the loop passes in order (lowering.h).
#include "compiler/loop/lowering.h"

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace kiln::loop {

absl::StatusOr<LoweredGraph> LowerGraph(const ir::Graph& graph, const ops::Registry& registry,
                                        const FusionPolicy& policy) {
  ASSIGN_OR_RETURN(std::vector<NodeLowering> nodes, LowerNodes(graph, registry));
  ASSIGN_OR_RETURN(FusedGraph fused, Fuse(graph, nodes, policy));
  LoweredGraph lowered = BuildPlan(graph, std::move(fused));
  WriteCatsInPlace(&lowered);
  ShareIdenticalKernels(&lowered);
  PlanMemory(&lowered.plan);
  return lowered;
}

std::string PrintLowered(const LoweredGraph& lowered) {
  std::string out = "# fusion decisions\n";
  for (const auto& d : lowered.decisions) absl::StrAppend(&out, d, "\n");
  absl::StrAppend(&out, "\n# kernels (", lowered.kernels.size(), ")\n");
  for (const Kernel& k : lowered.kernels) absl::StrAppend(&out, PrintKernel(k), "\n");
  absl::StrAppend(&out, "# execution plan\n", lowered.plan.DebugString());
  return out;
}

}  // namespace kiln::loop
