// Pass "fuse" (fuse.h), gathers: a gather node joins an open kernel over
// its output's space, or opens one. Its source is read from memory, at
// positions its index tensors name; the index tensors are operands like any
// other (computed in the kernel, or loaded).
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "compiler/loop/fuse_internal.h"
#include "compiler/ops/shape_util.h"

namespace kiln::loop::fuse_internal {
namespace {

// The strides over `out` with which an ordinary operand of sizes `m`
// (right-aligned broadcasting) is read.
SymSizes RightAligned(const ir::TensorMeta& m, const SymSizes& out) {
  SymSizes over(out.size(), SymInt{int64_t{0}});
  if (m.sizes.size() > out.size()) return over;
  const size_t lead = out.size() - m.sizes.size();
  for (size_t j = 0; j < m.sizes.size(); ++j) {
    if (!(ops::IsConstant(m.sizes[j], 1) && !ops::IsConstant(out[lead + j], 1))) {
      over[lead + j] = m.strides[j];
    }
  }
  return over;
}

}  // namespace

absl::Status Fuser::GatherLegal(const Group& grp, const GatherSpec& spec,
                                const SymSizes& out) const {
  auto in_memory = [&](ValueId v) -> absl::Status {
    ValueId root = v;
    if (auto a = alias_.find(v); a != alias_.end()) root = a->second.root;
    if (ProducerItem(v) >= grp.item || ProducerItem(root) >= grp.item) {
      return absl::FailedPreconditionError(absl::StrCat(
          "'", g_.value(v).name, "' is gathered from or by index, and this kernel produces it"));
    }
    if (auto b = grp.buffer_index.find(g_.value(root).name);
        b != grp.buffer_index.end() && grp.buffers[b->second].written) {
      return absl::FailedPreconditionError(
          absl::StrCat("'", g_.value(v).name, "' is memory this kernel writes"));
    }
    return absl::OkStatus();
  };
  RETURN_IF_ERROR(in_memory(spec.source));
  for (size_t k = 0; k < spec.indices.size(); ++k) {
    const ValueId v = spec.indices[k];
    if (RightAligned(g_.value(v).meta, out) == spec.index_over[k]) {
      RETURN_IF_ERROR(Readable(grp, v, Level::kFull, out));
    } else {
      RETURN_IF_ERROR(in_memory(v));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int>> Fuser::GatherIndices(Group& grp, const GatherSpec& spec,
                                                      const SymSizes& out) {
  std::vector<int> ids;
  for (size_t k = 0; k < spec.indices.size(); ++k) {
    const ValueId v = spec.indices[k];
    if (RightAligned(g_.value(v).meta, out) == spec.index_over[k]) {
      ASSIGN_OR_RETURN(int id, Operand(grp, v, Level::kFull, out));
      ids.push_back(id);
    } else {
      ids.push_back(Add(grp, MemoryLoad(grp, v, spec.index_over[k])));
    }
  }
  return ids;
}

GVal Fuser::MemoryLoad(Group& grp, ValueId v, SymSizes over) {
  ValueId root = v;
  SymInt offset{int64_t{0}};
  if (auto a = alias_.find(v); a != alias_.end()) {
    root = a->second.root;
    offset = a->second.offset;
  }
  MarkStored(v);
  MarkStored(root);
  GVal l;
  l.kind = StmtKind::kLoad;
  l.dtype = g_.value(v).meta.dtype;
  l.level = Level::kFull;
  l.over = std::move(over);
  l.offset = std::move(offset);
  l.buffer = BufferOf(grp, root, false);
  return l;
}

absl::StatusOr<int> Fuser::BuildGather(Group& grp, const GatherSpec& spec, const SymSizes& out) {
  GVal gather = MemoryLoad(grp, spec.source, spec.source_over);
  gather.kind = StmtKind::kGather;
  gather.gather_strides = spec.strides;
  gather.gather_sizes = spec.sizes;
  gather.gather_wraps = spec.wraps;
  ASSIGN_OR_RETURN(gather.args, GatherIndices(grp, spec, out));
  return Add(grp, std::move(gather));
}

absl::StatusOr<bool> Fuser::PlaceScatter(int node_index) {
  const ir::Node& node = g_.nodes()[node_index];
  const NodeLowering& l = nodes_[node_index];
  const ValueId v = node.outputs[0];
  const ir::TensorMeta& m = g_.value(v).meta;
  int copied = -1;  // the kernel copying the base, if any
  // What the copy and the scatter change in other kernels (stored values,
  // recomputations), to take back if the node runs through ATen after all.
  const Mark before{0, 0, recomputed_.size(), stored_log_.size()};
  const size_t decided = decisions_.size();
  if (l.base != ir::kNoValue) {
    // A kernel of its own copies the base into the output, which the
    // scatter kernel then adds into.
    copied = OpenGroup(m.sizes);
    absl::StatusOr<int> id = Operand(groups_[copied], l.base, Level::kFull, m.sizes);
    if (!id.ok()) {
      Rollback(groups_[copied], before);
      DropNewestGroup();
      if (!absl::IsFailedPrecondition(id.status())) return id.status();
      decisions_.push_back(
          absl::StrCat("extern: ", node.name, " (", node.target, "): ", id.status().message()));
      return false;
    }
    Group& c = groups_[copied];
    c.value_of[v] = *id;
    c.level_of[v] = Level::kFull;
    c.nodes.push_back(node.name);
    c.open = false;
    group_of_[v] = copied;
    producer_item_[v] = c.item;
    MarkStored(v);
    decisions_.push_back(absl::StrCat("new kernel_", copied, ": ", node.name, " (", node.target,
                                      "), its base '", g_.value(l.base).name, "' copied"));
  }
  const int gi = OpenGroup(l.space);
  Group& grp = groups_[gi];
  const Mark mark = MarkOf(grp);
  auto build = [&]() -> absl::Status {
    ASSIGN_OR_RETURN(int value, Operand(grp, l.values, Level::kFull, l.space));
    ASSIGN_OR_RETURN(std::vector<int> args, GatherIndices(grp, l.gather, l.space));
    if (l.skip >= 0) {
      // embedding's padding_idx: its rows add nothing.
      Builder b(
          grp, Level::kFull, [](ValueId) -> absl::StatusOr<int> { return -1; }, *l.call);
      const v1::DType t = grp.vals[value].dtype;
      const int skipped = b.Compare(ScalarOp::kEq, args[0], b.C(l.skip, v1::INT64));
      value = b.Op(ScalarOp::kWhere, {skipped, b.C(0, t), b.Cast(value, Compute(t))}, Compute(t));
    }
    Group::Scatter s;
    s.value = value;
    s.args = std::move(args);
    s.at.over = l.gather.source_over;
    s.at.gather_strides = l.gather.strides;
    s.at.gather_sizes = l.gather.sizes;
    s.at.gather_wraps = l.gather.wraps;
    s.buffer = BufferOf(grp, v, true);
    s.into = v;
    grp.scatters.push_back(std::move(s));
    return absl::OkStatus();
  };
  if (absl::Status built = build(); !built.ok()) {
    Rollback(grp, mark);
    DropNewestGroup();
    if (copied >= 0) {
      // The copy goes too: the node runs through ATen.
      Rollback(groups_[copied], before);
      group_of_.erase(v);
      producer_item_.erase(v);
      DropNewestGroup();
      decisions_.resize(decided);
    }
    if (!absl::IsFailedPrecondition(built)) return built;
    decisions_.push_back(
        absl::StrCat("extern: ", node.name, " (", node.target, "): ", built.message()));
    return false;
  }
  // What reads the sums reads them from memory, after this kernel.
  grp.open = false;
  grp.nodes.push_back(node.name);
  producer_item_[v] = grp.item;
  if (copied < 0) zeroed_.insert(v);
  decisions_.push_back(absl::StrCat("new kernel_", gi, ": ", node.name, " (", node.target,
                                    "), adding '", g_.value(l.values).name, "' into ",
                                    copied < 0 ? "zeros" : "the copy", " at gathered positions"));
  return true;
}

absl::StatusOr<bool> Fuser::PlaceGather(int node_index) {
  const ir::Node& node = g_.nodes()[node_index];
  const GatherSpec& spec = nodes_[node_index].gather;
  const ValueId v = node.outputs[0];
  const ir::TensorMeta& out = g_.value(v).meta;
  auto place = [&](int gi, const std::string& decision) {
    Group& grp = groups_[gi];
    grp.level_of[v] = Level::kFull;
    grp.nodes.push_back(node.name);
    group_of_[v] = gi;
    producer_item_[v] = grp.item;
    decisions_.push_back(decision);
  };
  std::vector<std::string> refusals;
  for (int gi = static_cast<int>(groups_.size()) - 1; gi >= 0; --gi) {
    Group& grp = groups_[gi];
    if (!grp.open) continue;
    absl::StatusOr<Level> level = Classify(grp, out.sizes);
    std::optional<std::string> refused;
    if (!level.ok()) {
      refused = std::string(level.status().message());
    } else if (*level != Level::kFull) {
      refused = "a gather reads its source once per element, not per row";
    } else if (absl::Status legal = GatherLegal(grp, spec, out.sizes); !legal.ok()) {
      refused = std::string(legal.message());
    } else {
      refused = policy_.Refuse({gi, static_cast<int>(grp.nodes.size()), false});
    }
    if (refused) {
      refusals.push_back(absl::StrCat("kernel_", gi, ": ", *refused));
      continue;
    }
    const Mark mark = MarkOf(grp);
    absl::StatusOr<int> id = BuildGather(grp, spec, out.sizes);
    if (!id.ok()) {
      Rollback(grp, mark);
      if (!absl::IsFailedPrecondition(id.status())) return id.status();
      refusals.push_back(absl::StrCat("kernel_", gi, ": ", id.status().message()));
      continue;
    }
    grp.value_of[v] = *id;
    place(gi, absl::StrCat("fuse: ", node.name, " (", node.target, ") into kernel_", gi,
                           ", gathering from '", g_.value(spec.source).name, "'"));
    return true;
  }
  const int gi = OpenGroup(out.sizes);
  absl::StatusOr<int> id = BuildGather(groups_[gi], spec, out.sizes);
  if (!id.ok()) {
    DropNewestGroup();
    if (!absl::IsFailedPrecondition(id.status())) return id.status();
    decisions_.push_back(
        absl::StrCat("extern: ", node.name, " (", node.target, "): ", id.status().message()));
    return false;
  }
  groups_[gi].value_of[v] = *id;
  place(gi,
        absl::StrCat("new kernel_", gi, ": ", node.name, " (", node.target, "), gathering from '",
                     g_.value(spec.source).name, "'", NotFused(refusals)));
  return true;
}

absl::StatusOr<std::optional<int>> Fuser::RecomputeGather(Group& grp, ValueId v, Level level) {
  const int p = g_.value(v).producer;
  const ir::Node& node = g_.nodes()[p];
  const ir::TensorMeta& m = g_.value(v).meta;
  if (level != Level::kFull || m.sizes.size() > grp.full.size()) return std::nullopt;
  // The spec over the kernel's space: the gather's output dims right-
  // aligned in it, its broadcast (size-1) dims read at 0.
  GatherSpec spec = nodes_[p].gather;
  const size_t lead = grp.full.size() - m.sizes.size();
  auto widen = [&](const SymSizes& over) {
    SymSizes out(grp.full.size(), SymInt{int64_t{0}});
    for (size_t j = 0; j < m.sizes.size(); ++j) {
      if (!ops::IsConstant(m.sizes[j], 1)) out[lead + j] = over[j];
    }
    return out;
  };
  spec.source_over = widen(spec.source_over);
  for (SymSizes& over : spec.index_over) over = widen(over);
  if (!GatherLegal(grp, spec, grp.full).ok()) return std::nullopt;
  const Mark mark = MarkOf(grp);
  absl::StatusOr<int> id = BuildGather(grp, spec, grp.full);
  if (!id.ok()) {
    Rollback(grp, mark);
    if (!absl::IsFailedPrecondition(id.status())) return id.status();
    return std::nullopt;
  }
  grp.value_of[v] = *id;
  grp.level_of[v] = Level::kFull;
  recomputed_.emplace_back(&grp - groups_.data(), v);
  decisions_.push_back(absl::StrCat("recompute: ", node.name, " (", node.target, ") in kernel_",
                                    &grp - groups_.data(), " rather than read from kernel_",
                                    group_of_.at(v)));
  return *id;
}

}  // namespace kiln::loop::fuse_internal
