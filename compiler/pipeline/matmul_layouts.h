// Matmul operand layouts (pass name "matmul-layouts"): a contiguous copy
// that transposes its input's last two dims, read only by matmuls (directly
// or through views that keep those two dims), is made in the input's own
// order instead and transposed back as a view. The matmul reads the
// transposed operand as it is (cuBLAS's transposed operand), and the copy
// reads and writes along memory on both sides, where the transposing copy
// reads one element per row of its input: attention's k^T for `q @ k^T`,
// Dynamo's expand, clone and view of k.transpose(-1, -2) (GPT-2 with heads
// of 192 on an H100: 28 us per block for that copy, against 9 us for the
// others of q, k and v).
//
//   clone(x [.., M, N], strides [.., 1, s])      (x^T is row-major)
//     -> permute(clone(permute(x, last two)), last two)
//
// The rewritten values keep their sizes, names and dtypes; only their
// strides change, so a copy or a view that is a graph output (whose layout
// the caller was promised) is left as it is, as is a view that would not
// stay a view (one that reshapes the last two dims).
//
// Pure function; thread-safe.
#ifndef KILN_COMPILER_PIPELINE_MATMUL_LAYOUTS_H_
#define KILN_COMPILER_PIPELINE_MATMUL_LAYOUTS_H_

#include "absl/status/statusor.h"
#include "compiler/ir/graph.h"

namespace kiln::pipeline {

// Rewrites every match in `graph`; returns how many. Only when there is one
// is `*out` (which may be `graph` itself) set to the rewritten graph.
absl::StatusOr<int> TransposeMatmulCopies(const ir::Graph& graph, ir::Graph* out);

}  // namespace kiln::pipeline

#endif  // KILN_COMPILER_PIPELINE_MATMUL_LAYOUTS_H_
