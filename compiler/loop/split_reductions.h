// Pass "split-reductions": a reduction kernel with too few rows to fill the
// device is split. A partial kernel reduces S slices of each row into a
// partial result per slice ([S, rows] in a new buffer of the reduction's
// type); a finishing kernel reduces the S partials of each row and runs the
// epilogue (the statements after the sweep, its per-row stores):
//
//   kernel_0: outer [4096] inner [16384]        sum over 16384 rows, 128 blocks
//   ->  kernel_0_partial: outer [4, 4096] inner [4096]   512 blocks
//       kernel_0: outer [4096] inner [4]                 the epilogue
//
// A kernel of several passes (batch norm: the channel's mean and variance,
// then every element normalized with them) also gets a pointwise kernel
// that runs the later passes over the whole space, reading the per-row
// values the finishing kernel stored ([rows] buffers).
//
// Legal for kernels whose reductions are sums, maxima, minima or Welford
// means and M2s, all in the first pass; whose later passes read only that
// pass's per-row values; whose sizes and strides are constants; and whose
// first inner dimension divides into S slices. The slices partition each
// row: sums, maxima and minima of partials are the row's; Welford's merge
// by Chan's formula for equal counts (the mean of the slices' means; the
// sum of their M2s plus the count times the squared deviations of their
// means). Floating-point sums are reassociated, as a block reduction
// already does. Kernels with reductions in later passes (softmax) stay
// whole.
//
// Profitability is the target's: `SplitPolicy` says how many blocks a
// kernel launches and how many the device wants. Where the plan launched
// the kernel, it now allocates the new buffers (on the device of the
// kernel's own buffers, under names no plan value has) and launches the new
// kernels. It runs after the plan is built and before the memory plan
// (memory_plan.h), which frees the new buffers after their last reader.
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
  // Where set, the same for each kernel (a block that reduces many rows at
  // once does enough work on fewer elements of each).
  std::function<int64_t(const Kernel&)> min_slice_of;
  // Where set and true for a kernel, its slices are the most that divide
  // the row up to the number wanted, when they launch nine tenths of
  // `min_blocks` or more, rather than the fewest from the number wanted
  // up: fewer, longer slices for blocks whose sweep ends in a reduction
  // across their warps.
  std::function<bool(const Kernel&)> fewer_slices_of;
};

// Splits the reduction kernels of `lowered` that `policy` finds too narrow,
// rewriting its kernels and plan.
void SplitReductions(const SplitPolicy& policy, LoweredGraph* lowered);

}  // namespace kiln::loop

#endif  // KILN_COMPILER_LOOP_SPLIT_REDUCTIONS_H_
