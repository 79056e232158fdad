// LowerGraph and the driver of the lowering, Lowerer::Run: each node in
// topological order becomes a view of its base, joins or opens a kernel, or
// runs through ATen; then every kernel is emitted and the plan built. The
// phases' files are listed in lowering_internal.h.
#include "compiler/loop/lowering.h"

#include <algorithm>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "compiler/loop/lowering_internal.h"
#include "compiler/ops/shape_util.h"

namespace kiln::loop {
namespace lowering_internal {

absl::StatusOr<LoweredGraph> Lowerer::Run() {
  // Producers of graph values, for views.
  for (int i = 0; i < static_cast<int>(g_.nodes().size()); ++i) {
    const ir::Node& node = g_.nodes()[i];
    if (IsView(node) && !node.outputs.empty()) {
      ValueId base =
          ir::Graph::Operands(node).empty() ? ir::kNoValue : ir::Graph::Operands(node)[0];
      if (base != ir::kNoValue) {
        // An order-preserving view of a value a kernel computes may be read
        // inside that kernel (see ReshapeFor); a reader elsewhere reads it
        // from memory and marks the root stored then. Any other view needs
        // its base in memory.
        ValueId viewed = base;
        if (auto r = reshape_of_.find(base); r != reshape_of_.end()) viewed = r->second;
        const ir::TensorMeta& bm = g_.value(base).meta;
        bool order_preserving = group_of_.count(viewed) > 0 && ops::IsContiguous(bm);
        for (ValueId v : node.outputs) {
          const ir::TensorMeta& vm = g_.value(v).meta;
          order_preserving = order_preserving && ops::IsContiguous(vm) &&
                             vm.storage_offset == bm.storage_offset &&
                             ops::Numel(vm.sizes) == ops::Numel(bm.sizes);
        }
        if (order_preserving) {
          for (ValueId v : node.outputs) reshape_of_[v] = viewed;
        } else {
          MarkStored(base);
          if (auto a = alias_.find(base); a != alias_.end()) MarkStored(a->second.root);
        }
        ValueId root = base;
        if (auto a = alias_.find(base); a != alias_.end()) root = a->second.root;
        for (ValueId v : node.outputs) {
          alias_[v] = Alias{root, ops::SymSub(g_.value(v).meta.storage_offset,
                                              g_.value(root).meta.storage_offset)};
          producer_item_[v] = std::max(ProducerItem(base), ProducerItem(root));
        }
        decisions_.push_back(absl::StrCat("view: ", node.name, " (", node.target, ") reads '",
                                          g_.value(root).name, "' in place"));
        continue;
      }
    }
    ASSIGN_OR_RETURN(bool pointwise, TryPointwise(i));
    if (pointwise) continue;
    ASSIGN_OR_RETURN(bool reduction, TryReduction(i));
    if (reduction) continue;
    // Extern: its operands must be in memory.
    for (ValueId v : ir::Graph::Operands(node)) {
      MarkStored(v);
      if (auto a = alias_.find(v); a != alias_.end()) MarkStored(a->second.root);
    }
    items_.push_back(Item{Item::kExtern, -1, i});
    for (ValueId v : node.outputs) producer_item_[v] = static_cast<int>(items_.size()) - 1;
    // Kernels opened before an extern stay open: later nodes may still join
    // them when they read nothing the extern produces.
    decisions_.push_back(
        absl::StrCat("extern: ", node.name, " (", node.target, ") runs through ATen"));
  }
  for (ValueId v : g_.outputs()) {
    MarkStored(v);
    if (auto a = alias_.find(v); a != alias_.end()) MarkStored(a->second.root);
  }

  LoweredGraph out;
  // Buffers written by each kernel: its stored values.
  for (size_t gi = 0; gi < groups_.size(); ++gi) {
    for (ValueId v : groups_[gi].stored) BufferOf(groups_[gi], v, true);
  }
  for (size_t gi = 0; gi < groups_.size(); ++gi) {
    ASSIGN_OR_RETURN(Kernel k, EmitKernel(static_cast<int>(gi)));
    out.kernels.push_back(std::move(k));
  }
  BuildPlan(&out);
  out.decisions = std::move(decisions_);
  return out;
}

}  // namespace lowering_internal

absl::StatusOr<LoweredGraph> LowerGraph(const ir::Graph& graph, const ops::Registry& registry) {
  lowering_internal::Lowerer l(graph, registry);
  return l.Run();
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
