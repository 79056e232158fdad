// A parser for the loop IR as PrintKernel (compiler/loop/kernel.h) prints
// it, so that pass tests read as text in, text out:
//
//   kernel kernel_0: outer [8] inner [32] passes 1
//     nodes: sum
//     buffers:
//       buf0 = x : f32
//       buf1 = sum : f32 (written)
//     %0 = load buf0[o0*32 + i0*1 + 0] : f32 [pass 0, inner]
//     %1 = reduce sum %0 : f32 [pass 0, inner]
//     store buf1[o0*1 + 0] = %1 [pass 0, outer]
//
// Round trip: for every kernel the lowering and the split-reductions pass
// make, PrintKernel(*ParseKernel(PrintKernel(k))) == PrintKernel(k), and the
// parsed kernel equals `k` in every field the printer shows. What the
// printer leaves out is rebuilt as the lowering sets it:
//   - an index holds one stride per outer and one per inner dimension of the
//     kernel; a dimension its text does not mention has stride 0;
//   - `%j` is statement j; a store has no number and takes the next position
//     (so the numbers after it skip one), and the numbers must agree;
//   - a store's dtype is its buffer's;
//   - fields a statement's kind does not use keep Stmt's defaults.
// What cannot be recovered:
//   - a symbolic ir::SymInt whose text is a bare integer ("4", "-1" held as
//     a string) reads back as that constant (a parenthesized stride stays
//     symbolic: "(-1)");
//   - stride vectors whose lengths differ from the kernel's dimension
//     counts (the lowering makes none);
//   - an offset that begins with a symbol spelled like an index variable
//     ("o0*2", "i1*4") reads as a stride term.
//
// The text: one line per header, `nodes:` (optional), `buffers:`, buffer
// and statement, in the printer's spelling; leading and trailing
// whitespace of a line is ignored, and so are lines starting with '#'.
// Sizes, strides and offsets are ir::SymExpr text (compiler/ir/sym_expr.h)
// or integers; constants are C numbers, "inf", "-inf" or "nan". Statements
// read only earlier statements that are not stores, ops take their arity of
// operands, every pass lies in [0, passes), and a kernel has at most 64
// outer and 64 inner dimensions (so that its memory stays linear in its
// text).
//
// Malformed text is INVALID_ARGUMENT naming the line and what was expected
// there ("line 5: expected ' = ' after '%3'"), quoting at most a short
// prefix of the text. Parsing takes time linear in the text.
//
// Pure functions; thread-safe.
#ifndef KILN_COMPILER_LOOP_KERNEL_PARSER_H_
#define KILN_COMPILER_LOOP_KERNEL_PARSER_H_

#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "compiler/loop/kernel.h"

namespace kiln::loop {

// The one kernel `text` holds (blank and '#' lines around it are allowed).
absl::StatusOr<Kernel> ParseKernel(absl::string_view text);

// Kernels one after another, as PrintLowered's "# kernels" section lists
// them: each starts at its `kernel` line and ends at a blank line, the next
// `kernel` line or the end of the text. Empty text is no kernels.
absl::StatusOr<std::vector<Kernel>> ParseKernels(absl::string_view text);

}  // namespace kiln::loop

#endif  // KILN_COMPILER_LOOP_KERNEL_PARSER_H_
