// Convolution layouts (pass name "conv-layouts"): a graph's 16-bit 2-D
// convolutions run channels-last (NHWC) on CUDA. cuDNN's tensor-core
// kernels read and write NHWC; given NCHW tensors, cuDNN transposes the
// input to NHWC and the output back on every call (the bench's conv net,
// bfloat16 inference on an H100: 79 us of its 268 us of kernels per step;
// 242 us channels-last).
//
// The first convolution whose input is not channels-last gets its input
// and its weight copied channels-last by kernels of the plan (ATen's own
// copies inside the convolution took the host 46 us each under torch's
// profiler, the bench's bfloat16 conv net on an H100), and ATen then runs
// the convolution channels-last and writes the output NHWC. The kernels
// after it keep that layout (a pointwise result takes its first operand's),
// so the next convolution's input is channels-last already; its weight,
// which ATen would copy on every call as it does the input's, is copied by
// a kernel of the plan too. Group norm, whose CUDA kernel refuses an input
// that is not contiguous (F.group_norm makes it so before the kernel),
// reads a contiguous copy of a channels-last one.
//
//   conv(x, w)  ->  conv(clone(x, memory_format=channels_last),
//                        clone(w, memory_format=channels_last))
//
// Every value downstream of a rewritten convolution has its strides
// inferred again; nothing else of its metadata changes. A graph output
// whose strides would change gets a copy in its old layout (contiguous);
// when that layout is something else, or a view of a value whose layout
// changed would not stay a view, the graph is left as it came.
//
// Rewritten: convolutions with a 4-D float16 or bfloat16 input on CUDA, one
// group (ATen's grouped and depthwise kernels choose their layouts
// otherwise), constant channels and spatial sizes, and an output with more
// than one channel and more than one pixel (otherwise channels-last is
// contiguous anyway). float32 stays: without TF32 (the bench's setting)
// cuDNN's float32 NHWC kernels made the conv net's inference slower (0.93-0.94
// against 0.65-0.76 ms a call), and the choice cannot depend on a flag the
// process that runs the plan sets. Whether training graphs are rewritten is
// the caller's (KilnOptions::channels_last): in the conv net's training the
// batch norms' statistics and gradients, reduced over N, H and W with C
// innermost, took longer than the transposes they saved.
//
// Pure function; thread-safe.
#ifndef KILN_COMPILER_PIPELINE_CONV_LAYOUTS_H_
#define KILN_COMPILER_PIPELINE_CONV_LAYOUTS_H_

#include "absl/status/statusor.h"
#include "compiler/ir/graph.h"

namespace kiln::pipeline {

// Rewrites `graph`; returns how many convolutions got a channels-last
// weight copied. Only when there is one is `*out` (which may be `graph`
// itself) set to the rewritten graph.
absl::StatusOr<int> ChannelsLastConvolutions(const ir::Graph& graph, ir::Graph* out);

}  // namespace kiln::pipeline

#endif  // KILN_COMPILER_PIPELINE_CONV_LAYOUTS_H_
