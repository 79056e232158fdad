// Pass "fuse" (fuse.h): what a kernel may read (the legality of joining
// it), a node's values built in the kernel it joins, recomputation, and the
// reshape of a kernel into the shape of a view of a value it computes.
#include <algorithm>
#include <functional>
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
#include "compiler/loop/fuse_internal.h"
#include "compiler/ops/shape_util.h"

namespace kiln::loop::fuse_internal {
namespace {

bool SameSizes(const SymSizes& a, const SymSizes& b) { return a == b; }

// Whether a tensor of sizes `a` has fewer elements than one of `b` (both
// constant; symbolic sizes count as as many).
bool FewerElements(const SymSizes& a, const SymSizes& b) {
  int64_t na = 1, nb = 1;
  for (const SymInt& s : a) {
    if (!s.is_constant()) return false;
    na *= s.constant();
  }
  for (const SymInt& s : b) {
    if (!s.is_constant()) return false;
    nb *= s.constant();
  }
  return na < nb;
}

// Whether a row's mean and variance are computed in two sweeps
// (FusionPolicy::two_pass_max_row).
bool TwoPassMoments(const ir::TensorMeta& in, const std::vector<int>& dims, int64_t max_row) {
  const int rank = static_cast<int>(in.sizes.size());
  if (dims.empty() || in.strides.size() != in.sizes.size()) return false;
  int64_t n = 1;
  for (size_t k = 0; k < dims.size(); ++k) {
    const int d = rank - static_cast<int>(dims.size()) + static_cast<int>(k);
    if (dims[k] != d || !in.sizes[d].is_constant() || !in.strides[d].is_constant()) return false;
    if (in.sizes[d].constant() > 1 && in.strides[d].constant() != n) return false;
    n *= in.sizes[d].constant();
  }
  return n <= max_row;
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

}  // namespace

// ---------------------------------------------------------------------------
// Iteration spaces

absl::StatusOr<Level> Fuser::Classify(const Group& grp, const SymSizes& sizes) const {
  if (SameSizes(sizes, grp.full)) return Level::kFull;
  if (grp.reduced.empty()) {
    return absl::FailedPreconditionError(absl::StrCat("its shape ", ops::SizesToString(sizes),
                                                      " is not the kernel's ",
                                                      ops::SizesToString(grp.full)));
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
      absl::StrCat("its shape ", ops::SizesToString(sizes), " is neither the kernel's ",
                   ops::SizesToString(grp.full), " nor one value per row"));
}

int Fuser::BufferOf(Group& grp, ValueId root, bool written) {
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

void Fuser::MarkStored(ValueId v) {
  auto it = group_of_.find(v);
  if (it != group_of_.end() && groups_[it->second].stored.insert(v).second) {
    stored_log_.emplace_back(it->second, v);
  }
}

absl::Status Fuser::Legal(const Group& grp, int node_index, Level level,
                          const SymSizes& out) const {
  for (ValueId v : ir::Graph::Operands(g_.nodes()[node_index])) {
    if (v == ir::kNoValue) continue;
    RETURN_IF_ERROR(Readable(grp, v, level, out));
  }
  return absl::OkStatus();
}

// The checks of Operand, without building anything. A value the policy
// lets the kernel recompute counts as readable: should building it fail
// after all, the node's values are rolled back and the kernel refused.
absl::Status Fuser::Readable(const Group& grp, ValueId v, Level level, const SymSizes& out) const {
  const ir::TensorMeta& m = g_.value(v).meta;
  if (!SupportedDType(m.dtype)) {
    return absl::FailedPreconditionError(
        absl::StrCat("'", g_.value(v).name, "' has dtype ", v1::DType_Name(m.dtype)));
  }
  if (auto in = grp.level_of.find(v); in != grp.level_of.end()) {
    if (in->second == level || (level == Level::kFull && in->second == Level::kRowKeep)) {
      return absl::OkStatus();
    }
    return absl::FailedPreconditionError(absl::StrCat(
        "'", g_.value(v).name, "' varies differently in this kernel than its reader needs"));
  }
  const bool whole = level == Level::kFull && m.sizes == grp.full;
  if (auto r = reshape_of_.find(v); r != reshape_of_.end() && whole) {
    auto base = grp.level_of.find(r->second);
    if (base != grp.level_of.end() && base->second == Level::kFull) return absl::OkStatus();
  }
  if (const int p = g_.value(v).producer;
      whole && p >= 0 && g_.nodes()[p].target == "aten.expand.default") {
    auto base = grp.level_of.find(ir::Graph::Operands(g_.nodes()[p])[0]);
    if (base != grp.level_of.end() && base->second != Level::kRowFlat) return absl::OkStatus();
  }
  if (WorthRecomputing(grp, v, level)) return absl::OkStatus();
  ValueId root = v;
  if (auto a = alias_.find(v); a != alias_.end()) root = a->second.root;
  return MemoryReadable(grp, v, root, out);
}

// Produced before this kernel, not written by it, and indexable by the
// reader's output dims (right-aligned broadcasting).
absl::Status Fuser::MemoryReadable(const Group& grp, ValueId v, ValueId root,
                                   const SymSizes& out) const {
  const ir::TensorMeta& m = g_.value(v).meta;
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
  if (m.sizes.size() > out.size()) {
    return absl::FailedPreconditionError(
        absl::StrCat("'", g_.value(v).name, "' has a higher rank"));
  }
  const size_t lead = out.size() - m.sizes.size();
  for (size_t j = 0; j < m.sizes.size(); ++j) {
    if (ops::IsConstant(m.sizes[j], 1) && !ops::IsConstant(out[lead + j], 1)) continue;
    // A size the graph only assumed equal to the kernel's (a symbol
    // broadcast against a constant): the kernel would index past the value
    // when they differ. Such a node runs through ATen, which checks.
    if (!(m.sizes[j] == out[lead + j])) {
      return absl::FailedPreconditionError(absl::StrCat(
          "'", g_.value(v).name, "' has size ", m.sizes[j].ToString(), " at dim ", j,
          " where the kernel has ", out[lead + j].ToString(), " (equal only by assumption)"));
    }
  }
  return absl::OkStatus();
}

void Fuser::Rollback(Group& grp, const Mark& mark) {
  grp.vals.resize(mark.vals);
  for (size_t k = mark.buffers; k < grp.buffers.size(); ++k) {
    grp.buffer_index.erase(grp.buffers[k].value);
  }
  grp.buffers.resize(mark.buffers);
  ForgetRecomputed(mark.recomputed);
  for (size_t k = mark.stored; k < stored_log_.size(); ++k) {
    groups_[stored_log_[k].first].stored.erase(stored_log_[k].second);
  }
  stored_log_.resize(std::min(mark.stored, stored_log_.size()));
}

absl::StatusOr<int> Fuser::Operand(Group& grp, ValueId v, Level level, const SymSizes& out) {
  const ir::TensorMeta& m = g_.value(v).meta;
  if (!SupportedDType(m.dtype)) {
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
  // Read from memory.
  ValueId root = v;
  SymInt offset{int64_t{0}};
  if (auto a = alias_.find(v); a != alias_.end()) {
    root = a->second.root;
    offset = a->second.offset;
  }
  RETURN_IF_ERROR(MemoryReadable(grp, v, root, out));
  std::vector<SymInt> over(out.size(), SymInt{int64_t{0}});
  const size_t lead = out.size() - m.sizes.size();
  for (size_t j = 0; j < m.sizes.size(); ++j) {
    const bool broadcast = ops::IsConstant(m.sizes[j], 1) && !ops::IsConstant(out[lead + j], 1);
    if (!broadcast) over[lead + j] = m.strides[j];
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

bool Fuser::SinglePointwise(int node) const {
  return node >= 0 && g_.nodes()[node].outputs.size() == 1 &&
         (PointwiseRules().count(g_.nodes()[node].target) > 0 ||
          nodes_[node].kind == NodeKind::kGather);
}

std::optional<Level> Fuser::RecomputeLevel(const Group& grp, const SymSizes& sizes,
                                           Level level) const {
  if (absl::StatusOr<Level> have = Classify(grp, sizes);
      have.ok() && (*have == level || (level == Level::kFull && *have == Level::kRowKeep))) {
    return *have;
  }
  // A smaller value that broadcasts over the kernel's space, and is not one
  // value per row of it: computed for each element, as its reader reads it
  // (a norm's rsqrt of the saved mean under the weight's sum over the
  // rows). Its own kernel then need not store it.
  if (level != Level::kFull || sizes.size() > grp.full.size()) {
    return std::nullopt;
  }
  const size_t lead = grp.full.size() - sizes.size();
  for (size_t j = 0; j < sizes.size(); ++j) {
    if (!ops::IsConstant(sizes[j], 1) && !(sizes[j] == grp.full[lead + j])) return std::nullopt;
  }
  return Level::kFull;
}

void Fuser::BroadcastsToRows(Group& grp) const {
  if (grp.reduced.empty()) return;
  // Whether GVal `id` varies over none of the reduced dims: a load whose
  // strides there are 0, a constant, or an op over such values.
  std::map<int, bool> memo;
  std::function<bool(int)> per_row = [&](int id) {
    if (auto m = memo.find(id); m != memo.end()) return m->second;
    const GVal& v = grp.vals[id];
    bool ok = v.level == Level::kRowKeep;
    if (v.level == Level::kFull &&
        (v.kind == StmtKind::kLoad || v.kind == StmtKind::kGather || v.kind == StmtKind::kIndex)) {
      ok = true;
      for (int d : grp.reduced) {
        ok = ok && (static_cast<size_t>(d) >= v.over.size() || ops::IsConstant(v.over[d], 0));
      }
      for (int a : v.args) ok = ok && per_row(a);
    } else if (v.level == Level::kFull && v.kind != StmtKind::kReduce) {
      ok = true;
      for (int a : v.args) ok = ok && per_row(a);
    }
    memo[id] = ok;
    return ok;
  };
  std::function<void(int)> relabel = [&](int id) {
    GVal& v = grp.vals[id];
    if (v.level == Level::kRowKeep) return;
    v.level = Level::kRowKeep;
    for (int a : v.args) relabel(a);
  };
  for (auto& [value, level] : grp.level_of) {
    if (level != Level::kFull) continue;
    absl::StatusOr<Level> row = Classify(grp, g_.value(value).meta.sizes);
    if (!row.ok() || *row != Level::kRowKeep) continue;
    const int id = grp.value_of.at(value);
    if (!per_row(id)) continue;
    relabel(id);
    level = Level::kRowKeep;
  }
}

// What computing `v` again in `grp` takes: the nodes, and the whole-space
// tensors it reads that `grp` does not read yet. False when `v` is not
// recomputable there: made by something other than a single-output
// pointwise node of another kernel, at a level the kernel cannot hold, or
// deeper than kMaxRecomputeDepth.
bool Fuser::RecomputeCost(const Group& grp, ValueId v, Level level, int depth,
                          RecomputeCount* count) const {
  if (depth > kMaxRecomputeDepth) return false;
  if (auto in = grp.value_of.find(v); in != grp.value_of.end()) return true;
  const ir::TensorMeta& m = g_.value(v).meta;
  auto loaded = [&] {
    if (!SameSizes(m.sizes, grp.full)) return true;  // a broadcast operand: small
    ValueId root = v;
    if (auto a = alias_.find(v); a != alias_.end()) root = a->second.root;
    // A broadcast view (expand) of a smaller tensor: small too.
    if (FewerElements(g_.value(root).meta.sizes, grp.full)) return true;
    if (!grp.buffer_index.count(g_.value(root).name) &&
        std::find(count->loads.begin(), count->loads.end(), root) == count->loads.end()) {
      count->loads.push_back(root);
    }
    return true;
  };
  auto made = group_of_.find(v);
  if (made == group_of_.end() || &groups_[made->second] == &grp) return loaded();
  const int p = g_.value(v).producer;
  const bool pointwise = SinglePointwise(p);
  // A value its kernel computes per row (a reduction, or what follows one):
  // computing on it here would sweep the rows twice, once in each kernel
  // (a norm's input gradient belongs with its row sums). As the broadcast
  // operand of a recomputed value it is read from memory where it is there
  // anyway (a batch norm's statistics, saved for the backward), or computed
  // again from what is (their rsqrt).
  if (const auto& of = groups_[made->second].level_of; of.count(v) && of.at(v) != Level::kFull) {
    if (depth == 0 || SameSizes(m.sizes, grp.full)) return false;
    if (groups_[made->second].stored.count(v) > 0 ||
        std::find(g_.outputs().begin(), g_.outputs().end(), v) != g_.outputs().end()) {
      return loaded();
    }
    if (!pointwise) return false;
  }
  if (!pointwise) return loaded();
  const std::optional<Level> have = RecomputeLevel(grp, m.sizes, level);
  if (!have) {
    // An operand of a recomputed value that this kernel cannot compute at
    // its level (a batch norm's per-channel statistics under a kernel that
    // reduces other dims) is read from memory, as any broadcast operand.
    if (depth > 0 && !SameSizes(m.sizes, grp.full)) return loaded();
    return false;
  }
  if (std::find(count->counted.begin(), count->counted.end(), v) != count->counted.end()) {
    return true;
  }
  const RecomputeCount before = *count;
  count->counted.push_back(v);
  ++count->nodes;
  // A gather reads its source from memory, where it must be before this
  // kernel; its indices are operands as any.
  std::vector<ValueId> operands = ir::Graph::Operands(g_.nodes()[p]);
  if (nodes_[p].kind == NodeKind::kGather) {
    const GatherSpec& spec = nodes_[p].gather;
    if (*have != Level::kFull) return false;
    ValueId root = spec.source;
    if (auto a = alias_.find(root); a != alias_.end()) root = a->second.root;
    if (ProducerItem(spec.source) >= grp.item || ProducerItem(root) >= grp.item) return false;
    operands = spec.indices;
  }
  for (ValueId u : operands) {
    if (u != ir::kNoValue && !RecomputeCost(grp, u, *have, depth + 1, count)) {
      // A broadcast operand that cannot be computed here after all is read
      // from memory, as above.
      if (depth == 0 || SameSizes(m.sizes, grp.full)) return false;
      *count = before;
      return loaded();
    }
  }
  return true;
}

bool Fuser::WorthRecomputing(const Group& grp, ValueId v, Level level) const {
  if (!policy_.fuse) return false;
  auto made = group_of_.find(v);
  if (made == group_of_.end() || &groups_[made->second] == &grp) return false;
  const int p = g_.value(v).producer;
  if (!SinglePointwise(p)) return false;
  RecomputeCount count;
  return RecomputeCost(grp, v, level, 0, &count) && count.nodes <= policy_.max_recompute_nodes &&
         static_cast<int>(count.loads.size()) <= policy_.max_recompute_loads;
}

absl::StatusOr<std::optional<int>> Fuser::Recompute(Group& grp, ValueId v, Level level) {
  if (!WorthRecomputing(grp, v, level)) return std::nullopt;
  const int made = group_of_.at(v);
  const int p = g_.value(v).producer;
  const ir::Node& node = g_.nodes()[p];
  if (nodes_[p].kind == NodeKind::kGather) return RecomputeGather(grp, v, level);
  const PointwiseRule& rule = PointwiseRules().at(node.target);
  // A pointwise node that a kernel computes was lowered with its call.
  const ops::OpCall& call = *nodes_[p].call;
  const ir::TensorMeta& m = g_.value(v).meta;
  const std::optional<Level> level_here = RecomputeLevel(grp, m.sizes, level);
  if (!level_here) return std::nullopt;
  const Level have = *level_here;
  // A broadcast value computed for each element reads its operands as
  // broadcasts over the kernel's space.
  const SymSizes& space = have == Level::kFull ? grp.full : m.sizes;
  const Mark mark = MarkOf(grp);
  Builder b(
      grp, have, [&](ValueId u) { return Operand(grp, u, have, space); }, call,
      have == Level::kFull ? space : SymSizes{});
  absl::StatusOr<int> result = rule(b, call, m.dtype);
  if (!result.ok()) {
    Rollback(grp, mark);
    if (!absl::IsFailedPrecondition(result.status())) return result.status();
    return std::nullopt;
  }
  grp.value_of[v] = *result;
  grp.level_of[v] = have;
  recomputed_.emplace_back(&grp - groups_.data(), v);
  decisions_.push_back(absl::StrCat("recompute: ", node.name, " (", node.target, ") in kernel_",
                                    &grp - groups_.data(), " rather than read from kernel_", made));
  return *result;
}

void Fuser::ForgetRecomputed(size_t mark) {
  for (size_t k = mark; k < recomputed_.size(); ++k) {
    Group& grp = groups_[recomputed_[k].first];
    grp.value_of.erase(recomputed_[k].second);
    grp.level_of.erase(recomputed_[k].second);
  }
  recomputed_.resize(std::min(mark, recomputed_.size()));
}

std::optional<Fuser::ReshapeUndo> Fuser::ReshapeFor(Group& grp, int node_index,
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
  // A gather's index strides are its source's, not the kernel's space's.
  for (const GVal& v : grp.vals) {
    if (v.kind == StmtKind::kGather) return std::nullopt;
  }
  for (const auto& [v, level] : grp.level_of) {
    if (level != Level::kFull) return std::nullopt;
  }
  // Every load and every value (it may be stored) must map onto `to`.
  std::vector<std::pair<int, SymSizes>> overs;
  for (size_t i = 0; i < grp.vals.size(); ++i) {
    if (grp.vals[i].kind != StmtKind::kLoad && grp.vals[i].kind != StmtKind::kIndex) continue;
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
// Reductions

absl::Status Fuser::BuildReduction(int gi, int node_index, bool fresh,
                                   const std::string& not_fused) {
  const ir::Node& node = g_.nodes()[node_index];
  const NodeLowering& spec = nodes_[node_index];
  const ops::OpCall& call = *spec.call;
  const ValueId input = spec.input;
  const ir::TensorMeta& in = g_.value(input).meta;
  Group& grp = groups_[gi];
  const Level row = spec.keepdim ? Level::kRowKeep : Level::kRowFlat;
  const v1::DType out_t = g_.value(node.outputs[0]).meta.dtype;
  const v1::DType ct = Compute(out_t);
  // Values of this reduction, built with the pointwise helpers.
  auto make = [&](Level level) {
    return Builder(
        grp, level,
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
        fresh ? absl::StrCat("new kernel_", gi, ": ", node.name, " (", node.target, ")", not_fused)
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
    if (!TwoPassMoments(in, spec.dims, policy_.two_pass_max_row)) {
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
      if (policy_.keep_in_output && Compute(in.dtype) == out_t)
        grp.keep_in_output.push_back({e, out, node.outputs[0]});
    } else {
      Builder r = make(Level::kRowKeep);
      out = full.Op(ScalarOp::kSub, {shifted, r.Op(ScalarOp::kLog, {s}, Compute(in.dtype))},
                    Compute(in.dtype));
    }
    finish({{node.outputs[0], {full.Cast(out, ct), Level::kFull}}});
  } else if (node.target == "aten._softmax_backward_data.default" ||
             node.target == "aten._log_softmax_backward_data.default") {
    // x is the forward's output y, dy the gradient of it, both in the
    // compute type of the wider: softmax's dx = dy*y - y * sum(dy*y) over
    // the row, log-softmax's dx = dy - exp(y) * sum(dy).
    ASSIGN_OR_RETURN(ValueId grad, call.Tensor("grad_output"));
    const v1::DType t = Compute(ops::PromoteTypes(g_.value(grad).meta.dtype, in.dtype));
    ASSIGN_OR_RETURN(int dy, full.T("grad_output"));
    dy = full.Cast(dy, t);
    const int y = full.Cast(x, t);
    int out;
    if (node.target == "aten._softmax_backward_data.default") {
      const int p = full.Op(ScalarOp::kMul, {dy, y}, t);
      const int s = reduce(p, ReduceOp::kSum, Level::kRowKeep);
      out = full.Op(ScalarOp::kSub, {p, full.Op(ScalarOp::kMul, {y, s}, t)}, t);
    } else {
      const int s = reduce(dy, ReduceOp::kSum, Level::kRowKeep);
      out = full.Op(ScalarOp::kSub,
                    {dy, full.Op(ScalarOp::kMul, {full.Op(ScalarOp::kExp, {y}, t), s}, t)}, t);
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
  return absl::OkStatus();
}

}  // namespace kiln::loop::fuse_internal
