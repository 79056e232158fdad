#include "compiler/loop/fold_column_sums.h"

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "compiler/loop/kernel_edit.h"

namespace kiln::loop {
namespace {

using kernel_edit::Append;
using kernel_edit::Const;
using kernel_edit::ContiguousStrides;
using kernel_edit::HasGather;
using kernel_edit::MarkWritten;
using kernel_edit::Needed;
using kernel_edit::Product;

bool AllConstant(const std::vector<ir::SymInt>& sizes) {
  return std::all_of(sizes.begin(), sizes.end(),
                     [](const ir::SymInt& s) { return s.is_constant() && s.constant() > 0; });
}

// Why `c` cannot be folded into a row kernel, or "" when it can.
std::string ColumnIllegal(const Kernel& c) {
  if (c.passes != 1) return "more than one pass";
  if (HasGather(c)) return "a gather";
  if (c.row_groups > 0) return "row groups of its own";
  if (c.outer.empty() || c.inner.empty()) return "no inner or no outer dimensions";
  if (!AllConstant(c.outer) || !AllConstant(c.inner)) return "symbolic or empty sizes";
  bool sums = false;
  for (const Stmt& s : c.stmts) {
    if (s.kind == StmtKind::kAccumulate) return "sums across rows";
    if (!s.inner) continue;
    if (s.kind == StmtKind::kReduce && s.reduce != ReduceOp::kSum) {
      return "a reduction other than a sum";
    }
    sums = sums || s.kind == StmtKind::kReduce;
  }
  return sums ? "" : "no sums";
}

// The values a plan step reads or defines.
std::vector<std::string> StepNames(const v1::PlanStep& s) {
  std::vector<std::string> names;
  if (s.has_alloc()) names.push_back(s.alloc().value());
  if (s.has_launch()) names.assign(s.launch().buffers().begin(), s.launch().buffers().end());
  if (s.has_view()) {
    names.push_back(s.view().value());
    names.push_back(s.view().base());
  }
  if (s.has_extern_call()) {
    const v1::Node& node = s.extern_call().node();
    for (const auto& a : node.args()) {
      if (a.has_tensor()) names.push_back(a.tensor());
      if (a.has_tensors()) {
        for (const auto& n : a.tensors().names()) names.push_back(n);
      }
    }
    for (const auto& a : node.kwargs()) {
      if (a.has_tensor()) names.push_back(a.tensor());
    }
    for (const v1::Value& o : node.outputs()) names.push_back(o.name());
  }
  return names;
}

// The values `k` reads (buffers it loads) or writes.
std::set<std::string> Values(const Kernel& k, bool written) {
  std::set<std::string> out;
  for (const KernelBuffer& b : k.buffers) {
    if (b.written == written) out.insert(b.value);
  }
  return out;
}

// `k` without the buffers none of its statements reads or writes.
void DropUnusedBuffers(Kernel* k) {
  std::vector<int> renumber(k->buffers.size(), -1);
  for (const Stmt& s : k->stmts) {
    if (s.kind == StmtKind::kLoad || s.kind == StmtKind::kGather || s.kind == StmtKind::kStore ||
        s.kind == StmtKind::kAccumulate || s.kind == StmtKind::kScatterAdd) {
      renumber[s.buffer] = 0;
    }
  }
  std::vector<KernelBuffer> kept;
  for (size_t b = 0; b < k->buffers.size(); ++b) {
    if (renumber[b] < 0) continue;
    renumber[b] = static_cast<int>(kept.size());
    kept.push_back(std::move(k->buffers[b]));
  }
  k->buffers = std::move(kept);
  for (Stmt& s : k->stmts) {
    if (s.kind == StmtKind::kLoad || s.kind == StmtKind::kGather || s.kind == StmtKind::kStore ||
        s.kind == StmtKind::kAccumulate || s.kind == StmtKind::kScatterAdd) {
      s.buffer = renumber[s.buffer];
    }
  }
}

// The index of column-kernel access `s` in row kernel `r`'s space: the
// column kernel's outer dimensions are the row kernel's inner ones, and its
// inner ones the row kernel's outer ones.
Index Transposed(const Kernel& r, const Stmt& s) {
  Index index;
  index.outer_strides = s.inner && !s.index.inner_strides.empty()
                            ? s.index.inner_strides
                            : std::vector<ir::SymInt>(r.outer.size(), Const(0));
  index.inner_strides = s.index.outer_strides.empty()
                            ? std::vector<ir::SymInt>(r.inner.size(), Const(0))
                            : s.index.outer_strides;
  index.offset = s.index.offset;
  return index;
}

// The statement whose value `r` stores into `value` at `index` in the
// sweep of pass `pass` (the same dtype as the buffer's), or -1.
int StoredAt(const Kernel& r, const std::string& value, const Index& index, int pass) {
  for (size_t j = 0; j < r.stmts.size(); ++j) {
    const Stmt& s = r.stmts[j];
    if (s.kind != StmtKind::kStore || !s.inner || s.pass != pass) continue;
    if (r.buffers[s.buffer].value != value) continue;
    if (s.index.outer_strides != index.outer_strides ||
        s.index.inner_strides != index.inner_strides || !(s.index.offset == index.offset)) {
      continue;
    }
    // The value as stored: a store converts to the buffer's dtype.
    if (r.stmts[s.args[0]].dtype != r.buffers[s.buffer].dtype) continue;
    return s.args[0];
  }
  return -1;
}

struct Fold {
  Kernel merged;  // the row kernel with the column kernel's sweep
  Kernel finish;  // the column kernel over the groups' partials
  std::vector<KernelBuffer> partials;
};

// Whether statement `i` of `k` reads, directly or not, a reduction's result
// (arguments come before their readers: one walk in order).
bool AfterAReduction(const Kernel& k, int i) {
  std::vector<bool> after(static_cast<size_t>(i) + 1, false);
  for (int j = 0; j <= i; ++j) {
    const Stmt& s = k.stmts[j];
    after[j] = s.kind == StmtKind::kReduce ||
               std::any_of(s.args.begin(), s.args.end(), [&](int a) { return after[a]; });
  }
  return after[i];
}

bool SameStrides(const std::vector<ir::SymInt>& a, const std::vector<ir::SymInt>& b) {
  for (size_t d = 0; d < std::max(a.size(), b.size()); ++d) {
    const ir::SymInt x = d < a.size() ? a[d] : Const(0);
    const ir::SymInt y = d < b.size() ? b[d] : Const(0);
    if (!(x == y)) return false;
  }
  return true;
}

// A statement of `m` that computes what `s` (a load, constant or op of the
// last pass's sweep) would, and that the sweep can read: one of the sweep,
// or a per-row value made before it (the rsqrt of a saved mean that the row
// kernel computes once per row, and the column sums for each element).
// -1 when there is none.
int Equivalent(const Kernel& m, const Stmt& s, int last) {
  if (s.kind != StmtKind::kLoad && s.kind != StmtKind::kConstant && s.kind != StmtKind::kOp) {
    return -1;
  }
  for (int q = 0; q < static_cast<int>(m.stmts.size()); ++q) {
    const Stmt& t = m.stmts[q];
    if (t.kind != s.kind || t.dtype != s.dtype || t.args != s.args) continue;
    if (s.kind == StmtKind::kOp && t.op != s.op) continue;
    if (s.kind == StmtKind::kConstant && t.constant != s.constant) continue;
    if (s.kind == StmtKind::kLoad &&
        (t.buffer != s.buffer || !(t.index.offset == s.index.offset) ||
         !SameStrides(t.index.outer_strides, s.index.outer_strides) ||
         !SameStrides(t.inner ? t.index.inner_strides : std::vector<ir::SymInt>{},
                      s.index.inner_strides))) {
      continue;
    }
    const bool readable = t.inner ? t.pass == last : (t.pass < last || !AfterAReduction(m, q));
    if (readable) return q;
  }
  return -1;
}

// `r` with `c`'s sweep in its last pass, and `c` as the finishing kernel
// (its inner size set once the groups are known).
Fold Build(const Kernel& r, const Kernel& c, const std::string& base,
           const std::function<std::string(const std::string&)>& fresh) {
  Fold f;
  Kernel& m = f.merged;
  m = r;
  const int last = r.passes - 1;
  const int64_t row = Product(r.inner);
  std::vector<int> buf_of(c.buffers.size(), -1);
  auto buffer_in_merged = [&](int b) {
    if (buf_of[b] >= 0) return buf_of[b];
    for (size_t q = 0; q < m.buffers.size(); ++q) {
      if (m.buffers[q].value == c.buffers[b].value && m.buffers[q].dtype == c.buffers[b].dtype) {
        return buf_of[b] = static_cast<int>(q);
      }
    }
    m.buffers.push_back(KernelBuffer{c.buffers[b].value, c.buffers[b].dtype, false});
    return buf_of[b] = static_cast<int>(m.buffers.size()) - 1;
  };
  const int n = static_cast<int>(c.stmts.size());
  // The sweep's statements, and the values before it that the sweep reads
  // (a column's scale): all inner in the row kernel.
  std::vector<bool> sweep(n, false);
  for (int j = 0; j < n; ++j) {
    const Stmt& s = c.stmts[j];
    if (s.kind == StmtKind::kReduce) sweep[s.args[0]] = true;
    if (s.kind == StmtKind::kStore && s.inner) sweep[j] = true;
  }
  sweep = Needed(c, sweep, false);
  std::vector<int> at(n, -1);
  auto zeros = [](size_t count) { return std::vector<ir::SymInt>(count, Const(0)); };
  for (int j = 0; j < n; ++j) {
    if (!sweep[j]) continue;
    Stmt s = c.stmts[j];
    s.pass = last;
    s.inner = true;
    for (int& a : s.args) a = at[a];
    if (s.kind == StmtKind::kLoad || s.kind == StmtKind::kStore) {
      // The column kernel's outer dimensions are the row kernel's inner
      // ones, and its inner ones the row kernel's outer ones.
      s.buffer = buffer_in_merged(c.stmts[j].buffer);
      s.index = Transposed(r, c.stmts[j]);
      // A value the row kernel stores in its last sweep, read at the same
      // element, is that store's value.
      if (s.kind == StmtKind::kLoad) {
        const int own = StoredAt(r, m.buffers[s.buffer].value, s.index, last);
        if (own >= 0) {
          at[j] = own;
          continue;
        }
      }
    }
    if (const int same = Equivalent(m, s, last); same >= 0) {
      at[j] = same;
      continue;
    }
    at[j] = Append(&m, std::move(s));
  }
  // Each sum, accumulated per group into a [groups, row...] buffer.
  std::vector<ir::SymInt> group_strides = zeros(r.outer.size());
  group_strides[0] = Const(row);
  for (int j = 0; j < n; ++j) {
    const Stmt& s = c.stmts[j];
    if (s.kind != StmtKind::kReduce) continue;
    f.partials.push_back(
        KernelBuffer{fresh(absl::StrCat(base, "_rows", f.partials.size())), s.dtype, true});
    m.buffers.push_back(f.partials.back());
    Stmt acc;
    acc.kind = StmtKind::kAccumulate;
    acc.pass = last;
    acc.inner = true;
    acc.dtype = s.dtype;
    acc.args = {at[s.args[0]]};
    acc.buffer = static_cast<int>(m.buffers.size()) - 1;
    acc.index.outer_strides = group_strides;
    acc.index.inner_strides = ContiguousStrides(r.inner);
    Append(&m, std::move(acc));
  }
  MarkWritten(&m);

  // The finishing kernel: each column's partials summed, then the column
  // kernel's statements after its sweep.
  Kernel& g = f.finish;
  g.name = c.name;
  g.outer = c.outer;
  g.passes = 1;
  g.nodes = c.nodes;
  g.buffers = c.buffers;
  g.buffers.insert(g.buffers.end(), f.partials.begin(), f.partials.end());
  std::fill(at.begin(), at.end(), -1);
  int partial = 0;
  for (int j = 0; j < n; ++j) {
    const Stmt& s = c.stmts[j];
    if (s.kind != StmtKind::kReduce) continue;
    Stmt load;
    load.kind = StmtKind::kLoad;
    load.dtype = s.dtype;
    load.buffer = static_cast<int>(c.buffers.size()) + partial++;
    load.index.outer_strides = ContiguousStrides(c.outer);
    load.index.inner_strides = {Const(row)};
    Stmt sum = s;
    sum.pass = 0;
    sum.args = {Append(&g, std::move(load))};
    at[j] = Append(&g, std::move(sum));
  }
  std::vector<bool> epilogue(n, false);
  for (int j = 0; j < n; ++j) {
    epilogue[j] = !c.stmts[j].inner && c.stmts[j].kind == StmtKind::kStore;
  }
  epilogue = Needed(c, epilogue, false);
  for (int j = 0; j < n; ++j) {
    const Stmt& s = c.stmts[j];
    if (!epilogue[j] || s.kind == StmtKind::kReduce) continue;
    Stmt e = s;
    e.pass = 0;
    e.inner = false;
    for (int& a : e.args) a = at[a];
    if (e.kind == StmtKind::kLoad || e.kind == StmtKind::kStore) e.index.inner_strides = {Const(0)};
    at[j] = Append(&g, std::move(e));
  }
  MarkWritten(&g);
  DropUnusedBuffers(&g);
  return f;
}

class Folder {
 public:
  Folder(const ColumnSumPolicy& policy, LoweredGraph* lowered)
      : policy_(policy), lowered_(*lowered), plan_(lowered->plan) {
    for (const v1::Placeholder& p : plan_.inputs()) taken_.insert(p.value().name());
    for (const v1::PlanStep& s : plan_.steps()) {
      for (const std::string& name : StepNames(s)) taken_.insert(name);
    }
    for (const std::string& o : plan_.outputs()) taken_.insert(o);
  }

