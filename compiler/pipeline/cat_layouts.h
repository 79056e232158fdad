// Cat operand layouts (pass name "cat-layouts"): an operand of a
// concatenation (aten.cat, which runs through ATen) that is a strided view,
// not row-major in its last dim, is first copied to a contiguous tensor by
// a generated kernel, which tiles the transpose; ATen's cat then reads every
// operand along memory. A GPT-2 block's backward concatenates dq, dk and dv
// into the qkv projection's gradient, and dk arrives as a transposed view
// of its bmm (bfloat16, heads of 192, on an H100: 37 us per block for ATen's
// cat with that operand, where one row-major copy of the three takes 13 us).
//
//   cat([.., x (strides [.., s, .., k != 1]), ..], dim)
//     -> cat([.., clone(x, contiguous), ..], dim)
//
// Pure function; thread-safe.
#ifndef KILN_COMPILER_PIPELINE_CAT_LAYOUTS_H_
#define KILN_COMPILER_PIPELINE_CAT_LAYOUTS_H_

#include "absl/status/statusor.h"
#include "compiler/ir/graph.h"

namespace kiln::pipeline {

// Rewrites every strided operand of a cat in `graph`; returns how many.
// Only when there is one is `*out` (which may be `graph` itself) set to the
// rewritten graph.
absl::StatusOr<int> ContiguousCatOperands(const ir::Graph& graph, ir::Graph* out);

}  // namespace kiln::pipeline

#endif  // KILN_COMPILER_PIPELINE_CAT_LAYOUTS_H_
