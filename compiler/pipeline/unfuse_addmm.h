// Bias rewrite (pass name "unfuse-addmm"): on CUDA, a float32 or float64
// addmm(bias, a, b) whose result a pointwise op reads (through views: the
// [B*L, N] product viewed back as [B, L, N]) becomes mm(a, b) + bias, and
// the add fuses into that reader's kernel (a GELU, a residual add and its
// layer norm). cuBLAS's float32 GEMM with a bias epilogue took a smaller
// tile than the plain GEMM on an H100 for GPT-2's [4096, 768] x [768, 3072]
// (docs/benchmarks.md); the bias costs the reader nothing. 16-bit addmm
// keeps its epilogue, whose kernels are the plain GEMM's. Where the
// product's only reader is that view, the bias is added to the viewed
// product: the sum then has its readers' shape, and a kernel of that shape
// computes it again rather than read it (a training graph's backward,
// which recomputes the GELU and takes its gradient, need not store the
// sum).
//
// Only addmm with beta and alpha 1 and a bias of one dimension (or [1, N]).
//
// Pure function; thread-safe.
#ifndef KILN_COMPILER_PIPELINE_UNFUSE_ADDMM_H_
#define KILN_COMPILER_PIPELINE_UNFUSE_ADDMM_H_

#include "absl/status/statusor.h"
#include "compiler/ir/graph.h"

namespace kiln::pipeline {

// Rewrites every match in `graph`; returns how many. Only when there is one
// is `*out` (which may be `graph` itself) set to the rewritten graph.
absl::StatusOr<int> UnfuseAddmm(const ir::Graph& graph, ir::Graph* out);

}  // namespace kiln::pipeline

#endif  // KILN_COMPILER_PIPELINE_UNFUSE_ADDMM_H_