  // Folds one column kernel; false when none is left to fold.
  bool FoldOne() {
    for (size_t ci = 0; ci < lowered_.kernels.size(); ++ci) {
      const Kernel& c = lowered_.kernels[ci];
      if (tried_.count(c.name) > 0) continue;
      tried_.insert(c.name);
      const std::string illegal = ColumnIllegal(c);
      if (!illegal.empty()) continue;
      int best = -1, best_shared = 0;
      std::string why;
      for (size_t ri = 0; ri < lowered_.kernels.size(); ++ri) {
        const Kernel& r = lowered_.kernels[ri];
        if (ri == ci || r.row_groups > 0 || r.outer != c.inner || r.inner != c.outer) continue;
        const std::string refused = Refuse(r, c);
        if (!refused.empty()) {
          why = absl::StrCat(r.name, ": ", refused);
          continue;
        }
        const std::set<std::string> loads = Values(r, false);
        int shared = 0;
        for (const std::string& v : Values(c, false)) shared += loads.count(v);
        if (shared == 0) {
          why = absl::StrCat(r.name, ": it reads none of what ", c.name, " reads");
        } else if (shared > best_shared) {
          best = static_cast<int>(ri);
          best_shared = shared;
        }
      }
      if (best < 0) {
        if (!why.empty())
          lowered_.decisions.push_back(absl::StrCat("no fold: ", c.name, " into ", why));
        continue;
      }
      const Kernel& r = lowered_.kernels[best];
      Fold fold = Build(r, c, c.name, [this](const std::string& b) { return Fresh(b); });
      const int64_t groups = policy_.groups ? policy_.groups(fold.merged) : 0;
      if (groups <= 0) {
        lowered_.decisions.push_back(absl::StrCat("no fold: ", c.name, " into ", r.name,
                                                  ": the target's row kernel cannot take it"));
        continue;
      }
      fold.merged.row_groups = groups;
      fold.finish.inner = {Const(groups)};
      lowered_.decisions.push_back(absl::StrCat(
          "fold: ", c.name, "'s sums over rows into ", r.name, " (", groups, " row groups, ",
          fold.partials.size(), " partial buffer", fold.partials.size() == 1 ? "" : "s", "); ",
          c.name, " adds up the groups' partials"));
      Rewrite(r.name, c.name, groups, fold);
      std::vector<Kernel> kernels;
      for (size_t q = 0; q < lowered_.kernels.size(); ++q) {
        if (q == ci) continue;
        if (static_cast<int>(q) == best) {
          kernels.push_back(std::move(fold.merged));
          kernels.push_back(std::move(fold.finish));
          continue;
        }
        kernels.push_back(std::move(lowered_.kernels[q]));
      }
      lowered_.kernels = std::move(kernels);
      return true;
    }
    return false;
  }

