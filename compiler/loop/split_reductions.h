// Pass "split-reductions": a reduction kernel with too few rows to fill the
// device becomes two kernels. The first reduces S slices of each row into a
// partial result per slice ([S, rows] in a new float32-or-wider buffer), the
// second reduces the S partials of each row and runs the kernel's epilogue
// (the statements after the sweep, its per-row stores):
//
//   kernel_0: outer [4096] inner [16384]        sum over 16384 rows, 128 blocks
//   ->  kernel_0_partial: outer [4, 4096] inner [4096]   512 blocks
//       kernel_0: outer [4096] inner [4]                 the epilogue
//
// Legal for a kernel of one pass whose reductions are sums, maxima or
// minima, whose sizes are constants, and whose first inner dimension S
// divides; the slices then partition each row, and sums, maxima and minima
// of partials are those of the row. (Floating-point sums are reassociated,
// as a block reduction already does.) Welford and multi-pass kernels (whose
// later passes read the row again after a reduction) are left as they are.
//
// Profitability is the target's: `SplitPolicy` says how many blocks a
// kernel launches and how many the device wants. The plan gets the
// partials' allocation before the first launch and their free after the
// second.
//
// Every split and every refusal of a kernel that had too few blocks is in
// `decisions` ("split: ...", "no split: ...").
#ifndef KILN_COMPILER_LOOP_SPLIT_REDUCTIONS_H_
#define KILN_COMPILER_LOOP_SPLIT_REDUCTIONS_H_

#include <cstdint>
#include <functional>
#include <optional>

#include "compiler/loop/lowering.h"

namespace kiln::loop {

struct SplitPolicy {
  // The blocks the target launches for a kernel; nullopt when not known
  // (symbolic sizes): the kernel is left alone.
  std::function<std::optional<int64_t>(const Kernel&)> blocks;
  // Split kernels that launch fewer blocks than `split_below`, into enough
  // slices to launch at least `min_blocks`.
  int64_t split_below = 132;
  int64_t min_blocks = 264;
  // Elements each slice of a row keeps at least.
  int64_t min_slice = 2048;
};

// Splits the reduction kernels of `lowered` that `policy` finds too narrow,
// rewriting its kernels and plan.
void SplitReductions(const SplitPolicy& policy, LoweredGraph* lowered);

}  // namespace kiln::loop

#endif  // KILN_COMPILER_LOOP_SPLIT_REDUCTIONS_H_
