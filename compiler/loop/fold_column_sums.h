// Pass "fold-column-sums": a kernel that sums over rows what a row kernel
// reads along those rows is folded into the row kernel. A norm layer's
// backward reads its input and output gradient twice without it: the row
// kernel computes each row's input gradient, and a column kernel the
// weight's and bias's gradients, each a sum over the rows:
//
//   kernel_1: outer [4096] inner [16384]   dw = sum over rows of dy * xhat
//   kernel_2: outer [16384] inner [4096]   dx, row by row
//   ->  kernel_2: outer [16384] inner [4096] groups 528
//                 dx, row by row, and each group's partial sums of dw
//       kernel_1: outer [4096] inner [528]  the partials added up, then
//                 kernel_1's statements after its sweep (a cast, a store)
//
// The row kernel deals its rows into G groups (Kernel::row_groups); the
// column kernel's sweep, its loads transposed into the row kernel's space,
// joins the row kernel's last pass, each of its sums a kAccumulate into a
// new [G, row] buffer of partials; the column kernel itself becomes the
// finishing kernel over the G partials of each column. Sums are
// reassociated, as a block reduction already does.
//
// Legal where the column kernel is one pass of constant sizes, its sweep
// loads, constants, scalar ops and sums only; the row kernel's outer space
// is the column kernel's inner space and its inner space the column
// kernel's outer space; neither reads what the other writes; every value
// the column kernel reads is ready where the row kernel runs (written by a
// step before it, or an input); and no step between the two touches what
// the column kernel writes. Of the legal row kernels, the one that shares
// the most loads with the column kernel takes it; one sharing none is not
// worth it.
//
// Profitability and G are the target's (`ColumnSumPolicy`). The plan
// launches the row kernel with the partials allocated before it and the
// finishing kernel right after it; the column kernel's launch goes. It runs
// after the plan is built and before split-reductions (split_reductions.h)
// and the memory plan. Every fold and every refusal of a candidate is in
// `decisions` ("fold: ...", "no fold: ...").
#ifndef KILN_COMPILER_LOOP_FOLD_COLUMN_SUMS_H_
#define KILN_COMPILER_LOOP_FOLD_COLUMN_SUMS_H_

#include <cstdint>
#include <functional>

#include "compiler/loop/kernel.h"
#include "compiler/loop/plan_build.h"

namespace kiln::loop {

struct ColumnSumPolicy {
  // The row groups the target gives `merged` (a row kernel with a column
  // kernel's sums folded in, row_groups not yet set); 0: do not fold.
  std::function<int64_t(const Kernel& merged)> groups;
};

// Folds the column kernels of `lowered` that `policy` takes into row
// kernels, rewriting its kernels and plan.
void FoldColumnSums(const ColumnSumPolicy& policy, LoweredGraph* lowered);

}  // namespace kiln::loop

#endif  // KILN_COMPILER_LOOP_FOLD_COLUMN_SUMS_H_
