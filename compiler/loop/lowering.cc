#include "compiler/loop/lowering.h"

#include <algorithm>
#include <functional>
#include <map>
#include <optional>
#include <set>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "compiler/ir/printer.h"
#include "compiler/ops/shape_util.h"

namespace kiln::loop {
namespace {

using ir::SymInt;
using ir::ValueId;
using SymSizes = std::vector<SymInt>;

// Where a value computed inside a kernel varies: over the whole iteration
// space, or once per row (a reduction result) with the reduced dimensions
// kept as size 1 or dropped.
enum class Level { kFull, kRowKeep, kRowFlat };

// A value inside a fused kernel, before it is emitted as statements.
struct GVal {
  StmtKind kind = StmtKind::kOp;
  std::string op;
  std::vector<int> args;
  double constant = 0;
  v1::DType dtype = v1::FLOAT32;
  int buffer = -1;  // kLoad
  // kLoad: strides over the consumer's output dims (graph coordinates) and
  // the offset; split into outer/inner strides when the kernel is emitted,
  // since a pointwise kernel adopts a reduction's loop order when one joins.
  std::vector<SymInt> over;
  SymInt offset{int64_t{0}};
  ReduceOp reduce = ReduceOp::kSum;
  Level level = Level::kFull;
  // kFull: the first pass that can compute it. Rows: the pass at whose end
  // it exists.
  int pass = 0;
};

struct Group {
  int item = 0;
  SymSizes full;             // the iteration space in graph coordinates
  std::vector<int> reduced;  // reduced dimensions of `full`; empty: pointwise
  std::vector<GVal> vals;
  std::vector<KernelBuffer> buffers;
  std::map<std::string, int> buffer_index;
  std::map<ValueId, int> value_of;  // graph value -> GVal
  std::map<ValueId, Level> level_of;
  std::set<ValueId> stored;
  std::vector<std::string> nodes;
  bool open = true;
  // A whole-space value `keep` that the final `out` would recompute in a
  // later pass (softmax's exponentials): when `value` (out's graph value)
  // is stored anyway, `keep` is written into its buffer in its own pass and
  // read back, so it is computed once.
  struct KeepInOutput {
    int keep;
    int out;
    ValueId value;
  };
  std::vector<KeepInOutput> keep_in_output;
  // Strides over `full` of values computed in a shape other than `full`
  // (before the kernel took the shape of a view of them, see
  // Lowerer::ReshapeFor); other values are stored with their graph strides.
  std::map<ValueId, SymSizes> strides_of;
};

bool SameSizes(const SymSizes& a, const SymSizes& b) { return a == b; }

std::optional<int64_t> ConstantNumel(const google::protobuf::RepeatedPtrField<v1::SymInt>& sizes) {
  int64_t n = 1;
  for (const auto& s : sizes) {
    if (s.value_case() != v1::SymInt::kIntValue) return std::nullopt;
    n *= s.int_value();
  }
  return n;
}

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

v1::DType Compute(v1::DType t) { return (t == v1::FLOAT16 || t == v1::BFLOAT16) ? v1::FLOAT32 : t; }

// The rank of each element type for promotion among operands of one op.
int Rank(v1::DType t) {
  switch (t) {
    case v1::BOOL:
      return 0;
    case v1::UINT8:
    case v1::INT8:
      return 1;
    case v1::INT16:
      return 2;
    case v1::INT32:
      return 3;
    case v1::INT64:
      return 4;
    case v1::FLOAT16:
    case v1::BFLOAT16:
      return 5;
    case v1::FLOAT32:
      return 6;
    case v1::FLOAT64:
      return 7;
    default:
      return 8;
  }
}

bool Supported(v1::DType t) {
  return t == v1::FLOAT32 || t == v1::FLOAT64 || t == v1::FLOAT16 || t == v1::BFLOAT16 ||
         t == v1::INT64 || t == v1::INT32 || t == v1::BOOL;
}

class Lowerer {
 public:
  Lowerer(const ir::Graph& g, const ops::Registry& r) : g_(g), r_(r) {}

  absl::StatusOr<LoweredGraph> Run();

 private:
  struct Item {
    enum Kind { kGroup, kExtern } kind;
    int group = -1;
    int node = -1;
  };

  // Root materialized value and offset of a view chain.
  struct Alias {
    ValueId root;
    SymInt offset;  // storage offset minus the root's
  };

  // --- classification ---
  bool IsView(const ir::Node& n) const {
    const ops::OpDef* d = r_.Find(n.target);
    return d != nullptr && d->traits.view;
  }
  absl::StatusOr<bool> TryPointwise(int node_index);
  absl::StatusOr<bool> TryReduction(int node_index);

