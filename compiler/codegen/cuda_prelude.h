// The prelude of every CUDA translation unit the CUDA backend generates: the
// fixed-width integer types and INT64_C (NVRTC compiles without the C
// library's headers), kiln_dev (numeric_limits and the math functions the
// C-family emitters name through their Dialect), float16 and bfloat16
// conversions, the pointwise math of ATen's definitions (the same helpers the
// C++ prelude defines for CPUs), and the warp and block reductions.
//
// Internal to compiler/codegen.
#ifndef KILN_COMPILER_CODEGEN_CUDA_PRELUDE_H_
#define KILN_COMPILER_CODEGEN_CUDA_PRELUDE_H_

// kiln::codegen::kCudaPrelude: the text of compiler/codegen/prelude/cuda.inc, a
// real CUDA source compiled and tested on its own
// (the kiln_cuda_prelude_compiles test, NVRTC), embedded at build time.
#include "compiler/codegen/prelude_cuda_text.h"

#endif  // KILN_COMPILER_CODEGEN_CUDA_PRELUDE_H_
