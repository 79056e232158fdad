// Pass "fuse" (fuse.h): Fuse and the driver, Fuser::Run; each node placed
// as a view, into an open kernel (legality, then the target's policy), into
// a kernel of its own, or as an extern step. The kernels' values are built
// in fuse_values.cc and emitted in fuse_emit.cc.
#include "compiler/loop/fuse.h"

#include <algorithm>
#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "compiler/loop/fuse_internal.h"
#include "compiler/loop/kernel_edit.h"
#include "compiler/ops/shape_util.h"

namespace kiln::loop {

std::optional<std::string> FusionPolicy::Refuse(const FusionCandidate& c) const {
  if (!fuse) return std::string("the target's policy fuses nothing");
  if (max_kernel_nodes > 0 && c.kernel_nodes >= max_kernel_nodes) {
    return absl::StrCat("it holds ", c.kernel_nodes, " nodes, the target's limit");
  }
  return std::nullopt;
}

namespace fuse_internal {
namespace {

std::string ReshapeDecision(int gi, const SymSizes& from, const SymSizes& to) {
  return absl::StrCat("reshape: kernel_", gi, " from ", ops::SizesToString(from), " to ",
                      ops::SizesToString(to), ": a view keeps its elements and their order");
}

}  // namespace

std::string Fuser::NotFused(const std::vector<std::string>& refusals) {
  // The newest kernels' refusals: a graph of thousands of kernels would
  // otherwise write thousands per node.
  constexpr size_t kListed = 4;
  if (refusals.empty()) return "";
  std::string out = absl::StrCat(
      "; not fused: ",
      absl::StrJoin(refusals.begin(), refusals.begin() + std::min(kListed, refusals.size()), "; "));
  if (refusals.size() > kListed) {
    absl::StrAppend(&out, "; and ", refusals.size() - kListed, " more kernels");
  }
  return out;
}

void Fuser::PlaceView(int node_index) {
  const ir::Node& node = g_.nodes()[node_index];
  const ValueId base = ir::Graph::Operands(node)[0];
  // An order-preserving view of a value a kernel computes may be read
  // inside that kernel (see ReshapeFor); a reader elsewhere reads it from
  // memory and marks the root stored then. Any other view needs its base
  // in memory.
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
    alias_[v] = Alias{
        root, ops::SymSub(g_.value(v).meta.storage_offset, g_.value(root).meta.storage_offset)};
    producer_item_[v] = std::max(ProducerItem(base), ProducerItem(root));
  }
  decisions_.push_back(absl::StrCat("view: ", node.name, " (", node.target, ") reads '",
                                    g_.value(root).name, "' in place"));
}

absl::StatusOr<bool> Fuser::PlacePointwise(int node_index) {
  const ir::Node& node = g_.nodes()[node_index];
  const ops::OpCall& call = *nodes_[node_index].call;
  const PointwiseRule& rule = PointwiseRules().at(node.target);
  const ir::TensorMeta& out = g_.value(node.outputs[0]).meta;
  const ValueId v = node.outputs[0];

  // The open kernels, newest first: the first legal one the policy takes.
  std::vector<std::string> refusals;
  for (int gi = static_cast<int>(groups_.size()) - 1; gi >= 0; --gi) {
    Group& grp = groups_[gi];
    if (!grp.open) continue;
    absl::StatusOr<Level> level = Classify(grp, out.sizes);
    std::optional<ReshapeUndo> reshaped;
    if (!level.ok()) {
      reshaped = ReshapeFor(grp, node_index, out.sizes);
      if (reshaped) level = Level::kFull;
    }
    if (!level.ok()) {
      refusals.push_back(absl::StrCat("kernel_", gi, ": ", level.status().message()));
      continue;
    }
    std::optional<std::string> refused;
    if (absl::Status legal = Legal(grp, node_index, *level, out.sizes); !legal.ok()) {
      refused = std::string(legal.message());
    } else {
      refused = policy_.Refuse({gi, static_cast<int>(grp.nodes.size()), false});
    }
    if (refused) {
      refusals.push_back(absl::StrCat("kernel_", gi, ": ", *refused));
      if (reshaped) Undo(grp, *std::move(reshaped));
      continue;
    }
    const Mark mark = MarkOf(grp);
    Builder b(
        grp, *level, [&](ValueId u) { return Operand(grp, u, *level, out.sizes); }, call,
        *level == Level::kFull ? out.sizes : SymSizes{});
    absl::StatusOr<int> result = rule(b, call, out.dtype);
    if (!result.ok()) {
      // Its operands are readable here, but the op's lowering refused
      // (a recomputed operand that could not be built after all).
      Rollback(grp, mark);
      if (reshaped) Undo(grp, *std::move(reshaped));
      if (!absl::IsFailedPrecondition(result.status())) return result.status();
      refusals.push_back(absl::StrCat("kernel_", gi, ": ", result.status().message()));
      continue;
    }
    if (reshaped) decisions_.push_back(ReshapeDecision(gi, reshaped->full, grp.full));
    grp.value_of[v] = *result;
    grp.level_of[v] = *level;
    grp.nodes.push_back(node.name);
    group_of_[v] = gi;
    producer_item_[v] = grp.item;
    decisions_.push_back(absl::StrCat("fuse: ", node.name, " (", node.target, ") into kernel_", gi,
                                      *level == Level::kFull ? "" : " (per row)"));
    return true;
  }
  // A new kernel over its own output space.
  const int gi = OpenGroup(out.sizes);
  Group& fresh = groups_[gi];
  Builder b(
      fresh, Level::kFull, [&](ValueId u) { return Operand(fresh, u, Level::kFull, out.sizes); },
      call, out.sizes);
  absl::StatusOr<int> result = rule(b, call, out.dtype);
  if (!result.ok()) {
    // Not lowerable after all (an operand dtype, a rank): run it through ATen.
    DropNewestGroup();
    if (!absl::IsFailedPrecondition(result.status())) return result.status();
    decisions_.push_back(
        absl::StrCat("extern: ", node.name, " (", node.target, "): ", result.status().message()));
    return false;
  }
  fresh.value_of[v] = *result;
  fresh.level_of[v] = Level::kFull;
  fresh.nodes.push_back(node.name);
  group_of_[v] = gi;
  producer_item_[v] = fresh.item;
  decisions_.push_back(
      absl::StrCat("new kernel_", gi, ": ", node.name, " (", node.target, ")", NotFused(refusals)));
  return true;
}

absl::StatusOr<bool> Fuser::PlaceReduction(int node_index) {
  const NodeLowering& l = nodes_[node_index];
  const ir::TensorMeta& in = g_.value(l.input).meta;
  // Join an open kernel over the same space, or open one.
  std::vector<std::string> refusals;
  for (int k = static_cast<int>(groups_.size()) - 1; k >= 0; --k) {
    Group& grp = groups_[k];
    if (!grp.open) continue;
    auto refuse = [&](absl::string_view why) {
      refusals.push_back(absl::StrCat("kernel_", k, ": ", why));
    };
    std::optional<ReshapeUndo> reshaped;
    if (!(grp.full == in.sizes)) {
      reshaped = ReshapeFor(grp, node_index, in.sizes);
      if (!reshaped) {
        refuse(absl::StrCat("its space ", ops::SizesToString(grp.full), " differs"));
        continue;
      }
    }
    if (!grp.reduced.empty() && grp.reduced != l.dims) {
      if (reshaped) Undo(grp, *std::move(reshaped));
      refuse("it reduces other dimensions");
      continue;
    }
    // A pointwise kernel takes the reduction's loop order when one joins;
    // it must then compute only whole-space values.
    const std::vector<int> saved_reduced = grp.reduced;
    grp.reduced = l.dims;
    std::optional<std::string> refused;
    if (absl::Status legal = Legal(grp, node_index, Level::kFull, in.sizes); !legal.ok()) {
      refused = std::string(legal.message());
    } else {
      refused = policy_.Refuse({k, static_cast<int>(grp.nodes.size()), true});
    }
    if (refused) {
      grp.reduced = saved_reduced;
      if (reshaped) Undo(grp, *std::move(reshaped));
      refuse(*refused);
      continue;
    }
    // Its operands are readable here; building its values may still fail
    // (a value the legality check took as recomputable that cannot be):
    // then the kernel is refused as it was.
    const Mark mark = MarkOf(grp);
    const size_t decisions = decisions_.size(), keeps = grp.keep_in_output.size();
    absl::Status built = BuildReduction(k, node_index, false, "");
    if (!built.ok()) {
      Rollback(grp, mark);
      decisions_.resize(decisions);
      grp.keep_in_output.resize(keeps);
      grp.reduced = saved_reduced;
      if (reshaped) Undo(grp, *std::move(reshaped));
      if (!absl::IsFailedPrecondition(built)) return built;
      refuse(built.message());
      continue;
    }
    if (reshaped) {
      decisions_.insert(decisions_.begin() + static_cast<std::ptrdiff_t>(decisions),
                        ReshapeDecision(k, reshaped->full, grp.full));
    }
    if (saved_reduced.empty()) BroadcastsToRows(grp);
    return true;
  }
  // A new kernel over the input's space.
  const int gi = OpenGroup(in.sizes);
  groups_[gi].reduced = l.dims;
  RETURN_IF_ERROR(BuildReduction(gi, node_index, true, NotFused(refusals)));
  return true;
}

absl::StatusOr<FusedGraph> Fuser::Run() {
  for (int i = 0; i < static_cast<int>(g_.nodes().size()); ++i) {
    const ir::Node& node = g_.nodes()[i];
    const NodeLowering& l = nodes_[i];
    if (l.kind == NodeKind::kView) {
      PlaceView(i);
      continue;
    }
    if (l.kind == NodeKind::kPointwise) {
      ASSIGN_OR_RETURN(bool placed, PlacePointwise(i));
      if (placed) continue;
    } else if (l.kind == NodeKind::kReduction) {
      ASSIGN_OR_RETURN(bool placed, PlaceReduction(i));
      if (placed) continue;
    } else if (l.kind == NodeKind::kGather) {
      ASSIGN_OR_RETURN(bool placed, PlaceGather(i));
      if (placed) continue;
    } else if (l.kind == NodeKind::kScatter) {
      ASSIGN_OR_RETURN(bool placed, PlaceScatter(i));
      if (placed) continue;
    } else {
      decisions_.push_back(
          absl::StrCat("extern: ", node.name, " (", node.target, ") runs through ATen: ", l.why));
    }
    // Extern: its operands must be in memory.
    for (ValueId v : ir::Graph::Operands(node)) {
      MarkStored(v);
      if (auto a = alias_.find(v); a != alias_.end()) MarkStored(a->second.root);
    }
    items_.push_back(Item{Item::kExtern, -1, i});
    for (ValueId v : node.outputs) producer_item_[v] = static_cast<int>(items_.size()) - 1;
    // Kernels opened before an extern stay open: later nodes may still join
    // them when they read nothing the extern produces.
  }
  for (ValueId v : g_.outputs()) {
    MarkStored(v);
    if (auto a = alias_.find(v); a != alias_.end()) MarkStored(a->second.root);
  }

  FusedGraph out;
  // Buffers written by each kernel: its stored values.
  for (Group& grp : groups_) {
    for (ValueId v : grp.stored) BufferOf(grp, v, true);
  }
  // A kernel that stores nothing (every value it computed is recomputed
  // where it is read) is not launched; the others keep their names.
  std::vector<int> index(groups_.size(), -1);
  for (size_t gi = 0; gi < groups_.size(); ++gi) {
    if (groups_[gi].stored.empty() && groups_[gi].scatters.empty()) {
      decisions_.push_back(absl::StrCat("drop: kernel_", gi,
                                        " stores nothing: its values are computed where they "
                                        "are read"));
      continue;
    }
    ASSIGN_OR_RETURN(Kernel k, EmitKernel(static_cast<int>(gi)));
    kernel_edit::DropUnneeded(&k);
    index[gi] = static_cast<int>(out.kernels.size());
    out.kernels.push_back(std::move(k));
  }
  out.computed.resize(out.kernels.size());
  for (const auto& [v, gi] : group_of_) {
    if (index[gi] >= 0) out.computed[index[gi]].push_back(v);
  }
  for (size_t gi = 0; gi < groups_.size(); ++gi) {
    for (const Group::Scatter& s : groups_[gi].scatters) {
      if (index[gi] >= 0) out.computed[index[gi]].push_back(s.into);
    }
  }
  out.zeroed = zeroed_;
  for (const Item& item : items_) {
    if (item.kind != Item::kGroup) {
      out.steps.push_back(FusedGraph::Step{-1, item.node});
    } else if (index[item.group] >= 0) {
      out.steps.push_back(FusedGraph::Step{index[item.group], -1});
    }
  }
  for (const auto& [v, alias] : alias_) out.view_root[v] = alias.root;
  out.decisions = std::move(decisions_);
  return out;
}

}  // namespace fuse_internal

