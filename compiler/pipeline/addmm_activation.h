// Activation epilogue rewrite (pass name "addmm-activation"): on CUDA, in a
// graph without gradients, gelu(addmm(bias, a, b), approximate="tanh"),
// directly or through a view of the product (Linear's [B*L, N] viewed back
// as [B, L, N]), becomes aten._addmm_activation(use_gelu=True), which
// cuBLASLt runs as one GEMM whose epilogue adds the bias and applies the
// GELU as it writes the product. The separate pass over the product (a
// kernel that reads it and writes the GELU) goes: on an H200 for GPT-2's
// MLP ([4096, 768] x [768, 3072]) the GEMM with the GELU epilogue took
// 37 us in bfloat16 against 32 us for the GEMM and 34 us for the pass
// (docs/benchmarks.md, run AL). Not in float32, where cuBLASLt runs the
// epilogue as a second kernel after the GEMM, slower than kiln's fused
// pointwise kernel (run AM).
//
// Only where the product and its view have no reader but the GELU and are
// no graph outputs (a training graph keeps the product for the GELU's
// gradient), with beta and alpha 1, a bias of one dimension of the
// product's dtype, and float16 or bfloat16. The epilogue applies
// the bias and the GELU before rounding to a 16-bit dtype, where eager
// rounds the product first: 16-bit results may differ by a unit in the
// last place. ReLU, which ATen's op also takes, is left alone: cuBLASLt's
// ReLU epilogue is not documented to keep NaN, which torch.relu keeps.
//
// Pure function; thread-safe.
#ifndef KILN_COMPILER_PIPELINE_ADDMM_ACTIVATION_H_
#define KILN_COMPILER_PIPELINE_ADDMM_ACTIVATION_H_

#include "absl/status/statusor.h"
#include "compiler/ir/graph.h"

namespace kiln::pipeline {

// Rewrites every match in `graph`; returns how many. Only when there is one
// is `*out` (which may be `graph` itself) set to the rewritten graph.
absl::StatusOr<int> FuseAddmmActivations(const ir::Graph& graph, ir::Graph* out);

}  // namespace kiln::pipeline

#endif  // KILN_COMPILER_PIPELINE_ADDMM_ACTIVATION_H_