  // --- groups ---
  absl::StatusOr<Level> Classify(const Group& grp, const SymSizes& sizes) const;
  // The GVal reading `v` at a node whose output (level `level`, sizes
  // `out`) lies in `grp`; an error string when `v` may not be read there.
  absl::StatusOr<int> Operand(Group& grp, ValueId v, Level level, const SymSizes& out);
  // Fusion through order-preserving views (reshape, view, flatten,
  // unsqueeze of a contiguous value): the group computing the viewed value
  // takes the view's shape, which enumerates the same elements in the same
  // order. ReshapeFor does that when `node` reads such a view of a value
  // `grp` computes and the view's shape is `to`, and returns what undoes
  // it; nullopt (and `grp` as it was) when the kernel cannot: it reduces,
  // or an access does not map onto the new dims.
  struct ReshapeUndo {
    SymSizes full;
    std::vector<std::pair<int, SymSizes>> overs;  // load GVal -> its `over`
    std::map<ValueId, SymSizes> strides_of;
  };
  std::optional<ReshapeUndo> ReshapeFor(Group& grp, int node_index, const SymSizes& to);
  static void Undo(Group& grp, ReshapeUndo undo) {
    grp.full = std::move(undo.full);
    for (auto& [i, over] : undo.overs) grp.vals[i].over = std::move(over);
    grp.strides_of = std::move(undo.strides_of);
  }
  const SymSizes& StridesIn(const Group& grp, ValueId v) const {
    auto it = grp.strides_of.find(v);
    return it != grp.strides_of.end() ? it->second : g_.value(v).meta.strides;
  }
  int Add(Group& grp, GVal v) {
    grp.vals.push_back(std::move(v));
    return static_cast<int>(grp.vals.size()) - 1;
  }
  int BufferOf(Group& grp, ValueId root, bool written);
  void MarkStored(ValueId v);
  int ProducerItem(ValueId v) const {
    auto it = producer_item_.find(v);
    return it == producer_item_.end() ? -1 : it->second;
  }

  // --- emission ---
  absl::StatusOr<Kernel> EmitKernel(int group_id);
  void BuildPlan(LoweredGraph* out);

