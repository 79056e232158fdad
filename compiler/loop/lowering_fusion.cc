// Fusion: which open kernel a pointwise or reduction node joins (legality
// apart from profitability, see lowering.h), the node lowered into that
// kernel's values, and the reshape of a kernel into the shape of a view of a
// value it computes. Every decision and refusal is recorded.
#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "compiler/loop/lowering_internal.h"
#include "compiler/ops/shape_util.h"

namespace kiln::loop::lowering_internal {
namespace {

bool SameSizes(const SymSizes& a, const SymSizes& b) { return a == b; }

// Rows whose mean and variance are computed in two sweeps (a sum, then the
// squared deviations from its mean) rather than in one Welford sweep: rows
// of the trailing, contiguous dims whose size is a constant of at most this
// many elements (a norm layer's hidden size). The second sweep reads the row
// from L1 or L2, so reading it twice costs little, and a plain sum in the
// sweep that waits on memory is cheaper than Welford's update (whose mean
// chain is a subtraction and an FMA long). Two-pass is at least as accurate
// as Welford. A longer row, or one of a symbolic size, would be read twice
// from memory: those keep Welford.
constexpr int64_t kTwoPassMaxRow = 16384;

bool TwoPassMoments(const ir::TensorMeta& in, const std::vector<int>& dims) {
  const int rank = static_cast<int>(in.sizes.size());
  if (dims.empty() || in.strides.size() != in.sizes.size()) return false;
  int64_t n = 1;
  for (size_t k = 0; k < dims.size(); ++k) {
    const int d = rank - static_cast<int>(dims.size()) + static_cast<int>(k);
    if (dims[k] != d || !in.sizes[d].is_constant() || !in.strides[d].is_constant()) return false;
    if (in.sizes[d].constant() > 1 && in.strides[d].constant() != n) return false;
    n *= in.sizes[d].constant();
  }
  return n <= kTwoPassMaxRow;
}

bool Supported(v1::DType t) {
  return t == v1::FLOAT32 || t == v1::FLOAT64 || t == v1::FLOAT16 || t == v1::BFLOAT16 ||
         t == v1::INT64 || t == v1::INT32 || t == v1::BOOL;
}

// Whether `q` is `p` times something (as polynomials in the symbols).
bool Divides(const SymInt& p, const SymInt& q) {
  if (ops::IsConstant(p, 0)) return false;
  return ops::SymMul(ops::SymFloorDiv(q, p), p) == q;
}

// The strides over `to` of an access with `strides` over `from`, where
// `to` enumerates the same elements in the same (row-major) order; nullopt
// when no strides do. Constant shapes follow ATen's view rule. Symbolic
// ones are matched in blocks, innermost first: a run of `from`'s dims and a
// run of `to`'s with the same product (compared as polynomials; a block
// grows on the side whose product divides the other's). The `from` run
// must step as one (each stride the next one times the next size), and the
// `to` run splits that step. Size-1 dims of `to` get stride 0.
std::optional<SymSizes> Restride(const SymSizes& from, const SymSizes& strides,
                                 const SymSizes& to) {
  if (ops::ConstantSizes(from) && ops::ConstantSizes(strides) && ops::ConstantSizes(to)) {
    return ops::ViewStrides(from, strides, to);
  }
  std::vector<int> f, t;  // the dims of size other than 1
  for (int d = 0; d < static_cast<int>(from.size()); ++d) {
    if (!ops::IsConstant(from[d], 1)) f.push_back(d);
  }
  for (int d = 0; d < static_cast<int>(to.size()); ++d) {
    if (!ops::IsConstant(to[d], 1)) t.push_back(d);
  }
  SymSizes out(to.size(), SymInt{int64_t{0}});
  int a = static_cast<int>(f.size()) - 1, b = static_cast<int>(t.size()) - 1;
  while (a >= 0 && b >= 0) {
    int a0 = a, b0 = b;
    SymInt pf = from[f[a]], pt = to[t[b]];
    while (!(pf == pt)) {
      if (a0 > 0 && Divides(pf, pt)) {
        pf = ops::SymMul(pf, from[f[--a0]]);
      } else if (b0 > 0 && Divides(pt, pf)) {
        pt = ops::SymMul(pt, to[t[--b0]]);
      } else {
        return std::nullopt;
      }
    }
    for (int k = a0; k < a; ++k) {
      if (!(strides[f[k]] == ops::SymMul(strides[f[k + 1]], from[f[k + 1]]))) return std::nullopt;
    }
    SymInt step = strides[f[a]];
    for (int k = b; k >= b0; --k) {
      out[t[k]] = step;
      step = ops::SymMul(step, to[t[k]]);
    }
    a = a0 - 1;
    b = b0 - 1;
  }
  if (a >= 0 || b >= 0) return std::nullopt;
  return out;
}

std::string ReshapeDecision(int gi, const SymSizes& from, const SymSizes& to) {
  return absl::StrCat("reshape: kernel_", gi, " from [", ops::SizesToString(from), "] to [",
                      ops::SizesToString(to), "]: a view keeps its elements and their order");
}

struct ReductionSpec {
  std::vector<int> dims;  // reduced dims of the input
  bool keepdim = false;
};

}  // namespace

// ---------------------------------------------------------------------------
// Iteration spaces

absl::StatusOr<Level> Lowerer::Classify(const Group& grp, const SymSizes& sizes) const {
  if (SameSizes(sizes, grp.full)) return Level::kFull;
  if (grp.reduced.empty()) {
    return absl::FailedPreconditionError(absl::StrCat("its shape [", ops::SizesToString(sizes),
                                                      "] is not the kernel's [",
                                                      ops::SizesToString(grp.full), "]"));
  }
  SymSizes keep = grp.full, flat;
  for (int d : grp.reduced) keep[d] = SymInt{int64_t{1}};
  for (size_t d = 0; d < grp.full.size(); ++d) {
    if (std::find(grp.reduced.begin(), grp.reduced.end(), static_cast<int>(d)) ==
        grp.reduced.end()) {
      flat.push_back(grp.full[d]);
    }
  }
  if (SameSizes(sizes, keep)) return Level::kRowKeep;
  if (SameSizes(sizes, flat)) return Level::kRowFlat;
  return absl::FailedPreconditionError(
      absl::StrCat("its shape [", ops::SizesToString(sizes), "] is neither the kernel's [",
                   ops::SizesToString(grp.full), "] nor one value per row"));
}

int Lowerer::BufferOf(Group& grp, ValueId root, bool written) {
  const std::string& name = g_.value(root).name;
  auto it = grp.buffer_index.find(name);
  if (it != grp.buffer_index.end()) {
    grp.buffers[it->second].written |= written;
    return it->second;
  }
  KernelBuffer b;
  b.value = name;
  b.dtype = g_.value(root).meta.dtype;
  b.written = written;
  grp.buffers.push_back(b);
  grp.buffer_index[name] = static_cast<int>(grp.buffers.size()) - 1;
  return static_cast<int>(grp.buffers.size()) - 1;
}

void Lowerer::MarkStored(ValueId v) {
  auto it = group_of_.find(v);
  if (it != group_of_.end()) groups_[it->second].stored.insert(v);
}

absl::StatusOr<int> Lowerer::Operand(Group& grp, ValueId v, Level level, const SymSizes& out) {
  const ir::TensorMeta& m = g_.value(v).meta;
  if (!Supported(m.dtype)) {
    return absl::FailedPreconditionError(
        absl::StrCat("'", g_.value(v).name, "' has dtype ", v1::DType_Name(m.dtype)));
  }
  // Computed in this kernel: it must vary the way the consumer expects.
  auto in = grp.value_of.find(v);
  if (in != grp.value_of.end()) {
    // Whole-space consumers read whole-space values and rows kept as size-1
    // dims (they broadcast); per-row consumers read rows of their own form.
    const Level have = grp.level_of[v];
    const bool ok = have == level || (level == Level::kFull && have == Level::kRowKeep);
    if (!ok) {
      return absl::FailedPreconditionError(absl::StrCat(
          "'", g_.value(v).name, "' varies differently in this kernel than its reader needs"));
    }
    return in->second;
  }
  // An order-preserving view of a value of this kernel, in the kernel's
  // shape: the value itself.
  if (auto r = reshape_of_.find(v);
      r != reshape_of_.end() && level == Level::kFull && SameSizes(m.sizes, grp.full)) {
    auto base = grp.value_of.find(r->second);
    if (base != grp.value_of.end() && grp.level_of[r->second] == Level::kFull) return base->second;
  }
  // A broadcast (expand) over the whole space of a value this kernel
  // computes per row (the reduced dims kept as 1): the value itself, which
  // broadcasts over its row.
  if (level == Level::kFull && SameSizes(m.sizes, grp.full)) {
    const int p = g_.value(v).producer;
    if (p >= 0 && g_.nodes()[p].target == "aten.expand.default") {
      const ValueId base = ir::Graph::Operands(g_.nodes()[p])[0];
      auto b = grp.value_of.find(base);
      if (b != grp.value_of.end() && grp.level_of[base] != Level::kRowFlat) return b->second;
    }
  }
  // A cheap pointwise value another kernel computes: computed again here
  // from what it reads, so that the other kernel need not store it.
  ASSIGN_OR_RETURN(std::optional<int> again, Recompute(grp, v, level));
  if (again) return *again;
  // Read from memory: produced before this kernel, and not written by it.
  ValueId root = v;
  SymInt offset{int64_t{0}};
  if (auto a = alias_.find(v); a != alias_.end()) {
    root = a->second.root;
    offset = a->second.offset;
  }
  if (ProducerItem(v) >= grp.item || ProducerItem(root) >= grp.item) {
    return absl::FailedPreconditionError(
        absl::StrCat("'", g_.value(v).name,
                     "' is produced after this kernel or by it (fusing would form a cycle)"));
  }
  if (auto b = grp.buffer_index.find(g_.value(root).name);
      b != grp.buffer_index.end() && grp.buffers[b->second].written) {
    return absl::FailedPreconditionError(
        absl::StrCat("'", g_.value(v).name, "' is memory this kernel writes"));
  }
  // Strides over the consumer's output dims (right-aligned broadcasting).
  if (m.sizes.size() > out.size()) {
    return absl::FailedPreconditionError(
        absl::StrCat("'", g_.value(v).name, "' has a higher rank"));
  }
  std::vector<SymInt> over(out.size(), SymInt{int64_t{0}});
  const size_t lead = out.size() - m.sizes.size();
  for (size_t j = 0; j < m.sizes.size(); ++j) {
    const bool broadcast = ops::IsConstant(m.sizes[j], 1) && !ops::IsConstant(out[lead + j], 1);
    if (broadcast) continue;
    // A size the graph only assumed equal to the kernel's (a symbol
    // broadcast against a constant): the kernel would index past the value
    // when they differ. Such a node runs through ATen, which checks.
    if (!(m.sizes[j] == out[lead + j])) {
      return absl::FailedPreconditionError(absl::StrCat(
          "'", g_.value(v).name, "' has size ", m.sizes[j].ToString(), " at dim ", j,
          " where the kernel has ", out[lead + j].ToString(), " (equal only by assumption)"));
    }
    over[lead + j] = m.strides[j];
  }
  // Whatever kernel computes it stores it.
  MarkStored(v);
  MarkStored(root);
  GVal load;
  load.kind = StmtKind::kLoad;
  load.dtype = m.dtype;
  load.level = level;
  load.over = std::move(over);
  load.offset = offset;
  load.buffer = BufferOf(grp, root, false);
  return Add(grp, std::move(load));
}

// What computing `v` again in `grp` takes: the nodes, and the whole-space
// tensors it reads that `grp` does not read yet. False when `v` is not
// recomputable there: made by something other than a single-output
// pointwise node of another kernel, at a level the kernel cannot hold, or
// deeper than kMaxRecomputeDepth.
bool Lowerer::RecomputeCost(const Group& grp, ValueId v, Level level, int depth,
                            RecomputeCount* count) const {
  if (depth > kMaxRecomputeDepth) return false;
  if (auto in = grp.value_of.find(v); in != grp.value_of.end()) return true;
  const ir::TensorMeta& m = g_.value(v).meta;
  auto loaded = [&] {
    if (!SameSizes(m.sizes, grp.full)) return true;  // a broadcast operand: small
    ValueId root = v;
    if (auto a = alias_.find(v); a != alias_.end()) root = a->second.root;
    if (!grp.buffer_index.count(g_.value(root).name) &&
        std::find(count->loads.begin(), count->loads.end(), root) == count->loads.end()) {
      count->loads.push_back(root);
    }
    return true;
  };
  auto made = group_of_.find(v);
  if (made == group_of_.end() || &groups_[made->second] == &grp) return loaded();
  const int p = g_.value(v).producer;
  if (p < 0 || g_.nodes()[p].outputs.size() != 1 || !PointwiseRules().count(g_.nodes()[p].target)) {
    return loaded();
  }
  absl::StatusOr<Level> have = Classify(grp, m.sizes);
  if (!have.ok() || !(*have == level || (level == Level::kFull && *have == Level::kRowKeep))) {
    return false;
  }
  ++count->nodes;
  for (ValueId u : ir::Graph::Operands(g_.nodes()[p])) {
    if (u != ir::kNoValue && !RecomputeCost(grp, u, *have, depth + 1, count)) return false;
  }
  return true;
}

absl::StatusOr<std::optional<int>> Lowerer::Recompute(Group& grp, ValueId v, Level level) {
  auto made = group_of_.find(v);
  if (made == group_of_.end() || &groups_[made->second] == &grp) return std::nullopt;
  const int p = g_.value(v).producer;
  if (p < 0) return std::nullopt;
  const ir::Node& node = g_.nodes()[p];
  auto rule = PointwiseRules().find(node.target);
  if (rule == PointwiseRules().end() || node.outputs.size() != 1) return std::nullopt;
  RecomputeCount count;
  if (!RecomputeCost(grp, v, level, 0, &count) || count.nodes > kMaxRecomputeNodes ||
      static_cast<int>(count.loads.size()) > kMaxRecomputeLoads) {
    return std::nullopt;
  }
  const ir::TensorMeta& m = g_.value(v).meta;
  ASSIGN_OR_RETURN(Level have, Classify(grp, m.sizes));
  auto meta_of = [this](ValueId u) -> const ir::TensorMeta& { return g_.value(u).meta; };
  ASSIGN_OR_RETURN(ops::OpCall call,
                   ops::OpCall::Bind(node.target, node.args, node.kwargs, meta_of));
  call.set_node_name(node.name);
  const size_t mark = grp.vals.size(), bmark = grp.buffers.size(), rmark = recomputed_.size();
  Builder b(
      this, grp, have, m.sizes, [&](ValueId u) { return Operand(grp, u, have, m.sizes); }, call);
  absl::StatusOr<int> result = rule->second(b, call, m.dtype);
  if (!result.ok()) {
    grp.vals.resize(mark);
    for (size_t k = bmark; k < grp.buffers.size(); ++k)
      grp.buffer_index.erase(grp.buffers[k].value);
    grp.buffers.resize(bmark);
    ForgetRecomputed(rmark);
    if (!absl::IsFailedPrecondition(result.status())) return result.status();
    return std::nullopt;
  }
  grp.value_of[v] = *result;
  grp.level_of[v] = have;
  recomputed_.emplace_back(&grp - groups_.data(), v);
  decisions_.push_back(absl::StrCat("recompute: ", node.name, " (", node.target, ") in kernel_",
                                    &grp - groups_.data(), " rather than read from kernel_",
                                    made->second));
  return *result;
}

void Lowerer::ForgetRecomputed(size_t mark) {
  for (size_t k = mark; k < recomputed_.size(); ++k) {
    Group& grp = groups_[recomputed_[k].first];
    grp.value_of.erase(recomputed_[k].second);
    grp.level_of.erase(recomputed_[k].second);
  }
  recomputed_.resize(std::min(mark, recomputed_.size()));
}

std::optional<Lowerer::ReshapeUndo> Lowerer::ReshapeFor(Group& grp, int node_index,
                                                        const SymSizes& to) {
  // The node must read an order-preserving view, of shape `to`, of a value
  // of this kernel.
  bool reads_view = false;
  for (ValueId v : ir::Graph::Operands(g_.nodes()[node_index])) {
    auto r = reshape_of_.find(v);
    reads_view = reads_view || (r != reshape_of_.end() && grp.value_of.count(r->second) &&
                                SameSizes(g_.value(v).meta.sizes, to));
  }
  if (!reads_view || !grp.reduced.empty() || !grp.keep_in_output.empty()) return std::nullopt;
  for (const auto& [v, level] : grp.level_of) {
    if (level != Level::kFull) return std::nullopt;
  }
  // Every load and every value (it may be stored) must map onto `to`.
  std::vector<std::pair<int, SymSizes>> overs;
  for (size_t i = 0; i < grp.vals.size(); ++i) {
    if (grp.vals[i].kind != StmtKind::kLoad) continue;
    auto over = Restride(grp.full, grp.vals[i].over, to);
    if (!over) return std::nullopt;
    overs.emplace_back(static_cast<int>(i), *std::move(over));
  }
  std::map<ValueId, SymSizes> strides;
  for (const auto& [v, id] : grp.value_of) {
    auto st = Restride(grp.full, StridesIn(grp, v), to);
    if (!st) return std::nullopt;
    strides[v] = *std::move(st);
  }
  ReshapeUndo undo{grp.full, {}, std::move(grp.strides_of)};
  for (auto& [i, over] : overs) {
    undo.overs.emplace_back(i, std::move(grp.vals[i].over));
    grp.vals[i].over = std::move(over);
  }
  grp.strides_of = std::move(strides);
  grp.full = to;
  return undo;
}

// ---------------------------------------------------------------------------
// Scheduling

absl::StatusOr<bool> Lowerer::TryPointwise(int node_index) {
  const ir::Node& node = g_.nodes()[node_index];
  auto rule = PointwiseRules().find(node.target);
  if (rule == PointwiseRules().end() || node.outputs.size() != 1) return false;
  const ir::TensorMeta& out = g_.value(node.outputs[0]).meta;
  if (!Supported(out.dtype)) return false;
  auto meta_of = [this](ValueId v) -> const ir::TensorMeta& { return g_.value(v).meta; };
  ASSIGN_OR_RETURN(ops::OpCall call,
                   ops::OpCall::Bind(node.target, node.args, node.kwargs, meta_of));
  call.set_node_name(node.name);

  // Try the open kernels, newest first; the first legal one wins.
  std::string refusal;
  for (int gi = static_cast<int>(groups_.size()) - 1; gi >= 0; --gi) {
    Group& grp = groups_[gi];
    if (!grp.open) continue;
    auto level = Classify(grp, out.sizes);
    std::optional<ReshapeUndo> reshaped;
    if (!level.ok()) {
      reshaped = ReshapeFor(grp, node_index, out.sizes);
      if (reshaped) level = Level::kFull;
    }
    if (!level.ok()) {
      if (refusal.empty()) refusal = absl::StrCat("kernel_", gi, ": ", level.status().message());
      continue;
    }
    const size_t mark = grp.vals.size();
    const size_t buffers_mark = grp.buffers.size();
    const size_t recomputed_mark = recomputed_.size();
    Builder b(
        this, grp, *level, out.sizes, [&](ValueId v) { return Operand(grp, v, *level, out.sizes); },
        call);
    auto result = rule->second(b, call, out.dtype);
    if (!result.ok()) {
      if (refusal.empty()) refusal = absl::StrCat("kernel_", gi, ": ", result.status().message());
      grp.vals.resize(mark);  // undo
      for (size_t k = buffers_mark; k < grp.buffers.size(); ++k) {
        grp.buffer_index.erase(grp.buffers[k].value);
      }
      grp.buffers.resize(buffers_mark);
      ForgetRecomputed(recomputed_mark);
      if (reshaped) Undo(grp, *std::move(reshaped));
      if (!absl::IsFailedPrecondition(result.status())) return result.status();
      continue;
    }
    if (reshaped) decisions_.push_back(ReshapeDecision(gi, reshaped->full, grp.full));
    const ValueId v = node.outputs[0];
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
  Group grp;
  grp.item = static_cast<int>(items_.size());
  grp.full = out.sizes;
  groups_.push_back(std::move(grp));
  const int gi = static_cast<int>(groups_.size()) - 1;
  items_.push_back(Item{Item::kGroup, gi, -1});
  Group& fresh = groups_[gi];
  Builder b(
      this, fresh, Level::kFull, out.sizes,
      [&](ValueId v) { return Operand(fresh, v, Level::kFull, out.sizes); }, call);
  auto result = rule->second(b, call, out.dtype);
  if (!result.ok()) {
    // Not lowerable after all (an operand dtype, a rank): run it through ATen.
    groups_.pop_back();
    items_.pop_back();
    if (!absl::IsFailedPrecondition(result.status())) return result.status();
    decisions_.push_back(
        absl::StrCat("extern: ", node.name, " (", node.target, "): ", result.status().message()));
    return false;
  }
  const ValueId v = node.outputs[0];
  fresh.value_of[v] = *result;
  fresh.level_of[v] = Level::kFull;
  fresh.nodes.push_back(node.name);
  group_of_[v] = gi;
  producer_item_[v] = fresh.item;
  decisions_.push_back(absl::StrCat("new kernel_", gi, ": ", node.name, " (", node.target, ")",
                                    refusal.empty() ? "" : absl::StrCat("; not fused: ", refusal)));
  return true;
}

absl::StatusOr<bool> Lowerer::TryReduction(int node_index) {
  const ir::Node& node = g_.nodes()[node_index];
  static const std::set<std::string> kReductions = {"aten.sum.dim_IntList",
                                                    "aten.sum.default",
                                                    "aten.mean.dim",
                                                    "aten.mean.default",
                                                    "aten.amax.default",
                                                    "aten.amin.default",
                                                    "aten.var.correction",
                                                    "aten._softmax.default",
                                                    "aten._log_softmax.default",
                                                    "aten.native_layer_norm.default"};
  if (!kReductions.count(node.target)) return false;
  auto meta_of = [this](ValueId v) -> const ir::TensorMeta& { return g_.value(v).meta; };
  ASSIGN_OR_RETURN(ops::OpCall call,
                   ops::OpCall::Bind(node.target, node.args, node.kwargs, meta_of));
  call.set_node_name(node.name);
  ASSIGN_OR_RETURN(ValueId input,
                   call.Tensor(node.target == "aten.native_layer_norm.default" ? "input" : "self"));
  const ir::TensorMeta& in = g_.value(input).meta;
  const int rank = static_cast<int>(in.sizes.size());
  if (rank == 0 || !Supported(in.dtype) || ops::IsFloating(in.dtype) == false) return false;
  for (ValueId o : node.outputs) {
    if (!Supported(g_.value(o).meta.dtype)) return false;
  }

  ReductionSpec spec;
  auto all_dims = [&] {
    std::vector<int> d(rank);
    for (int i = 0; i < rank; ++i) d[i] = i;
    return d;
  };
  if (node.target == "aten.sum.default" || node.target == "aten.mean.default") {
    spec.dims = all_dims();
  } else if (node.target == "aten._softmax.default" || node.target == "aten._log_softmax.default") {
    ASSIGN_OR_RETURN(int64_t d, call.Int("dim"));
    ASSIGN_OR_RETURN(int64_t w, ops::WrapDim(d, rank));
    spec.dims = {static_cast<int>(w)};
  } else if (node.target == "aten.native_layer_norm.default") {
    ASSIGN_OR_RETURN(std::vector<ir::SymInt> shape, call.SymInts("normalized_shape"));
    for (int i = rank - static_cast<int>(shape.size()); i < rank; ++i) spec.dims.push_back(i);
  } else {
    const ir::Argument* dim = call.Find("dim");
    std::vector<int64_t> dims;
    if (dim != nullptr && !std::holds_alternative<ir::None>(dim->kind)) {
      ASSIGN_OR_RETURN(dims, call.Ints("dim"));
    }
    if (dims.empty()) {
      spec.dims = all_dims();
    } else {
      for (int64_t d : dims) {
        ASSIGN_OR_RETURN(int64_t w, ops::WrapDim(d, rank));
        spec.dims.push_back(static_cast<int>(w));
      }
      std::sort(spec.dims.begin(), spec.dims.end());
      spec.dims.erase(std::unique(spec.dims.begin(), spec.dims.end()), spec.dims.end());
    }
    if (call.Find("keepdim") != nullptr) {
      ASSIGN_OR_RETURN(spec.keepdim, call.Bool("keepdim"));
    }
  }
  if (node.target == "aten.sum.dim_IntList" && !call.IsNone("dtype")) return false;

  // Join an open kernel over the same space, or open one.
  std::string refusal;
  int gi = -1;
  for (int k = static_cast<int>(groups_.size()) - 1; k >= 0; --k) {
    Group& grp = groups_[k];
    if (!grp.open) continue;
    std::optional<ReshapeUndo> reshaped;
    if (!SameSizes(grp.full, in.sizes)) {
      reshaped = ReshapeFor(grp, node_index, in.sizes);
      if (!reshaped) {
        if (refusal.empty())
          refusal = absl::StrCat("kernel_", k, ": its space [", ops::SizesToString(grp.full),
                                 "] differs");
        continue;
      }
    }
    if (!grp.reduced.empty() && grp.reduced != spec.dims) {
      if (refusal.empty()) refusal = absl::StrCat("kernel_", k, ": it reduces other dimensions");
      continue;
    }
    bool rows = false;
    for (const auto& [v, l] : grp.level_of) rows = rows || l != Level::kFull;
    if (grp.reduced.empty() && rows) continue;
    // The input must be readable here.
    const std::vector<int> saved_reduced = grp.reduced;
    grp.reduced = spec.dims;  // pointwise kernels take the reduction's loop order
    const size_t mark = grp.vals.size(), bmark = grp.buffers.size(), rmark = recomputed_.size();
    auto probe = Operand(grp, input, Level::kFull, in.sizes);
    ForgetRecomputed(rmark);
    grp.vals.resize(mark);
    for (size_t j = bmark; j < grp.buffers.size(); ++j)
      grp.buffer_index.erase(grp.buffers[j].value);
    grp.buffers.resize(bmark);
    if (!probe.ok()) {
      grp.reduced = saved_reduced;
      if (reshaped) Undo(grp, *std::move(reshaped));
      if (refusal.empty()) refusal = absl::StrCat("kernel_", k, ": ", probe.status().message());
      continue;
    }
    if (reshaped) decisions_.push_back(ReshapeDecision(k, reshaped->full, grp.full));
    gi = k;
    break;
  }
  const bool fresh = gi < 0;
  if (fresh) {
    Group grp;
    grp.item = static_cast<int>(items_.size());
    grp.full = in.sizes;
    grp.reduced = spec.dims;
    groups_.push_back(std::move(grp));
    gi = static_cast<int>(groups_.size()) - 1;
    items_.push_back(Item{Item::kGroup, gi, -1});
  }
  Group& grp = groups_[gi];
  const Level row = spec.keepdim ? Level::kRowKeep : Level::kRowFlat;
  const v1::DType out_t = g_.value(node.outputs[0]).meta.dtype;
  const v1::DType ct = Compute(out_t);
  // Values of this reduction, built with the pointwise helpers.
  auto make = [&](Level level) {
    return Builder(
        this, grp, level, in.sizes,
        [&, level](ValueId v) {
          return Operand(grp, v, level, level == Level::kFull ? in.sizes : g_.value(v).meta.sizes);
        },
        call);
  };
  auto reduce = [&](int x, ReduceOp op, Level level) {
    GVal v;
    v.kind = StmtKind::kReduce;
    v.reduce = op;
    v.args = {x};
    v.dtype = grp.vals[x].dtype;
    v.level = level;
    return Add(grp, std::move(v));
  };
  auto load_input = [&]() -> absl::StatusOr<int> {
    return Operand(grp, input, Level::kFull, in.sizes);
  };
  auto finish = [&](std::vector<std::pair<ValueId, std::pair<int, Level>>> outs) {
    for (auto& [v, id_level] : outs) {
      grp.value_of[v] = id_level.first;
      grp.level_of[v] = id_level.second;
      group_of_[v] = gi;
      producer_item_[v] = grp.item;
    }
    grp.nodes.push_back(node.name);
    decisions_.push_back(
        fresh ? absl::StrCat("new kernel_", gi, ": ", node.name, " (", node.target, ")",
                             refusal.empty() ? "" : absl::StrCat("; not fused: ", refusal))
              : absl::StrCat("fuse: ", node.name, " (", node.target, ") into kernel_", gi,
                             " (reduction)"));
  };

  ASSIGN_OR_RETURN(int x, load_input());
  Builder full = make(Level::kFull);
  // The number of elements each row reduces: a constant when the reduced
  // sizes are, else counted by a reduction (symbolic sizes).
  auto count = [&](Builder& r, Level level) {
    ir::SymInt n{int64_t{1}};
    for (int d : spec.dims) n = ops::SymMul(n, in.sizes[d]);
    if (n.is_constant()) return r.C(static_cast<double>(n.constant()), ct);
    return reduce(full.C(1, ct), ReduceOp::kSum, level);
  };
  x = full.Cast(x, Compute(in.dtype));
  // Each row's mean and sum of squared deviations from it (M2), the second
  // reduced at `level`.
  auto moments = [&](Level level) -> std::pair<int, int> {
    if (!TwoPassMoments(in, spec.dims)) {
      return {reduce(x, ReduceOp::kWelfordMean, level), reduce(x, ReduceOp::kWelfordM2, level)};
    }
    const v1::DType xt = Compute(in.dtype);
    Builder keep = make(Level::kRowKeep);
    const int sum = reduce(x, ReduceOp::kSum, Level::kRowKeep);
    const int mean = keep.Op(ScalarOp::kDiv, {sum, count(keep, Level::kRowKeep)}, xt);
    const int dev = full.Op(ScalarOp::kSub, {x, mean}, xt);
    return {mean, reduce(full.Op(ScalarOp::kMul, {dev, dev}, xt), ReduceOp::kSum, level)};
  };
  if (node.target == "aten.sum.dim_IntList" || node.target == "aten.sum.default") {
    finish({{node.outputs[0], {reduce(full.Cast(x, ct), ReduceOp::kSum, row), row}}});
  } else if (node.target == "aten.amax.default" || node.target == "aten.amin.default") {
    finish({{node.outputs[0],
             {reduce(x, node.target == "aten.amax.default" ? ReduceOp::kMax : ReduceOp::kMin, row),
              row}}});
  } else if (node.target == "aten.mean.dim" || node.target == "aten.mean.default") {
    // sum / n, as ATen computes it (a row with an inf has an inf mean; a
    // Welford update would make it NaN).
    Builder r = make(row);
    const int sum = reduce(full.Cast(x, ct), ReduceOp::kSum, row);
    finish({{node.outputs[0], {r.Op(ScalarOp::kDiv, {sum, count(r, row)}, ct), row}}});
  } else if (node.target == "aten.var.correction") {
    double correction = 1;
    if (!call.IsNone("correction")) {
      ASSIGN_OR_RETURN(correction, call.Double("correction"));
    }
    int m2 = moments(row).second;
    Builder r = make(row);
    int n = count(r, row);
    int denom =
        r.Op(ScalarOp::kMax, {r.Op(ScalarOp::kSub, {n, r.C(correction, ct)}, ct), r.C(0, ct)}, ct);
    finish({{node.outputs[0], {r.Op(ScalarOp::kDiv, {m2, denom}, ct), row}}});
  } else if (node.target == "aten._softmax.default" || node.target == "aten._log_softmax.default") {
    // Rows are kept as size-1 dims: the results broadcast back over them.
    int mx = reduce(x, ReduceOp::kMax, Level::kRowKeep);
    int shifted = full.Op(ScalarOp::kSub, {x, mx}, Compute(in.dtype));
    int e = full.Op(ScalarOp::kExp, {shifted}, Compute(in.dtype));
    int s = reduce(e, ReduceOp::kSum, Level::kRowKeep);
    int out;
    if (node.target == "aten._softmax.default") {
      out = full.Op(ScalarOp::kDiv, {e, s}, Compute(in.dtype));
      if (Compute(in.dtype) == out_t) grp.keep_in_output.push_back({e, out, node.outputs[0]});
    } else {
      Builder r = make(Level::kRowKeep);
      out = full.Op(ScalarOp::kSub, {shifted, r.Op(ScalarOp::kLog, {s}, Compute(in.dtype))},
                    Compute(in.dtype));
    }
    finish({{node.outputs[0], {full.Cast(out, ct), Level::kFull}}});
  } else {  // native_layer_norm
    ASSIGN_OR_RETURN(double eps, call.Double("eps"));
    const v1::DType st = Compute(g_.value(node.outputs[1]).meta.dtype);
    const auto [mean, m2] = moments(Level::kRowKeep);
    Builder r = make(Level::kRowKeep);
    int n = count(r, Level::kRowKeep);
    int rstd =
        r.Op(ScalarOp::kRsqrt,
             {r.Op(ScalarOp::kAdd, {r.Op(ScalarOp::kDiv, {m2, n}, ct), r.C(eps, ct)}, ct)}, ct);
    int y = full.Op(ScalarOp::kMul, {full.Op(ScalarOp::kSub, {x, mean}, ct), rstd}, ct);
    if (!call.IsNone("weight")) {
      ASSIGN_OR_RETURN(int w, full.T("weight"));
      y = full.Ar(ScalarOp::kMul, {y, w}, out_t);
    }
    if (!call.IsNone("bias")) {
      ASSIGN_OR_RETURN(int b, full.T("bias"));
      y = full.Ar(ScalarOp::kAdd, {y, b}, out_t);
    }
    // mean and rstd: one value per row, [.., 1] in the graph. (Shaped like
    // the whole space when the normalized dims have size 1: rows all the
    // same, kept as size-1 dims.)
    ASSIGN_OR_RETURN(Level ml, Classify(grp, g_.value(node.outputs[1]).meta.sizes));
    if (ml == Level::kFull) ml = Level::kRowKeep;
    finish({{node.outputs[0], {y, Level::kFull}},
            {node.outputs[1], {r.Cast(mean, st), ml}},
            {node.outputs[2], {r.Cast(rstd, st), ml}}});
  }
  return true;
}

}  // namespace kiln::loop::lowering_internal
