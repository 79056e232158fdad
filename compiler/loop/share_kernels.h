// Pass "share-kernels": kernels whose code would be the same (the same
// KernelCode: loop IR but for their names, the nodes they came from and the
// plan values their buffers are bound to) are compiled once. The middle
// layers of a model of N identical layers fuse into copies of the same
// kernels; every launch of a copy now names the first of them, and the
// copies are dropped, so that NVRTC or g++ compiles (and the autotuner
// times) about one layer's worth.
//
// Launches pass their own buffers (v1::PlanStep::Launch::buffers) and the
// graph's symbols, so a shared kernel runs on each launch's tensors. Runs
// after every pass that adds or changes kernels (split-reductions) and
// before autotuning and code generation. Each sharing is in `decisions`
// ("share: kernel_7 runs kernel_3's code").
//
// Pure function; thread-safe.
#ifndef KILN_COMPILER_LOOP_SHARE_KERNELS_H_
#define KILN_COMPILER_LOOP_SHARE_KERNELS_H_

#include "compiler/loop/plan_build.h"

namespace kiln::loop {

// Drops the kernels of `lowered` whose KernelCode an earlier one has, and
// points their launches at that one. Returns how many were dropped.
int ShareIdenticalKernels(LoweredGraph* lowered);

}  // namespace kiln::loop

#endif  // KILN_COMPILER_LOOP_SHARE_KERNELS_H_
