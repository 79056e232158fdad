// Activation epilogue rewrite (pass name "addmm-activation"): on CUDA, in a
// graph without gradients, relu(addmm(bias, a, b)) and gelu(addmm(bias, a,
// b), approximate="tanh"), through the view that splits the product's rows
// back into [B, L, N], become aten._addmm_activation, which cuBLASLt runs
// as one GEMM whose epilogue adds the bias and applies the activation as
// it writes the product. The separate pass over the product (a kernel that
// reads it and writes the activation) goes: on an H200 for GPT-2's MLP
// ([4096, 768] x [768, 3072]) the GEMM with the GELU epilogue took 36 us
// in bfloat16 against 32 us for the GEMM and 34 us for the pass, and 416 us
// in float32 against 395 us and 39 us (docs/benchmarks.md, run AL).
//
// Only where the product and its view have no reader but the activation
// and are no graph outputs (a training graph keeps the product for the
// activation's gradient), with beta and alpha 1, a bias of one dimension
// of the product's dtype, and float32, float16 or bfloat16. ATen applies
// the activation after the GEMM where cuBLASLt cannot (same values).
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
