// Attention rewrite (pass name "attention"): softmax attention written out
// as matmuls, as Dynamo and AOTAutograd spell `softmax(q @ k^T * c) @ v`,
//
//   bmm(view(expand(q)), view(expand(permute(k, last two))))  -> view
//     -> div.Scalar / mul.Scalar -> _softmax(-1) -> expand -> view
//   bmm(that, view(expand(v)))  -> view  (= out)
//
// (each expand to its operand's own sizes, a clone allowed after it) becomes
// one fused attention kernel through ATen with scale c (or 1/c): for
// float16 and bfloat16 in inference, where the target has fused 16-bit
// kernels (sm_80 and later) and the value's head dim is the query's, the
// composite aten.scaled_dot_product_attention, whose kernel ATen picks when
// it runs (cuDNN's on an H100: 1.5x faster there than flash attention, which
// an earlier version named); memory-efficient attention
// (aten._scaled_dot_product_efficient_attention) otherwise, whose layout and
// cost are known. Then, where the kernel's layout is not `out`'s, a copy
// into it (memory-efficient attention writes [B, L, H, D]; the composite's
// cuDNN kernel the layout of its query, which is [B, H, L, D] when q is
// contiguous). The scores are never written to memory: for
// [8, 12, 1024, 64] that is 200 MB less traffic per call.
//
// Only where the fused kernel computes the same thing: q, k and v of rank 3
// or 4 (rank 3 goes through a head dimension of 1), float32, float16 or
// bfloat16 on CUDA, head dims that are constant multiples of 8 and at most
// 256 (the other sizes may be symbolic), a last stride of 1, a contiguous
// `out`; every value between the sources and `out`
// used by the chain alone. Anything else is left as it is.
//
// In training graphs (options.training; the rewrite runs before the joint
// graph is built) it is, in 16-bit, flash attention where the target has
// it and the head dims agree, memory-efficient attention (with its
// log-sum-exp) otherwise: their derivative rules are ATen's backwards of
// them, which read the output and the log-sum-exp the forward saved
// (softmax attention's bfloat16 training step on an H100: 0.97 ms with
// flash, 1.16-1.77 ms over five runs with memory-efficient attention).
// float32 training graphs keep the matmuls (attention.cc says why).
// Head dims over 128 are left unfused wherever memory-efficient attention
// would run (in training, and in float32 inference): its backward, and its
// forward's one kernel for such heads, are slower than the matmuls.
// The log-sum-exp needs a constant query length; a graph where it is
// symbolic is refused (an error the pipeline treats as "no rewrite").
//
// Pure function; thread-safe.
#ifndef KILN_COMPILER_PIPELINE_ATTENTION_H_
#define KILN_COMPILER_PIPELINE_ATTENTION_H_

#include "absl/status/statusor.h"
#include "compiler/ir/graph.h"

namespace kiln::pipeline {

struct AttentionOptions {
  bool flash = true;      // the target has fused 16-bit kernels (sm_80 and later)
  bool training = false;  // the graph is differentiated after the rewrite
};

// Rewrites every match in `graph`; returns how many. Only when there is one
// is `*out` (which may be `graph` itself) set to the rewritten graph.
absl::StatusOr<int> RewriteAttention(const ir::Graph& graph, ir::Graph* out,
                                     const AttentionOptions& options = {});

}  // namespace kiln::pipeline

#endif  // KILN_COMPILER_PIPELINE_ATTENTION_H_