 private:
  int LaunchOf(const std::string& symbol) const {
    for (int i = 0; i < plan_.steps_size(); ++i) {
      const v1::PlanStep& s = plan_.steps(i);
      if (s.has_launch() && s.launch().symbol() == symbol) return i;
    }
    return -1;
  }

  const Kernel* KernelNamed(const std::string& name) const {
    for (const Kernel& k : lowered_.kernels) {
      if (k.name == name) return &k;
    }
    return nullptr;
  }

  // Why `c` cannot join `r` where the plan launches them, or "".
  std::string Refuse(const Kernel& r, const Kernel& c) const {
    const int rl = LaunchOf(r.name), cl = LaunchOf(c.name);
    if (rl < 0 || cl < 0) return "not launched once each by the plan";
    if (HasGather(r)) return "the row kernel gathers";
    int launches = 0;
    for (const v1::PlanStep& s : plan_.steps()) {
      launches +=
          s.has_launch() && (s.launch().symbol() == r.name || s.launch().symbol() == c.name);
    }
    if (launches != 2) return "launched more than once";
    bool passes = false;
    for (const Stmt& s : r.stmts) passes = passes || (s.inner && s.pass == r.passes - 1);
    if (!passes) return "its last pass has no sweep";
    const std::set<std::string> c_reads = Values(c, false), c_writes = Values(c, true);
    const std::set<std::string> r_writes = Values(r, true);
    for (const KernelBuffer& b : r.buffers) {
      if (c_writes.count(b.value) > 0)
        return absl::StrCat("it reads ", b.value, ", which ", c.name, " writes");
    }
    // What the column kernel reads of the row kernel's results, it must
    // read where the row kernel's last sweep stores them.
    std::set<std::string> own;
    for (const Stmt& s : c.stmts) {
      if (s.kind != StmtKind::kLoad) continue;
      const std::string& v = c.buffers[s.buffer].value;
      if (r_writes.count(v) == 0) continue;
      if (StoredAt(r, v, Transposed(r, s), r.passes - 1) < 0) {
        return absl::StrCat("it writes ", v, ", which ", c.name,
                            " reads elsewhere than its last sweep stores it");
      }
      own.insert(v);
    }
    // What the column kernel reads is ready where the row kernel runs.
    std::set<std::string> ready;
    for (const v1::Placeholder& p : plan_.inputs()) ready.insert(p.value().name());
    for (int i = 0; i < rl; ++i) {
      const v1::PlanStep& s = plan_.steps(i);
      if (s.has_launch()) {
        const Kernel* k = KernelNamed(s.launch().symbol());
        if (k != nullptr) {
          for (const KernelBuffer& b : k->buffers) {
            if (b.written) ready.insert(b.value);
          }
        }
      }
      if (s.has_view() && ready.count(s.view().base()) > 0) ready.insert(s.view().value());
      if (s.has_extern_call()) {
        for (const v1::Value& o : s.extern_call().node().outputs()) ready.insert(o.name());
      }
    }
    for (const std::string& v : c_reads) {
      if (ready.count(v) == 0 && own.count(v) == 0) {
        return absl::StrCat(v, " is not ready where it runs");
      }
    }
    // Nothing between the two launches touches what the column kernel
    // writes (their allocations aside, which move).
    std::set<std::string> written = c_writes;
    for (const v1::PlanStep& s : plan_.steps()) {
      if (s.has_view() && written.count(s.view().base()) > 0) written.insert(s.view().value());
    }
    for (int i = std::min(rl, cl) + 1; i < std::max(rl, cl); ++i) {
      const v1::PlanStep& s = plan_.steps(i);
      if (s.has_alloc()) continue;
      for (const std::string& name : StepNames(s)) {
        if (written.count(name) > 0) {
          return absl::StrCat("a step between the two uses ", name, ", which ", c.name, " writes");
        }
      }
    }
    return "";
  }

