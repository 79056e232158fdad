// Small helpers of the passes that rewrite kernels' statements
// (split_reductions.cc, fold_column_sums.cc): constant sizes, statement
// lists, which buffers a kernel writes. Internal to compiler/loop.
#ifndef KILN_COMPILER_LOOP_KERNEL_EDIT_H_
#define KILN_COMPILER_LOOP_KERNEL_EDIT_H_

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "compiler/loop/kernel.h"

namespace kiln::loop::kernel_edit {

inline ir::SymInt Const(int64_t v) { return ir::SymInt{v}; }

// The product of constant sizes.
inline int64_t Product(const std::vector<ir::SymInt>& sizes) {
  int64_t n = 1;
  for (const ir::SymInt& s : sizes) n *= s.constant();
  return n;
}

// Row-major strides of constant sizes.
inline std::vector<ir::SymInt> ContiguousStrides(const std::vector<ir::SymInt>& sizes) {
  std::vector<ir::SymInt> strides(sizes.size());
  int64_t stride = 1;
  for (size_t d = sizes.size(); d-- > 0;) {
    strides[d] = Const(stride);
    stride *= sizes[d].constant();
  }
  return strides;
}

// Appends `s` to `k`'s statements; returns its index.
inline int Append(Kernel* k, Stmt s) {
  k->stmts.push_back(std::move(s));
  return static_cast<int>(k->stmts.size()) - 1;
}

// Whether `k` gathers, scatters or computes index values (StmtKind::kGather,
// kScatterAdd, kIndex): the passes that move a kernel's accesses into another space
// leave such a kernel as it is.
inline bool HasGather(const Kernel& k) {
  for (const Stmt& s : k.stmts) {
    if (s.kind == StmtKind::kGather || s.kind == StmtKind::kIndex ||
        s.kind == StmtKind::kScatterAdd) {
      return true;
    }
  }
  return false;
}

// Marks written exactly the buffers that `k`'s statements store into or
// accumulate into.
inline void MarkWritten(Kernel* k) {
  for (KernelBuffer& b : k->buffers) b.written = false;
  for (const Stmt& s : k->stmts) {
    if (s.kind == StmtKind::kStore || s.kind == StmtKind::kAccumulate ||
        s.kind == StmtKind::kScatterAdd) {
      k->buffers[s.buffer].written = true;
    }
  }
}

// Which statements `keep` needs: those it names and, transitively, their
// arguments, except through reductions when `through_reductions` is false.
inline std::vector<bool> Needed(const Kernel& k, std::vector<bool> keep,
                                bool through_reductions = true) {
  for (size_t j = k.stmts.size(); j-- > 0;) {
    if (!keep[j]) continue;
    if (!through_reductions && k.stmts[j].kind == StmtKind::kReduce) continue;
    for (int a : k.stmts[j].args) keep[a] = true;
  }
  return keep;
}

// `k` without the statements no store or accumulation needs (values its
// readers elsewhere compute again), and without the trailing passes left
// empty.
inline void DropUnneeded(Kernel* k) {
  std::vector<bool> keep(k->stmts.size(), false);
  for (size_t j = 0; j < k->stmts.size(); ++j) {
    const StmtKind kind = k->stmts[j].kind;
    keep[j] =
        kind == StmtKind::kStore || kind == StmtKind::kAccumulate || kind == StmtKind::kScatterAdd;
  }
  keep = Needed(*k, std::move(keep));
  // A Welford M2 is read off the accumulator its mean names (the same
  // argument): the mean stays with it.
  for (size_t j = 0; j < k->stmts.size(); ++j) {
    const Stmt& m2 = k->stmts[j];
    if (!keep[j] || m2.kind != StmtKind::kReduce || m2.reduce != ReduceOp::kWelfordM2) continue;
    for (size_t q = 0; q < k->stmts.size(); ++q) {
      const Stmt& mean = k->stmts[q];
      if (mean.kind == StmtKind::kReduce && mean.reduce == ReduceOp::kWelfordMean &&
          mean.pass == m2.pass && mean.args == m2.args) {
        keep[q] = true;
      }
    }
  }
  std::vector<int> at(k->stmts.size(), -1);
  std::vector<Stmt> kept;
  int passes = 1;
  for (size_t j = 0; j < k->stmts.size(); ++j) {
    if (!keep[j]) continue;
    Stmt s = std::move(k->stmts[j]);
    for (int& a : s.args) a = at[a];
    passes = std::max(passes, s.pass + 1);
    at[j] = static_cast<int>(kept.size());
    kept.push_back(std::move(s));
  }
  k->stmts = std::move(kept);
  k->passes = std::min(k->passes, passes);
}

}  // namespace kiln::loop::kernel_edit

#endif  // KILN_COMPILER_LOOP_KERNEL_EDIT_H_
