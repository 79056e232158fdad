// Pass "sweep-order" (GPU targets): a kernel launched right after an ATen
// op whose output it reads (a matmul, a convolution) sweeps its outer work
// from the last rows to the first (Kernel::reversed).
//
// cuBLAS and cuDNN write an output about in order, so that the end of a
// large one is what L2 still holds when the next kernel starts; a kernel
// whose first blocks take the first rows reads all of it from DRAM, and
// has evicted the end by the time it gets there. Reversed, its first blocks
// read the end from L2. On an H100, the softmax over a [16384, 1024]
// float32 matmul output: 50.1 us in order, 45.9 us reversed; a GELU over a
// [4096, 3072] one: 35.6 and 34.8 us (tests/gpu/time_cubins.py, after_mm).
//
// "Right after": no launch or ATen op between them (allocations, views and
// frees do not count). A kernel launched more than once is reversed only
// when every launch is. Runs after the passes that add kernels
// (split-reductions, cat-in-place) and before share-kernels, so that
// kernels share code only with kernels of the same order. Each reversal is
// in `decisions` ("reverse: kernel_5 reads addmm_2, which aten.mm.default
// wrote just before it").
//
// Pure function; thread-safe.
#ifndef KILN_COMPILER_LOOP_SWEEP_ORDER_H_
#define KILN_COMPILER_LOOP_SWEEP_ORDER_H_

#include "compiler/loop/plan_build.h"

namespace kiln::loop {

// Marks such kernels of `lowered` reversed; returns how many.
int ReverseAfterExterns(LoweredGraph* lowered);

// Pass "streamed-loads" (GPU targets): marks a kernel's buffer streamed
// (KernelBuffer::streamed) when the kernel loads it in one pass only, does
// not write it, and no step after its launch reads that storage again (no
// launch loads it, no ATen op takes it, directly or through a view), for
// every launch of the kernel. Such loads can tell L2 to drop the lines
// first: a bfloat16 column sum's partial over [8192, 8192] read its input
// in 35.6-35.8 us with streaming loads against 36.3 us (H200,
// tests/gpu/time_cubins.py). A gradient that a later matmul reads again
// (a bias gradient's) is not marked. Runs after share-kernels, so that a
// kernel launched more than once is judged by all its launches. Returns
// how many buffers it marked.
int MarkStreamedLoads(LoweredGraph* lowered);

}  // namespace kiln::loop

#endif  // KILN_COMPILER_LOOP_SWEEP_ORDER_H_