  std::string Fresh(const std::string& base) {
    std::string name = base;
    for (int n = 1; taken_.count(name) > 0; ++n) name = absl::StrCat(base, "_", n);
    taken_.insert(name);
    return name;
  }

  // The plan launches the merged kernel where it launched `row`, the
  // partials allocated before it, and the finishing kernel after it; the
  // column kernel's own launch goes, and its outputs' allocations, when
  // they came after the row kernel, move before it (the merged kernel
  // stores what the column kernel's sweep stored).
  void Rewrite(const std::string& row, const std::string& column, int64_t groups,
               const Fold& fold) {
    const int rl = LaunchOf(row), cl = LaunchOf(column);
    const v1::PlanStep::Launch& launch = plan_.steps(rl).launch();
    std::set<std::string> outputs = Values(fold.finish, true);
    for (const KernelBuffer& b : fold.merged.buffers) {
      if (b.written) outputs.insert(b.value);
    }
    // The partials live where the row kernel's buffers do.
    v1::Device device;
    device.set_type("cuda");
    std::set<std::string> own(launch.buffers().begin(), launch.buffers().end());
    bool found = false;
    for (const v1::PlanStep& s : plan_.steps()) {
      if (s.has_alloc() && own.count(s.alloc().value()) > 0) {
        device = s.alloc().device();
        found = true;
        break;
      }
    }
    for (int i = 0; !found && i < plan_.inputs_size(); ++i) {
      if (own.count(plan_.inputs(i).value().name()) > 0) {
        device = plan_.inputs(i).value().meta().device();
        found = true;
      }
    }
    std::vector<v1::PlanStep> moved;
    google::protobuf::RepeatedPtrField<v1::PlanStep> steps;
    const v1::PlanStep row_step = plan_.steps(rl);
    for (int i = 0; i < plan_.steps_size(); ++i) {
      v1::PlanStep& s = *plan_.mutable_steps(i);
      if (i == cl) continue;
      if (i > rl && i < cl && s.has_alloc() && outputs.count(s.alloc().value()) > 0) continue;
      if (i != rl) {
        *steps.Add() = std::move(s);
        continue;
      }
      std::vector<ir::SymInt> sizes = {Const(groups)};
      sizes.insert(sizes.end(), fold.merged.inner.begin(), fold.merged.inner.end());
      const std::vector<ir::SymInt> strides = ContiguousStrides(sizes);
      for (const KernelBuffer& p : fold.partials) {
        v1::PlanStep::Alloc* alloc = steps.Add()->mutable_alloc();
        alloc->set_value(p.value);
        alloc->set_dtype(p.dtype);
        for (const ir::SymInt& d : sizes) *alloc->add_sizes() = ir::SymIntToProto(d);
        for (const ir::SymInt& d : strides) *alloc->add_strides() = ir::SymIntToProto(d);
        *alloc->mutable_device() = device;
      }
      auto add_launch = [&](const Kernel& k) {
        v1::PlanStep::Launch* l = steps.Add()->mutable_launch();
        l->set_module(row_step.launch().module());
        l->set_symbol(k.name);
        for (const KernelBuffer& b : k.buffers) l->add_buffers(b.value);
      };
      for (int q = rl + 1; q < cl; ++q) {
        const v1::PlanStep& a = plan_.steps(q);
        if (a.has_alloc() && outputs.count(a.alloc().value()) > 0) *steps.Add() = a;
      }
      add_launch(fold.merged);
      add_launch(fold.finish);
    }
    *plan_.mutable_steps() = std::move(steps);
  }

  const ColumnSumPolicy& policy_;
  LoweredGraph& lowered_;
  v1::ExecutionPlan& plan_;
  std::set<std::string> taken_;
  std::set<std::string> tried_;
};

}  // namespace

void FoldColumnSums(const ColumnSumPolicy& policy, LoweredGraph* lowered) {
  Folder folder(policy, lowered);
  while (folder.FoldOne()) {
  }
}

}  // namespace kiln::loop
