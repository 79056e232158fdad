// Internal to compiler/loop: what the files of the "fuse" pass (fuse.h)
// share. The Fuser's member functions are defined by phase: fuse.cc places
// each node (legality, then the policy), fuse_values.cc checks what a kernel
// may read and builds a node's values in the kernel it joins,
// fuse_pointwise.cc holds the pointwise ops' expressions (also read by the
// "lower" pass), and fuse_emit.cc writes a kernel's statements.
#ifndef KILN_COMPILER_LOOP_FUSE_INTERNAL_H_
#define KILN_COMPILER_LOOP_FUSE_INTERNAL_H_

#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/status_macros.h"
#include "compiler/ir/graph.h"
#include "compiler/loop/fuse.h"
#include "compiler/loop/kernel.h"
#include "compiler/loop/lower.h"
#include "compiler/ops/registry.h"
#include "compiler/ops/shape_util.h"

namespace kiln::loop::fuse_internal {

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
  ScalarOp op = ScalarOp::kCast;  // kOp
  std::vector<int> args;
  double constant = 0;
  v1::DType dtype = v1::FLOAT32;
  int buffer = -1;  // kLoad, kGather
  // kLoad, kGather: strides over the consumer's output dims (graph coordinates) and
  // the offset; split into outer/inner strides when the kernel is emitted,
  // since a pointwise kernel adopts a reduction's loop order when one joins.
  std::vector<SymInt> over;
  SymInt offset{int64_t{0}};
  // kGather: `over` and `offset` address the dims not gathered; args[k]
  // indexes a dim of gather_sizes[k] elements and gather_strides[k] stride
  // (Stmt::gather_strides).
  std::vector<SymInt> gather_strides;
  std::vector<SymInt> gather_sizes;
  bool gather_wraps = false;
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
  // Scatter-adds (StmtKind::kScatterAdd): `value` (a GVal) added at the
  // position that `at` (its over, its offset, its gathered strides and
  // sizes) and the index GVals `args` name in `buffer`, which holds the
  // graph value `into`.
  struct Scatter {
    int value = -1;
    std::vector<int> args;
    GVal at;
    int buffer = -1;
    ValueId into = ir::kNoValue;
  };
  std::vector<Scatter> scatters;
  // Strides over `full` of values computed in a shape other than `full`
  // (before the kernel took the shape of a view of them, see
  // Fuser::ReshapeFor); other values are stored with their graph strides.
  std::map<ValueId, SymSizes> strides_of;
};

inline v1::DType Compute(v1::DType t) {
  return (t == v1::FLOAT16 || t == v1::BFLOAT16) ? v1::FLOAT32 : t;
}

// The dtypes kernels compute in and read.
inline bool SupportedDType(v1::DType t) {
  return t == v1::FLOAT32 || t == v1::FLOAT64 || t == v1::FLOAT16 || t == v1::BFLOAT16 ||
         t == v1::INT64 || t == v1::INT32 || t == v1::BOOL;
}

class Fuser {
 public:
  Fuser(const ir::Graph& g, const std::vector<NodeLowering>& nodes, const FusionPolicy& policy)
      : g_(g), nodes_(nodes), policy_(policy) {}

  absl::StatusOr<FusedGraph> Run();

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

  // --- placement (fuse.cc) ---
  void PlaceView(int node_index);
  absl::StatusOr<bool> PlacePointwise(int node_index);
  absl::StatusOr<bool> PlaceReduction(int node_index);
  // A gather node (lower.h's GatherSpec), into the newest open kernel
  // over its output's space that may read its operands, or into a kernel
  // of its own; false when it cannot be built at all (it runs through ATen).
  absl::StatusOr<bool> PlaceGather(int node_index);
  // Whether `grp` may gather from `source` (in memory before it, not
  // written by it) and read the index tensors; the reason when not.
  absl::Status GatherLegal(const Group& grp, const GatherSpec& spec, const SymSizes& out) const;
  // The gather's values in `grp`: its index operands and the gathered load.
  absl::StatusOr<int> BuildGather(Group& grp, const GatherSpec& spec, const SymSizes& out);
  // A load of `v` from memory with strides `over` (its kernel stores it).
  GVal MemoryLoad(Group& grp, ValueId v, SymSizes over);
  // The index GVals of `spec` in `grp` (BuildGather's).
  absl::StatusOr<std::vector<int>> GatherIndices(Group& grp, const GatherSpec& spec,
                                                 const SymSizes& out);
  // A scatter-add node (NodeKind::kScatter): a kernel of its own over its
  // space, closed after it; false when it cannot be built.
  absl::StatusOr<bool> PlaceScatter(int node_index);
  // The refusals of the kernels a node did not join, for its decision.
  static std::string NotFused(const std::vector<std::string>& refusals);

