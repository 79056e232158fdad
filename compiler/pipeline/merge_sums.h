// Equivalent sums merged (pass name "merge-sums"): sums that reduce the same
// product over the same dims, up to factors constant along those dims, a
// sign and being taken in two steps, are computed as one sum.
//
// A batch norm that reaches kilnd decomposed (mean, var, sub, mul) is
// differentiated as such, and its backward sums the output gradient g
// twice over the same elements: over (H, W) and then N for the bias's
// gradient, and over (N, H, W) inside the normalization's derivative, times
// the weight and the inverse deviation; likewise g times the centered
// input. Each such pair becomes one sum, and the sums in (H, W) steps, a
// kernel of their own, go away:
//
//   sum(sum(g, [2, 3], keepdim), [0])        -> view(R)
//   sum(-(g * w * rsqrt), [0, 2, 3], keepdim) -> -(R * w * rsqrt)
//   where R = sum(g, [0, 2, 3], keepdim)
//
// A factor is constant along the reduced dims when its size is 1 (or it
// has no dim) there, broadcast against the summed value's shape. Products
// are followed through mul.Tensor, mul.Scalar and neg of the summed dtype,
// to a bounded depth; a factor may be of a narrower floating dtype (a
// bfloat16 weight times float32 statistics), any other dtype leaves the
// sum as it is. So are sums with a dtype argument, and products whose every
// factor is constant.
// Rounding differs from the unmerged sums' as reassociation does.
//
// Pure function; thread-safe.
#ifndef KILN_COMPILER_PIPELINE_MERGE_SUMS_H_
#define KILN_COMPILER_PIPELINE_MERGE_SUMS_H_

#include "absl/status/statusor.h"
#include "compiler/ir/graph.h"

namespace kiln::pipeline {

// Merges every group of equivalent sums in `graph`; returns how many sums
// were replaced. Only when there is one is `*out` (which may be `graph`
// itself) set to the rewritten graph, with the nodes no output needs
// dropped.
absl::StatusOr<int> MergeEquivalentSums(const ir::Graph& graph, ir::Graph* out);

}  // namespace kiln::pipeline

#endif  // KILN_COMPILER_PIPELINE_MERGE_SUMS_H_
