// Copy elision (pass name "elide-copies"): copies whose result the graph
// could have read from their input. A graph is functional, so a copy changes
// only where its values lie in memory; two kinds change nothing a reader
// needs:
//
//   - a copy whose every reader is another copy, directly or through views
//     that take any layout (permute, transpose, expand, slice, select,
//     squeeze, unsqueeze, alias): the views are taken of the copy's input and
//     the second copies read it there. The first copy goes.
//   - a copy laid out as its input (the same sizes and strides): its readers
//     read the input.
//
// Attention through ATen leaves both: its output is copied into the layout
// the matmul it replaced wrote ([B, H, L, D]), which Dynamo's permute and
// clone then copy again into [B, L, H, D], the layout the kernel wrote in
// the first place. After the pass the output projection reads the kernel's
// output as it is, and two copies of the heads go per attention.
//
// A copy stays when its result, or a view of it, is a graph output (the
// caller may not be handed aliases), or when its input is a graph input or a
// view of one.
//
// Pure function; thread-safe.
#ifndef KILN_COMPILER_PIPELINE_ELIDE_COPIES_H_
#define KILN_COMPILER_PIPELINE_ELIDE_COPIES_H_

#include "absl/status/statusor.h"
#include "compiler/ir/graph.h"

namespace kiln::pipeline {

// Elides every such copy in `graph`; returns how many. Only when there is
// one is `*out` (which may be `graph` itself) set to the rewritten graph.
absl::StatusOr<int> ElideCopies(const ir::Graph& graph, ir::Graph* out);

}  // namespace kiln::pipeline

#endif  // KILN_COMPILER_PIPELINE_ELIDE_COPIES_H_