  // --- legality and values (fuse_values.cc) ---
  absl::StatusOr<Level> Classify(const Group& grp, const SymSizes& sizes) const;
  // Whether a node whose output (level `level`, sizes `out`) lies in `grp`
  // may read each of its tensor operands there; the first one it may not,
  // with the reason. Changes nothing. Conservative for an op that reads an
  // operand for its shape only (fill): that operand must be readable too.
  absl::Status Legal(const Group& grp, int node_index, Level level, const SymSizes& out) const;
  absl::Status Readable(const Group& grp, ValueId v, Level level, const SymSizes& out) const;
  // Reading `v` (whose chain of views ends at `root`) from memory.
  absl::Status MemoryReadable(const Group& grp, ValueId v, ValueId root, const SymSizes& out) const;
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
  // A kernel of its own over `full`, the newest item; its index.
  int OpenGroup(SymSizes full) {
    Group grp;
    grp.item = static_cast<int>(items_.size());
    grp.full = std::move(full);
    groups_.push_back(std::move(grp));
    const int gi = static_cast<int>(groups_.size()) - 1;
    items_.push_back(Item{Item::kGroup, gi, -1});
    return gi;
  }
  // Takes back the kernel OpenGroup opened last.
  void DropNewestGroup() {
    groups_.pop_back();
    items_.pop_back();
  }
  int Add(Group& grp, GVal v) {
    grp.vals.push_back(std::move(v));
    return static_cast<int>(grp.vals.size()) - 1;
  }
  int BufferOf(Group& grp, ValueId root, bool written);
  // What a group holds before a node's values are added, to take them back
  // when building them fails after all.
  struct Mark {
    size_t vals, buffers, recomputed, stored;
  };
  Mark MarkOf(const Group& grp) const {
    return {grp.vals.size(), grp.buffers.size(), recomputed_.size(), stored_log_.size()};
  }
  void Rollback(Group& grp, const Mark& mark);
  // Recomputation: a pointwise value another kernel computes is computed
  // again in the kernel reading it, rather than stored there and read here,
  // within the policy's limits (nodes, and whole-space tensors the kernel
  // does not read yet). The decision is recorded; recomputed values of an
  // attempt that fails are forgotten (ForgetRecomputed).
  static constexpr int kMaxRecomputeDepth = 16;
  struct RecomputeCount {
    int nodes = 0;
    std::vector<ValueId> loads;
    std::vector<ValueId> counted;  // each value's node counts once
  };
  // Whether node `node` (-1: none) is a pointwise node of one output, the
  // kind recomputation may compute again.
  bool SinglePointwise(int node) const;
  // The level at which `grp` computes again a value of `sizes` that a
  // reader at `level` reads; nullopt when it cannot.
  std::optional<Level> RecomputeLevel(const Group& grp, const SymSizes& sizes, Level level) const;
  // Once a reduction has joined `grp`: the values it computed for each
  // element from broadcasts that hold one value per row of the reduction
  // (RecomputeLevel) become per-row values, so that per-row readers may use
  // them too.
  void BroadcastsToRows(Group& grp) const;
  bool RecomputeCost(const Group& grp, ValueId v, Level level, int depth,
                     RecomputeCount* count) const;
  // Whether `v` is a value of another kernel that the policy lets `grp`
  // compute again.
  bool WorthRecomputing(const Group& grp, ValueId v, Level level) const;
  absl::StatusOr<std::optional<int>> Recompute(Group& grp, ValueId v, Level level);
  // Recompute for a gather's value `v` (fuse_gather.cc): its spec read
  // over the kernel's space, which its output broadcasts to.
  absl::StatusOr<std::optional<int>> RecomputeGather(Group& grp, ValueId v, Level level);
  void ForgetRecomputed(size_t mark);
  void MarkStored(ValueId v);
  int ProducerItem(ValueId v) const {
    auto it = producer_item_.find(v);
    return it == producer_item_.end() ? -1 : it->second;
  }
  // The values of reduction node `node_index` in group `gi` (fresh: a
  // kernel opened for it), and its decision.
  absl::Status BuildReduction(int gi, int node_index, bool fresh, const std::string& not_fused);

