// Pass "fuse" (fuse.h), emission: a fused kernel's values become
// loop::Kernel statements, pass by pass: whole-space values in each pass's
// sweep (recomputed in every pass that needs them), per-row values and their
// stores after it.
#include <algorithm>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "compiler/loop/fuse_internal.h"

namespace kiln::loop::fuse_internal {
namespace {

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
  if (v.kind == StmtKind::kLoad || v.kind == StmtKind::kGather || v.kind == StmtKind::kIndex) {
    s.index = LoadIndex(v, outer, inner);
  }
  s.gather_strides = v.gather_strides;
  s.gather_sizes = v.gather_sizes;
  s.gather_wraps = v.gather_wraps;
  return s;
}

}  // namespace

absl::StatusOr<Kernel> Fuser::EmitKernel(int gi) {
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
  // Per-row values that a reduction of their own pass precedes: they exist
  // after that pass's sweep. The others (a batch norm's rsqrt of a variance
  // the kernel loads) are computed before the sweep and read inside it.
  std::vector<bool> after_sweep(vals.size(), false);
  std::function<int(int)> pass_of = [&](int i) -> int {
    if (pass[i] >= 0) return pass[i];
    const GVal& v = vals[i];
    int p = 0;
    // A whole-space value or a reduction (whose sweep broadcasts it over
    // the row, e.g. a softmax over the size-1 dim of a mean kept as [n, 1])
    // reads a per-row value of a reduction in a later pass.
    const bool v_row = v.level != Level::kFull && v.kind != StmtKind::kReduce;
    for (int a : v.args) {
      const int pa = pass_of(a);
      p = std::max(p, pa + (after_sweep[a] && !v_row ? 1 : 0));
    }
    if (auto r = reload_after.find(i); r != reload_after.end())
      p = std::max(p, pass_of(r->second) + 1);
    if (v.kind == StmtKind::kReduce) {
      after_sweep[i] = true;
    } else if (v_row) {
      for (int a : v.args) after_sweep[i] = after_sweep[i] || (pass[a] == p && after_sweep[a]);
    }
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
  // values are emitted once, before or after the sweep of their pass.
  std::vector<int> row_stmt(vals.size(), -1);
  // The per-row values of pass `p` computed before its sweep (`before`) or
  // after it.
  auto emit_rows = [&](int p, bool before) {
    for (size_t i = 0; i < vals.size(); ++i) {
      const GVal& v = vals[i];
      if (v.level == Level::kFull || v.kind == StmtKind::kReduce || pass[i] != p ||
          after_sweep[i] == before) {
        continue;
      }
      Stmt s = StmtOf(v, p, /*in_sweep=*/false, outer, inner);
      for (int a : v.args) s.args.push_back(row_stmt[a]);
      k.stmts.push_back(std::move(s));
      row_stmt[i] = static_cast<int>(k.stmts.size()) - 1;
    }
  };
  for (int p = 0; p < passes; ++p) {
    emit_rows(p, /*before=*/true);
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
    // Scatter-adds, in the pass of their value.
    for (const Group::Scatter& sc : grp.scatters) {
      if (pass[sc.value] != p) continue;
      Stmt s = StmtOf(sc.at, p, /*in_sweep=*/true, outer, inner);
      s.kind = StmtKind::kScatterAdd;
      s.buffer = sc.buffer;
      s.dtype = g_.value(sc.into).meta.dtype;
      s.index = LoadIndex(sc.at, outer, inner);
      s.args = {emit_full(sc.value)};
      for (int a : sc.args) s.args.push_back(emit_full(a));
      k.stmts.push_back(std::move(s));
    }
    // Outer level, after the sweep: the other per-row values of this pass,
    // and the stores of them all.
    emit_rows(p, /*before=*/false);
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

}  // namespace kiln::loop::fuse_internal