absl::StatusOr<FusedGraph> Fuse(const ir::Graph& graph, const std::vector<NodeLowering>& nodes,
                                const FusionPolicy& policy) {
  if (nodes.size() != graph.nodes().size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "fuse: ", nodes.size(), " lowered nodes for a graph of ", graph.nodes().size()));
  }
  fuse_internal::Fuser f(graph, nodes, policy);
  return f.Run();
}

std::string PrintFused(const ir::Graph& graph, const FusedGraph& fused) {
  std::string out = "# fusion decisions\n";
  for (const auto& d : fused.decisions) absl::StrAppend(&out, d, "\n");
  absl::StrAppend(&out, "\n# kernels (", fused.kernels.size(), ")\n");
  for (const Kernel& k : fused.kernels) absl::StrAppend(&out, PrintKernel(k), "\n");
  absl::StrAppend(&out, "# steps\n");
  for (const FusedGraph::Step& s : fused.steps) {
    if (s.kernel >= 0) {
      absl::StrAppend(&out, fused.kernels[s.kernel].name, "\n");
    } else {
      const ir::Node& node = graph.nodes()[s.node];
      absl::StrAppend(&out, "extern ", node.name, " (", node.target, ")\n");
    }
  }
  return out;
}

}  // namespace kiln::loop