  const ir::Graph& g_;
  const ops::Registry& r_;
  std::vector<Item> items_;
  std::vector<Group> groups_;
  std::map<ValueId, int> producer_item_;   // graph inputs are absent (-1)
  std::map<ValueId, int> group_of_;        // values computed inside a group
  std::map<ValueId, Alias> alias_;         // views of materialized values
  std::map<ValueId, ValueId> reshape_of_;  // order-preserving view -> the value it views
  std::vector<std::string> decisions_;
};

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

// Outer dimensions: the non-reduced dims of `full` (all but the last for a
// pointwise kernel); inner: the reduced dims (the last one).
void SplitDims(const Group& grp, std::vector<int>* outer, std::vector<int>* inner) {
  const int rank = static_cast<int>(grp.full.size());
  if (grp.reduced.empty()) {
    for (int d = 0; d + 1 < rank; ++d) outer->push_back(d);
    if (rank > 0) inner->push_back(rank - 1);
    return;
  }
  for (int d = 0; d < rank; ++d) {
    if (std::find(grp.reduced.begin(), grp.reduced.end(), d) == grp.reduced.end()) {
      outer->push_back(d);
    }
  }
  *inner = grp.reduced;
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

std::string ReshapeDecision(int gi, const SymSizes& from, const SymSizes& to) {
  return absl::StrCat("reshape: kernel_", gi, " from [", ops::SizesToString(from), "] to [",
                      ops::SizesToString(to), "]: a view keeps its elements and their order");
}

// ---------------------------------------------------------------------------
// Pointwise lowering: a node becomes a small expression over its operands.

class Builder {
 public:
  Builder(Lowerer* l, Group& grp, Level level, const SymSizes& out,
          std::function<absl::StatusOr<int>(ValueId)> operand, const ops::OpCall& call)
      : grp_(grp), level_(level), operand_(std::move(operand)), call_(call) {
    (void)l;
    (void)out;
  }

  absl::StatusOr<int> T(const std::string& param) {
    ASSIGN_OR_RETURN(ValueId v, call_.Tensor(param));
    return operand_(v);
  }
  absl::StatusOr<double> S(const std::string& param) const { return call_.Double(param); }
  v1::DType D(int id) const { return grp_.vals[id].dtype; }
  int C(double c, v1::DType t) {
    GVal v;
    v.kind = StmtKind::kConstant;
    v.constant = c;
    v.dtype = Compute(t);
    v.level = level_;
    return Add(std::move(v));
  }
  int Cast(int id, v1::DType t) {
    if (D(id) == t) return id;
    return Op("cast", {id}, t);
  }
  int Op(const std::string& op, std::vector<int> args, v1::DType t) {
    GVal v;
    v.kind = StmtKind::kOp;
    v.op = op;
    v.args = std::move(args);
    v.dtype = t;
    v.level = level_;
    return Add(std::move(v));
  }
  // Arithmetic in `t`'s computation type.
  int Ar(const std::string& op, std::vector<int> args, v1::DType t) {
    for (int& a : args) a = Cast(a, Compute(t));
    return Op(op, std::move(args), Compute(t));
  }
  int Compare(const std::string& op, int a, int b) {
    v1::DType t = Rank(D(a)) >= Rank(D(b)) ? D(a) : D(b);
    return Op(op, {Cast(a, Compute(t)), Cast(b, Compute(t))}, v1::BOOL);
  }

 private:
  int Add(GVal v) {
    grp_.vals.push_back(std::move(v));
    return static_cast<int>(grp_.vals.size()) - 1;
  }
  Group& grp_;
  Level level_;
  std::function<absl::StatusOr<int>(ValueId)> operand_;
  const ops::OpCall& call_;
};

using PointwiseRule = std::function<absl::StatusOr<int>(Builder&, const ops::OpCall&, v1::DType)>;

const std::map<std::string, PointwiseRule>& PointwiseRules() {
  static const auto* rules = [] {
    auto* m = new std::map<std::string, PointwiseRule>();
    auto unary = [m](const std::string& target, const std::string& op) {
      (*m)[target] = [op](Builder& b, const ops::OpCall&, v1::DType t) -> absl::StatusOr<int> {
        ASSIGN_OR_RETURN(int x, b.T("self"));
        return b.Ar(op, {x}, t);
      };
    };
    for (const char* op :
         {"neg", "abs", "exp", "log", "log1p", "expm1", "sqrt", "rsqrt", "reciprocal", "sin", "cos",
          "tanh", "sigmoid", "relu", "erf", "sign", "floor", "ceil", "silu"}) {
      unary(absl::StrCat("aten.", op, ".default"), op);
    }
    (*m)["aten.logical_not.default"] = [](Builder& b, const ops::OpCall&,
                                          v1::DType) -> absl::StatusOr<int> {
      ASSIGN_OR_RETURN(int x, b.T("self"));
      return b.Op("not", {b.Cast(x, v1::BOOL)}, v1::BOOL);
    };
    (*m)["aten.gelu.default"] = [](Builder& b, const ops::OpCall& c,
                                   v1::DType t) -> absl::StatusOr<int> {
      ASSIGN_OR_RETURN(int x, b.T("self"));
      const ir::Argument* a = c.Find("approximate");
      const std::string* approx = a ? std::get_if<std::string>(&a->kind) : nullptr;
      return b.Ar(approx != nullptr && *approx == "tanh" ? "gelu_tanh" : "gelu", {x}, t);
    };
    for (const char* id : {"clone", "alias", "detach", "lift_fresh_copy"}) {
      (*m)[absl::StrCat("aten.", id, ".default")] = [](Builder& b, const ops::OpCall&,
                                                       v1::DType t) -> absl::StatusOr<int> {
        ASSIGN_OR_RETURN(int x, b.T("self"));
        return b.Cast(x, Compute(t));
      };
    }
    // An explicit conversion rounds to its dtype even when the value stays
    // in the kernel (x.bfloat16().float() is x rounded to bfloat16), though
    // half-type arithmetic is carried in float32 and rounded at its store.
    (*m)["aten._to_copy.default"] = [](Builder& b, const ops::OpCall&,
                                       v1::DType t) -> absl::StatusOr<int> {
      ASSIGN_OR_RETURN(int x, b.T("self"));
      return b.Cast(x, t);
    };
    // Binary ops over two tensors or a tensor and a Scalar, with `alpha`.
    auto binary = [m](const std::string& name, const std::string& op, bool alpha, bool reverse) {
      for (const char* overload : {"Tensor", "Scalar"}) {
        const bool scalar = std::string(overload) == "Scalar";
        (*m)[absl::StrCat("aten.", name, ".", overload)] = [op, alpha, reverse, scalar](
                                                               Builder& b, const ops::OpCall& c,
                                                               v1::DType t) -> absl::StatusOr<int> {
          ASSIGN_OR_RETURN(int x, b.T("self"));
          int y;
          if (scalar) {
            ASSIGN_OR_RETURN(double s, b.S("other"));
            y = b.C(s, t);
          } else {
            ASSIGN_OR_RETURN(y, b.T("other"));
          }
          if (alpha && !c.IsNone("alpha")) {
            ASSIGN_OR_RETURN(double a, c.Double("alpha"));
            if (a != 1.0) y = b.Ar("mul", {y, b.C(a, t)}, t);
          }
          if (reverse) std::swap(x, y);
          return b.Ar(op, {x, y}, t);
        };
      }
    };
    binary("add", "add", true, false);
    binary("sub", "sub", true, false);
    binary("rsub", "sub", true, true);
    binary("mul", "mul", false, false);
    binary("div", "div", false, false);
    (*m)["aten.maximum.default"] = [](Builder& b, const ops::OpCall&,
                                      v1::DType t) -> absl::StatusOr<int> {
      ASSIGN_OR_RETURN(int x, b.T("self"));
      ASSIGN_OR_RETURN(int y, b.T("other"));
      return b.Ar("max", {x, y}, t);
    };
    (*m)["aten.minimum.default"] = [](Builder& b, const ops::OpCall&,
                                      v1::DType t) -> absl::StatusOr<int> {
      ASSIGN_OR_RETURN(int x, b.T("self"));
      ASSIGN_OR_RETURN(int y, b.T("other"));
      return b.Ar("min", {x, y}, t);
    };
    (*m)["aten.pow.Tensor_Scalar"] = [](Builder& b, const ops::OpCall&,
                                        v1::DType t) -> absl::StatusOr<int> {
      ASSIGN_OR_RETURN(int x, b.T("self"));
      ASSIGN_OR_RETURN(double e, b.S("exponent"));
      if (e == 2.0) return b.Ar("mul", {x, x}, t);
      return b.Ar("pow", {x, b.C(e, t)}, t);
    };
    (*m)["aten.pow.Tensor_Tensor"] = [](Builder& b, const ops::OpCall&,
                                        v1::DType t) -> absl::StatusOr<int> {
      ASSIGN_OR_RETURN(int x, b.T("self"));
      ASSIGN_OR_RETURN(int y, b.T("exponent"));
      return b.Ar("pow", {x, y}, t);
    };
    for (const char* cmp : {"eq", "ne", "lt", "le", "gt", "ge"}) {
      for (const char* overload : {"Tensor", "Scalar"}) {
        const bool scalar = std::string(overload) == "Scalar";
        const std::string op = cmp;
        (*m)[absl::StrCat("aten.", cmp, ".", overload)] =
            [op, scalar](Builder& b, const ops::OpCall&, v1::DType) -> absl::StatusOr<int> {
          ASSIGN_OR_RETURN(int x, b.T("self"));
          int y;
          if (scalar) {
            ASSIGN_OR_RETURN(double s, b.S("other"));
            y = b.C(s, b.D(x) == v1::BOOL ? v1::INT64 : b.D(x));
          } else {
            ASSIGN_OR_RETURN(y, b.T("other"));
          }
          return b.Compare(op, x, y);
        };
      }
    }
    for (const char* lop : {"and", "or", "xor"}) {
      const std::string op = lop;
      (*m)[absl::StrCat("aten.logical_", lop, ".default")] =
          [op](Builder& b, const ops::OpCall&, v1::DType) -> absl::StatusOr<int> {
        ASSIGN_OR_RETURN(int x, b.T("self"));
        ASSIGN_OR_RETURN(int y, b.T("other"));
        return b.Op(op, {b.Cast(x, v1::BOOL), b.Cast(y, v1::BOOL)}, v1::BOOL);
      };
    }
    (*m)["aten.where.self"] = [](Builder& b, const ops::OpCall&,
                                 v1::DType t) -> absl::StatusOr<int> {
      ASSIGN_OR_RETURN(int c, b.T("condition"));
      ASSIGN_OR_RETURN(int x, b.T("self"));
      ASSIGN_OR_RETURN(int y, b.T("other"));
      return b.Op("where", {b.Cast(c, v1::BOOL), b.Cast(x, Compute(t)), b.Cast(y, Compute(t))},
                  Compute(t));
    };
    (*m)["aten.masked_fill.Scalar"] = [](Builder& b, const ops::OpCall&,
                                         v1::DType t) -> absl::StatusOr<int> {
      ASSIGN_OR_RETURN(int x, b.T("self"));
      ASSIGN_OR_RETURN(int mask, b.T("mask"));
      ASSIGN_OR_RETURN(double v, b.S("value"));
      return b.Op("where", {b.Cast(mask, v1::BOOL), b.C(v, t), b.Cast(x, Compute(t))}, Compute(t));
    };
    (*m)["aten.clamp.default"] = [](Builder& b, const ops::OpCall& c,
                                    v1::DType t) -> absl::StatusOr<int> {
      ASSIGN_OR_RETURN(int x, b.T("self"));
      x = b.Cast(x, Compute(t));
      if (!c.IsNone("min")) {
        ASSIGN_OR_RETURN(double lo, c.Double("min"));
        x = b.Op("max", {x, b.C(lo, t)}, Compute(t));
      }
      if (!c.IsNone("max")) {
        ASSIGN_OR_RETURN(double hi, c.Double("max"));
        x = b.Op("min", {x, b.C(hi, t)}, Compute(t));
      }
      return x;
    };
    (*m)["aten.threshold_backward.default"] = [](Builder& b, const ops::OpCall&,
                                                 v1::DType t) -> absl::StatusOr<int> {
      ASSIGN_OR_RETURN(int g, b.T("grad_output"));
      ASSIGN_OR_RETURN(int x, b.T("self"));
      ASSIGN_OR_RETURN(double th, b.S("threshold"));
      int keep = b.Op("le", {b.Cast(x, Compute(t)), b.C(th, t)}, v1::BOOL);
      return b.Op("where", {keep, b.C(0, t), b.Cast(g, Compute(t))}, Compute(t));
    };
    (*m)["aten.tanh_backward.default"] = [](Builder& b, const ops::OpCall&,
                                            v1::DType t) -> absl::StatusOr<int> {
      ASSIGN_OR_RETURN(int g, b.T("grad_output"));
      ASSIGN_OR_RETURN(int y, b.T("output"));
      int yy = b.Ar("mul", {y, y}, t);
      return b.Ar("mul", {g, b.Ar("sub", {b.C(1, t), yy}, t)}, t);
    };
    (*m)["aten.sigmoid_backward.default"] = [](Builder& b, const ops::OpCall&,
                                               v1::DType t) -> absl::StatusOr<int> {
      ASSIGN_OR_RETURN(int g, b.T("grad_output"));
      ASSIGN_OR_RETURN(int y, b.T("output"));
      int one_minus = b.Ar("sub", {b.C(1, t), y}, t);
      return b.Ar("mul", {g, b.Ar("mul", {y, one_minus}, t)}, t);
    };
    (*m)["aten.gelu_backward.default"] = [](Builder& b, const ops::OpCall& c,
                                            v1::DType t) -> absl::StatusOr<int> {
      ASSIGN_OR_RETURN(int g, b.T("grad_output"));
      ASSIGN_OR_RETURN(int x, b.T("self"));
      const ir::Argument* a = c.Find("approximate");
      const std::string* approx = a ? std::get_if<std::string>(&a->kind) : nullptr;
      const v1::DType ct = Compute(t);
      x = b.Cast(x, ct);
      int d;
      if (approx != nullptr && *approx == "tanh") {
        // d/dx 0.5 x (1 + tanh(k (x + 0.044715 x^3))), k = sqrt(2 / pi)
        const double k = 0.7978845608028654, kappa = 0.044715;
        int x2 = b.Op("mul", {x, x}, ct);
        int inner = b.Op(
            "mul",
            {b.C(k, ct),
             b.Op("add", {x, b.Op("mul", {b.C(kappa, ct), b.Op("mul", {x2, x}, ct)}, ct)}, ct)},
            ct);
        int th = b.Op("tanh", {inner}, ct);
        int left = b.Op("mul", {b.C(0.5, ct), b.Op("add", {b.C(1, ct), th}, ct)}, ct);
        int sech2 = b.Op("sub", {b.C(1, ct), b.Op("mul", {th, th}, ct)}, ct);
        int dinner = b.Op(
            "mul",
            {b.C(k, ct), b.Op("add", {b.C(1, ct), b.Op("mul", {b.C(3 * kappa, ct), x2}, ct)}, ct)},
            ct);
        int right =
            b.Op("mul", {b.Op("mul", {b.C(0.5, ct), x}, ct), b.Op("mul", {sech2, dinner}, ct)}, ct);
        d = b.Op("add", {left, right}, ct);
      } else {
        // Phi(x) + x phi(x)
        int cdf = b.Op("mul",
                       {b.C(0.5, ct),
                        b.Op("add",
                             {b.C(1, ct),
                              b.Op("erf", {b.Op("mul", {x, b.C(0.7071067811865476, ct)}, ct)}, ct)},
                             ct)},
                       ct);
        int pdf =
            b.Op("mul",
                 {b.Op("exp", {b.Op("mul", {b.C(-0.5, ct), b.Op("mul", {x, x}, ct)}, ct)}, ct),
                  b.C(0.3989422804014327, ct)},
                 ct);
        d = b.Op("add", {cdf, b.Op("mul", {x, pdf}, ct)}, ct);
      }
      return b.Ar("mul", {g, d}, t);
    };
    (*m)["aten.native_dropout_backward.default"] = [](Builder& b, const ops::OpCall&,
                                                      v1::DType t) -> absl::StatusOr<int> {
      ASSIGN_OR_RETURN(int g, b.T("grad_output"));
      ASSIGN_OR_RETURN(int mask, b.T("mask"));
      ASSIGN_OR_RETURN(double scale, b.S("scale"));
      int kept = b.Cast(b.Cast(mask, v1::BOOL), Compute(t));
      return b.Ar("mul", {b.Ar("mul", {g, kept}, t), b.C(scale, t)}, t);
    };
    (*m)["aten.fill.Scalar"] = [](Builder& b, const ops::OpCall& c,
                                  v1::DType t) -> absl::StatusOr<int> {
      ASSIGN_OR_RETURN(double v, c.Double("value"));
      return b.C(v, t);
    };
    return m;
  }();
  return *rules;
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

struct ReductionSpec {
  std::vector<int> dims;  // reduced dims of the input
  bool keepdim = false;
};

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
    const size_t mark = grp.vals.size(), bmark = grp.buffers.size();
    auto probe = Operand(grp, input, Level::kFull, in.sizes);
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
    const int mean = keep.Op("div", {sum, count(keep, Level::kRowKeep)}, xt);
    const int dev = full.Op("sub", {x, mean}, xt);
    return {mean, reduce(full.Op("mul", {dev, dev}, xt), ReduceOp::kSum, level)};
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
    finish({{node.outputs[0], {r.Op("div", {sum, count(r, row)}, ct), row}}});
  } else if (node.target == "aten.var.correction") {
    double correction = 1;
    if (!call.IsNone("correction")) {
      ASSIGN_OR_RETURN(correction, call.Double("correction"));
    }
    int m2 = moments(row).second;
    Builder r = make(row);
    int n = count(r, row);
    int denom = r.Op("max", {r.Op("sub", {n, r.C(correction, ct)}, ct), r.C(0, ct)}, ct);
    finish({{node.outputs[0], {r.Op("div", {m2, denom}, ct), row}}});
  } else if (node.target == "aten._softmax.default" || node.target == "aten._log_softmax.default") {
    // Rows are kept as size-1 dims: the results broadcast back over them.
    int mx = reduce(x, ReduceOp::kMax, Level::kRowKeep);
    int shifted = full.Op("sub", {x, mx}, Compute(in.dtype));
    int e = full.Op("exp", {shifted}, Compute(in.dtype));
    int s = reduce(e, ReduceOp::kSum, Level::kRowKeep);
    int out;
    if (node.target == "aten._softmax.default") {
      out = full.Op("div", {e, s}, Compute(in.dtype));
      if (Compute(in.dtype) == out_t) grp.keep_in_output.push_back({e, out, node.outputs[0]});
    } else {
      Builder r = make(Level::kRowKeep);
      out = full.Op("sub", {shifted, r.Op("log", {s}, Compute(in.dtype))}, Compute(in.dtype));
    }
    finish({{node.outputs[0], {full.Cast(out, ct), Level::kFull}}});
  } else {  // native_layer_norm
    ASSIGN_OR_RETURN(double eps, call.Double("eps"));
    const v1::DType st = Compute(g_.value(node.outputs[1]).meta.dtype);
    const auto [mean, m2] = moments(Level::kRowKeep);
    Builder r = make(Level::kRowKeep);
    int n = count(r, Level::kRowKeep);
    int rstd = r.Op("rsqrt", {r.Op("add", {r.Op("div", {m2, n}, ct), r.C(eps, ct)}, ct)}, ct);
    int y = full.Op("mul", {full.Op("sub", {x, mean}, ct), rstd}, ct);
    if (!call.IsNone("weight")) {
      ASSIGN_OR_RETURN(int w, full.T("weight"));
      y = full.Ar("mul", {y, w}, out_t);
    }
    if (!call.IsNone("bias")) {
      ASSIGN_OR_RETURN(int b, full.T("bias"));
      y = full.Ar("add", {y, b}, out_t);
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

// ---------------------------------------------------------------------------
// Emission

// A load's index in the kernel's loop order: whole-space loads have a
// stride per dim of the space; per-row loads vary over the outer dims only
// (kept as size 1, or dropped, in their own shape).
Index LoadIndex(const GVal& v, const std::vector<int>& outer, const std::vector<int>& inner) {
  Index index;
  index.offset = v.offset;
  index.outer_strides.assign(outer.size(), SymInt{int64_t{0}});
  index.inner_strides.assign(std::max<size_t>(1, inner.size()), SymInt{int64_t{0}});
  for (size_t k = 0; k < outer.size(); ++k) {
    const size_t d = v.level == Level::kRowFlat ? k : static_cast<size_t>(outer[k]);
    if (d < v.over.size()) index.outer_strides[k] = v.over[d];
  }
  if (v.level == Level::kFull) {
    for (size_t k = 0; k < inner.size(); ++k) {
      if (static_cast<size_t>(inner[k]) < v.over.size()) index.inner_strides[k] = v.over[inner[k]];
    }
  }
  return index;
}

// Statement of GVal `v` in pass `pass`, inside the sweep or after it;
// without its arguments (they are statements of the caller's choosing).
Stmt StmtOf(const GVal& v, int pass, bool in_sweep, const std::vector<int>& outer,
            const std::vector<int>& inner) {
  Stmt s;
  s.kind = v.kind;
  s.pass = pass;
  s.inner = in_sweep;
  s.dtype = v.dtype;
  s.op = v.op;
  s.constant = v.constant;
  s.buffer = v.buffer;
  if (v.kind == StmtKind::kLoad) s.index = LoadIndex(v, outer, inner);
  return s;
}

absl::StatusOr<Kernel> Lowerer::EmitKernel(int gi) {
  Group& grp = groups_[gi];
  Kernel k;
  k.name = absl::StrCat("kernel_", gi);
  k.nodes = grp.nodes;
  std::vector<int> outer, inner;
  SplitDims(grp, &outer, &inner);
  for (int d : outer) k.outer.push_back(grp.full[d]);
  for (int d : inner) k.inner.push_back(grp.full[d]);
  if (k.inner.empty()) k.inner.push_back(SymInt{int64_t{1}});

  // Passes: a whole-space value can be computed once every per-row value it
  // reads exists; a reduction's result exists at the end of its sweep.
  std::vector<GVal>& vals = grp.vals;
  // Values kept in their output's buffer: written in their pass, reloaded.
  // Once `out` is stored over it, the buffer holds `out`: passes after
  // that read `out` from it rather than recompute it from the buffer (a
  // second softmax over a stored first one would divide twice).
  std::map<int, int> reload_after;                   // reload GVal -> kept GVal
  std::vector<std::pair<int, ValueId>> keep_stores;  // kept GVal -> buffer of value
  std::map<int, int> final_reload;                   // out GVal -> its reload
  for (const Group::KeepInOutput& k : grp.keep_in_output) {
    auto v = grp.value_of.find(k.value);
    if (!grp.stored.count(k.value) || v == grp.value_of.end() || v->second != k.out) continue;
    auto reload = [&](v1::DType dtype) {
      GVal load;
      load.kind = StmtKind::kLoad;
      load.dtype = dtype;
      load.level = Level::kFull;
      load.over = StridesIn(grp, k.value);
      load.buffer = grp.buffer_index[g_.value(k.value).name];
      vals.push_back(std::move(load));
      return static_cast<int>(vals.size()) - 1;
    };
    const int id = reload(vals[k.keep].dtype);
    reload_after[id] = k.keep;
    for (int& a : vals[k.out].args) {
      if (a == k.keep) a = id;
    }
    keep_stores.emplace_back(k.keep, k.value);
    final_reload[k.out] = reload(vals[k.out].dtype);
  }
  std::vector<int> pass(vals.size(), -1);
  std::function<int(int)> pass_of = [&](int i) -> int {
    if (pass[i] >= 0) return pass[i];
    const GVal& v = vals[i];
    int p = 0;
    // A per-row value exists after its pass's sweep: a whole-space value or
    // a reduction (whose sweep broadcasts it over the row, e.g. a softmax
    // over the size-1 dim of a mean kept as [n, 1]) reads it in a later pass.
    const bool v_row = v.level != Level::kFull && v.kind != StmtKind::kReduce;
    for (int a : v.args) {
      const bool a_row = vals[a].level != Level::kFull;
      p = std::max(p, pass_of(a) + (a_row && !v_row ? 1 : 0));
    }
    if (auto r = reload_after.find(i); r != reload_after.end())
      p = std::max(p, pass_of(r->second) + 1);
    return pass[i] = p;
  };
  for (size_t i = 0; i < vals.size(); ++i) pass_of(static_cast<int>(i));
  // Stores.
  std::vector<std::pair<ValueId, int>> stores;
  for (ValueId v : grp.stored) stores.emplace_back(v, grp.value_of[v]);
  std::sort(stores.begin(), stores.end());
  int passes = 1;
  for (size_t i = 0; i < vals.size(); ++i) passes = std::max(passes, pass[i] + 1);
  k.passes = passes;
  k.buffers = grp.buffers;

  // Emit pass by pass. Whole-space values are re-emitted in each pass that
  // needs them (recomputed: cheap pointwise work, reloaded inputs); per-row
  // values are emitted once, after the sweep of their pass.
  std::vector<int> row_stmt(vals.size(), -1);
  for (int p = 0; p < passes; ++p) {
    std::vector<int> memo(vals.size(), -1);
    std::function<int(int)> emit_full = [&](int i) -> int {
      if (vals[i].level != Level::kFull) return row_stmt[i];
      if (memo[i] >= 0) return memo[i];
      if (auto f = final_reload.find(i); f != final_reload.end() && p > pass[i]) {
        return memo[i] = emit_full(f->second);
      }
      const GVal& v = vals[i];
      Stmt s = StmtOf(v, p, /*in_sweep=*/true, outer, inner);
      for (int a : v.args) s.args.push_back(emit_full(a));
      k.stmts.push_back(std::move(s));
      return memo[i] = static_cast<int>(k.stmts.size()) - 1;
    };
    // Inner: the reductions of this pass, and whole-space stores.
    std::map<int, int> welford;  // input stmt -> first Welford stmt (one accumulator)
    for (size_t i = 0; i < vals.size(); ++i) {
      if (vals[i].kind != StmtKind::kReduce || pass[i] != p) continue;
      Stmt s;
      s.kind = StmtKind::kReduce;
      s.pass = p;
      s.inner = true;
      s.dtype = vals[i].dtype;
      s.reduce = vals[i].reduce;
      s.args = {emit_full(vals[i].args[0])};
      k.stmts.push_back(std::move(s));
      row_stmt[i] = static_cast<int>(k.stmts.size()) - 1;
    }
    // Whole-space stores: a value into its graph value's buffer, in the
    // value's layout.
    auto store_full = [&](int id, ValueId into) {
      Stmt s;
      s.kind = StmtKind::kStore;
      s.pass = p;
      s.inner = true;
      s.args = {emit_full(id)};
      s.buffer = grp.buffer_index[g_.value(into).name];
      const ir::TensorMeta& m = g_.value(into).meta;
      const SymSizes& strides = StridesIn(grp, into);
      s.dtype = m.dtype;
      for (int d : outer) s.index.outer_strides.push_back(strides[d]);
      for (int d : inner) s.index.inner_strides.push_back(strides[d]);
      if (inner.empty()) s.index.inner_strides.push_back(SymInt{int64_t{0}});
      k.stmts.push_back(std::move(s));
    };
    for (const auto& [keep, v] : keep_stores) {
      if (pass[keep] == p) store_full(keep, v);
    }
    for (const auto& [v, id] : stores) {
      if (vals[id].level == Level::kFull && pass[id] == p) store_full(id, v);
    }
    // Outer level, after the sweep: per-row values of this pass and their stores.
    for (size_t i = 0; i < vals.size(); ++i) {
      const GVal& v = vals[i];
      if (v.level == Level::kFull || v.kind == StmtKind::kReduce || pass[i] != p) continue;
      Stmt s = StmtOf(v, p, /*in_sweep=*/false, outer, inner);
      for (int a : v.args) s.args.push_back(row_stmt[a]);
      k.stmts.push_back(std::move(s));
      row_stmt[i] = static_cast<int>(k.stmts.size()) - 1;
    }
    for (const auto& [v, id] : stores) {
      if (vals[id].level == Level::kFull || pass[id] != p) continue;
      Stmt s;
      s.kind = StmtKind::kStore;
      s.pass = p;
      s.inner = false;
      s.args = {row_stmt[id]};
      s.buffer = grp.buffer_index[g_.value(v).name];
      const ir::TensorMeta& m = g_.value(v).meta;
      s.dtype = m.dtype;
      // Row values index only the kept (outer) dimensions.
      if (grp.level_of[v] == Level::kRowKeep) {
        for (int d : outer) s.index.outer_strides.push_back(m.strides[d]);
      } else {
        for (size_t d = 0; d < outer.size(); ++d) s.index.outer_strides.push_back(m.strides[d]);
      }
      s.index.inner_strides.assign(std::max<size_t>(1, inner.size()), SymInt{int64_t{0}});
      k.stmts.push_back(std::move(s));
    }
  }
  for (int i = 0; i < static_cast<int>(k.stmts.size()); ++i) {
    for (int a : k.stmts[i].args) {
      if (a < 0 || a >= i) {
        return absl::InternalError(
            absl::StrCat(k.name, ": statement ", i, " reads an undefined value"));
      }
    }
  }
  return k;
}

void Lowerer::BuildPlan(LoweredGraph* out) {
  v1::ExecutionPlan& plan = out->plan;
  // Symbols: bound from the first input dimension that is one alone. A
  // dimension that is an expression ("16*s0") binds nothing; the runtime
  // checks it against the bound symbols.
  auto is_symbol = [](const std::string& e) {
    return !e.empty() && !absl::ascii_isdigit(e[0]) && std::all_of(e.begin(), e.end(), [](char c) {
      return absl::ascii_isalnum(c) || c == '_';
    });
  };
  std::set<std::string> seen;
  for (size_t i = 0; i < g_.inputs().size(); ++i) {
    const ir::Value& v = g_.value(g_.inputs()[i].value);
    auto* ph = plan.add_inputs();
    ph->set_kind(g_.inputs()[i].kind);
    ph->mutable_value()->set_name(v.name);
    for (size_t d = 0; d < v.meta.sizes.size(); ++d) {
      const SymInt& s = v.meta.sizes[d];
      if (s.is_constant() || !is_symbol(s.expr()) || seen.count(s.expr())) continue;
      seen.insert(s.expr());
      auto* b = plan.add_symbols();
      b->set_symbol(s.expr());
      b->set_input(static_cast<int>(i));
      b->set_dim(static_cast<int>(d));
      out->symbols.push_back(s.expr());
    }
  }
  // Metadata of the inputs, as the graph promised them; extern nodes in
  // wire form, naming plan values.
  const v1::Graph graph_proto = g_.ToProto();
  for (int i = 0; i < plan.inputs_size(); ++i) *plan.mutable_inputs(i) = graph_proto.inputs(i);

  // Which values each step reads, to free buffers after their last use.
  auto add_alloc = [&](ValueId v) {
    const ir::TensorMeta& m = g_.value(v).meta;
    auto* a = plan.add_steps()->mutable_alloc();
    a->set_value(g_.value(v).name);
    a->set_dtype(m.dtype);
    for (const auto& s : m.sizes) *a->add_sizes() = ir::SymIntToProto(s);
    for (const auto& s : m.strides) *a->add_strides() = ir::SymIntToProto(s);
    a->mutable_device()->set_type(m.device_type.empty() ? "cpu" : m.device_type);
    a->mutable_device()->set_index(m.device_index);
  };
  std::set<std::string> materialized;
  for (const auto& in : g_.inputs()) materialized.insert(g_.value(in.value).name);
  // A view needed as a tensor (by an extern or as an output) is made with a
  // View step over its root.
  auto ensure_view = [&](ValueId v) {
    const std::string& name = g_.value(v).name;
    if (materialized.count(name)) return;
    auto a = alias_.find(v);
    if (a == alias_.end()) return;
    const ir::TensorMeta& m = g_.value(v).meta;
    auto* view = plan.add_steps()->mutable_view();
    view->set_value(name);
    view->set_base(g_.value(a->second.root).name);
    for (const auto& s : m.sizes) *view->add_sizes() = ir::SymIntToProto(s);
    for (const auto& s : m.strides) *view->add_strides() = ir::SymIntToProto(s);
    *view->mutable_storage_offset() = ir::SymIntToProto(m.storage_offset);
    materialized.insert(name);
  };
  int kernel_index = 0;
  for (const Item& item : items_) {
    if (item.kind == Item::kGroup) {
      const Kernel& k = out->kernels[kernel_index++];
      for (const KernelBuffer& b : k.buffers) {
        if (!b.written || materialized.count(b.value)) continue;
        for (const auto& [v, gi] : group_of_) {
          if (gi == item.group && g_.value(v).name == b.value) add_alloc(v);
        }
        materialized.insert(b.value);
      }
      auto* launch = plan.add_steps()->mutable_launch();
      launch->set_module(0);
      launch->set_symbol(k.name);
      for (const KernelBuffer& b : k.buffers) launch->add_buffers(b.value);
    } else {
      const ir::Node& node = g_.nodes()[item.node];
      for (ValueId v : ir::Graph::Operands(node)) ensure_view(v);
      auto* ext = plan.add_steps()->mutable_extern_call();
      *ext->mutable_node() = graph_proto.nodes(item.node);
      for (ValueId v : node.outputs) materialized.insert(g_.value(v).name);
    }
  }
  for (ValueId v : g_.outputs()) {
    ensure_view(v);
    plan.add_outputs(g_.value(v).name);
  }
  plan.set_kernels(static_cast<int>(out->kernels.size()));

  // Memory planning: free each allocated value after its last reader;
  // allocations reuse freed storage of the same dtype and constant size.
  std::map<std::string, int> last_use;
  std::set<std::string> outputs(plan.outputs().begin(), plan.outputs().end());
  auto note = [&](const std::string& name, int step) { last_use[name] = step; };
  std::map<std::string, std::string> root_of;  // view -> root
  for (int i = 0; i < plan.steps_size(); ++i) {
    const v1::PlanStep& s = plan.steps(i);
    if (s.has_launch())
      for (const auto& b : s.launch().buffers()) note(b, i);
    if (s.has_view()) {
      note(s.view().base(), i);
      root_of[s.view().value()] = s.view().base();
    }
    if (s.has_extern_call()) {
      for (const auto& a : s.extern_call().node().args()) {
        if (a.has_tensor()) note(a.tensor(), i);
        if (a.has_tensors())
          for (const auto& n : a.tensors().names())
            if (!n.empty()) note(n, i);
      }
      for (const auto& a : s.extern_call().node().kwargs()) {
        if (a.has_tensor()) note(a.tensor(), i);
      }
    }
  }
  // A view keeps its root alive.
  for (const auto& [view, root] : root_of) {
    if (last_use.count(view)) last_use[root] = std::max(last_use[root], last_use[view]);
    if (outputs.count(view)) outputs.insert(root);
  }
  // Every value a step defines (allocations, views, extern results) is
  // dropped after its last reader, so that nothing keeps a dead buffer's
  // storage alive and a later allocation can take it over.
  std::map<int, std::vector<std::string>> frees;
  auto free_after_last_use = [&](const std::string& name, int defined_at) {
    if (outputs.count(name)) return;
    auto it = last_use.find(name);
    frees[it == last_use.end() ? defined_at : it->second].push_back(name);
  };
  for (int i = 0; i < plan.steps_size(); ++i) {
    const v1::PlanStep& s = plan.steps(i);
    if (s.has_alloc()) free_after_last_use(s.alloc().value(), i);
    if (s.has_view()) free_after_last_use(s.view().value(), i);
    if (s.has_extern_call()) {
      for (const auto& o : s.extern_call().node().outputs()) free_after_last_use(o.name(), i);
    }
  }
  v1::ExecutionPlan planned = plan;
  planned.clear_steps();
  std::vector<std::pair<std::string, const v1::PlanStep::Alloc*>> dead;  // freed, reusable
  std::map<std::string, const v1::PlanStep::Alloc*> allocs;
  for (int i = 0; i < plan.steps_size(); ++i) {
    v1::PlanStep step = plan.steps(i);
    if (step.has_alloc()) {
      allocs[step.alloc().value()] = &plan.steps(i).alloc();
      const std::optional<int64_t> want = ConstantNumel(step.alloc().sizes());
      for (auto it = dead.begin(); want.has_value() && it != dead.end(); ++it) {
        const std::optional<int64_t> have = ConstantNumel(it->second->sizes());
        if (have.has_value() && it->second->dtype() == step.alloc().dtype() && *have >= *want) {
          step.mutable_alloc()->set_reuse(it->first);
          dead.erase(it);
          break;
        }
      }
    }
    *planned.add_steps() = step;
    for (const std::string& name : frees[i]) {
      planned.add_steps()->mutable_free()->set_value(name);
      if (allocs.count(name)) dead.emplace_back(name, allocs[name]);
    }
  }
  plan = std::move(planned);
}

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

}  // namespace

absl::StatusOr<LoweredGraph> LowerGraph(const ir::Graph& graph, const ops::Registry& registry) {
  Lowerer l(graph, registry);
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