  // --- emission (fuse_emit.cc) ---
  absl::StatusOr<Kernel> EmitKernel(int group_id);

  const ir::Graph& g_;
  const std::vector<NodeLowering>& nodes_;
  const FusionPolicy& policy_;
  std::vector<Item> items_;
  std::vector<Group> groups_;
  std::map<ValueId, int> producer_item_;   // graph inputs are absent (-1)
  std::map<ValueId, int> group_of_;        // values computed inside a group
  std::map<ValueId, Alias> alias_;         // views of materialized values
  std::map<ValueId, ValueId> reshape_of_;  // order-preserving view -> the value it views
  std::vector<std::string> decisions_;
  std::vector<std::pair<int, ValueId>> recomputed_;  // (group, value), in order
  std::vector<std::pair<int, ValueId>> stored_log_;  // MarkStored's insertions, in order
  std::set<ValueId> zeroed_;                         // scatter-add targets (FusedGraph::zeroed)
};

// Gathers (lower_gather.cc): whether `target` is one, and its lowering, a
// GatherSpec (or `out->why`, when kiln leaves the node to ATen).
bool IsGather(const std::string& target);
absl::Status LowerGather(const ir::Graph& g, const ir::Node& node, NodeLowering* out);
// Scatter-adds (NodeLowering::kScatter), likewise.
bool IsScatter(const std::string& target);
absl::Status LowerScatter(const ir::Graph& g, const ir::Node& node, NodeLowering* out);

// ---------------------------------------------------------------------------
// Pointwise lowering: a node becomes a small expression over its operands.

class Builder {
 public:
  // `space`: the sizes the values are built over (a node's output, or the
  // kernel's space it broadcasts to); empty where values are built per row.
  Builder(Group& grp, Level level, std::function<absl::StatusOr<int>(ValueId)> operand,
          const ops::OpCall& call, SymSizes space = {})
      : grp_(grp),
        level_(level),
        operand_(std::move(operand)),
        call_(call),
        space_(std::move(space)) {}

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
    return Op(ScalarOp::kCast, {id}, t);
  }
  int Op(ScalarOp op, std::vector<int> args, v1::DType t) {
    GVal v;
    v.kind = StmtKind::kOp;
    v.op = op;
    v.args = std::move(args);
    v.dtype = t;
    v.level = level_;
    return Add(std::move(v));
  }
  // Arithmetic in `t`'s computation type.
  int Ar(ScalarOp op, std::vector<int> args, v1::DType t) {
    for (int& a : args) a = Cast(a, Compute(t));
    return Op(op, std::move(args), Compute(t));
  }
  // The int64 value start + step * p_last at each point p of a node's
  // 1-d output of `size` elements (arange), right-aligned in the space.
  absl::StatusOr<int> Iota(const SymInt& size, int64_t start, int64_t step) {
    if (level_ != Level::kFull || space_.empty()) {
      return absl::FailedPreconditionError("an index value is built over a whole space only");
    }
    GVal v;
    v.kind = StmtKind::kIndex;
    v.dtype = v1::INT64;
    v.level = level_;
    v.over.assign(space_.size(), SymInt{int64_t{0}});
    if (!ops::IsConstant(size, 1)) v.over.back() = SymInt{step};
    v.offset = SymInt{start};
    return Add(std::move(v));
  }
  int Compare(ScalarOp op, int a, int b) {
    const v1::DType t = ops::PromoteTypes(D(a), D(b));
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
  SymSizes space_;
};

using PointwiseRule = std::function<absl::StatusOr<int>(Builder&, const ops::OpCall&, v1::DType)>;

// The pointwise ops' lowerings, by target (fuse_pointwise.cc).
const std::map<std::string, PointwiseRule>& PointwiseRules();

}  // namespace kiln::loop::fuse_internal

#endif  // KILN_COMPILER_LOOP_FUSE_INTERNAL_H_
