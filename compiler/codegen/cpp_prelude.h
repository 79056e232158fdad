// The prelude of every translation unit the C++ backend generates: libm's
// functions through glibc's vector math library (the same bits in every
// loop), float16 and bfloat16 conversions, an inline float exp, and the
// pointwise math of ATen's definitions.
//
// Internal to compiler/codegen.
#ifndef KILN_COMPILER_CODEGEN_CPP_PRELUDE_H_
#define KILN_COMPILER_CODEGEN_CPP_PRELUDE_H_

// kiln::codegen::kCppPrelude: the text of compiler/codegen/prelude/cpu.inc, a
// real C++ source compiled and tested on its own
// (compiler/codegen/prelude_test.cc), embedded at build time.
#include "compiler/codegen/prelude_cpu_text.h"

#endif  // KILN_COMPILER_CODEGEN_CPP_PRELUDE_H_
