// The loop-level IR: what a fused kernel computes, independent of the
// language it is generated in (C++ for CPUs now, CUDA later).
//
// A Kernel iterates an `outer` space (parallel; one "row" per point) and,
// inside each row, makes `passes` sweeps over an `inner` space. Statements
// are in SSA form, each belonging to one pass and one level:
//
//   for each outer point o:                      (parallel)
//     for pass p in 0 .. passes-1:
//       [outer-level statements of pass p that precede the sweep]
//       for each inner point i:                  (vectorizable)
//         inner statements of pass p: loads, scalar ops, stores,
//         and reductions accumulating over i
//       outer-level statements of pass p (after the sweep): they may read
//       the pass's reductions, e.g. a mean = sum / n, and store per row
//
// A kernel with `row_groups` deals its outer points into that many groups
// (point o into group o % row_groups) and may sum values across the points
// of each group (kAccumulate): a layer norm's backward computes each row's
// input gradient and, in the same sweep, each group's partial sums over rows
// of the weight's and bias's gradients, which a second kernel adds up.
//
// A pointwise kernel has one pass, an inner space of the last dimension and
// no reductions. Softmax over the last dimension is one kernel: pass 0
// reduces max, pass 1 reduces sum(exp(x - max)), pass 2 stores
// exp(x - max) / sum. Layer norm over a short row: pass 0 sums the row,
// pass 1 sums its squared deviations from the mean, pass 2 stores the
// normalized, scaled row; over a long row or one of symbolic size, pass 0 is
// one Welford mean/variance sweep instead of the first two.
//
// Loads and stores address buffers through affine index expressions: one
// stride per outer dimension and per inner dimension, plus an offset, all
// SymInt (symbolic sizes become kernel arguments). Broadcasting is a zero
// stride; views are their own strides over their base's storage (views never
// copy).
//
// Plain data; not thread-safe for mutation.
#ifndef KILN_COMPILER_LOOP_KERNEL_H_
#define KILN_COMPILER_LOOP_KERNEL_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "compiler/ir/graph.h"

namespace kiln::loop {

// Index into a buffer: sum(outer_strides[k] * o_k) + sum(inner_strides[k] * i_k) + offset.
struct Index {
  std::vector<ir::SymInt> outer_strides;
  std::vector<ir::SymInt> inner_strides;
  ir::SymInt offset{int64_t{0}};
};

enum class StmtKind {
  kLoad,      // buffer[index]
  kConstant,  // `constant`, of `dtype`
  kOp,        // scalar op `op` over `args`
  kReduce,    // accumulates args[0] over the inner sweep with `reduce`
  kStore,     // buffer[index] = args[0]
  // A sum across rows (Kernel::row_groups): for each group g of outer
  // points and each inner point, buffer[g * index.outer_strides[0] +
  // inner index] = the sum of args[0] over the group's outer points, in
  // `dtype`. The index's other outer strides are 0. An inner statement; it
  // has no value.
  kAccumulate,
  // buffer[index + sum_k args[k] * gather_strides[k]]: a load at
  // positions that loaded values name (an embedding's rows, a gather's
  // elements, advanced indexing). Each args[k] is an integer statement
  // indexing a dimension of gather_sizes[k] elements; with gather_wraps, a
  // negative one counts from the end (advanced indexing), and one out of
  // range stops the kernel with an error naming it (the code generators
  // check) rather than read out of bounds. `index` addresses the
  // dimensions that are not gathered.
  kGather,
  // buffer[index + sum_k args[k + 1] * gather_strides[k]] += args[0],
  // atomically (duplicate positions add up): a scatter-add into a buffer
  // the plan fills with zeros first (index_put with accumulation,
  // index_add, embedding_dense_backward into zeros). The positions are
  // checked as a gather's are. An inner statement; it has no value.
  kScatterAdd,
  // The integer `index` (offset + strides times the loop coordinates) as a
  // value of `dtype` (an integer one): arange's elements, where they are
  // read.
  kIndex,
};

// The scalar ops of kOp statements. Operands are converted to the
// statement's dtype unless said otherwise; conversions between dtypes are
// explicit kCast statements.
enum class ScalarOp {
  // Unary.
  kNeg,
  kAbs,
  kExp,
  kLog,
  kLog1p,
  kExpm1,
  kSqrt,
  kRsqrt,
  kReciprocal,
  kSin,
  kCos,
  kTanh,
  kSigmoid,
  kRelu,
  kErf,
  kSign,
  kFloor,
  kCeil,
  kNot,  // of its operand as a bool
  kGelu,
  kGeluTanh,
  kSilu,
  kIsnan,  // of its operand in its own dtype
  // Binary.
  kAdd,
  kSub,
  kMul,
  kDiv,
  kDivFloor,
  kDivTrunc,
  kPow,
  kMax,
  kMin,
  kEq,  // comparisons: in the operands' promoted dtype
  kNe,
  kLt,
  kLe,
  kGt,
  kGe,
  kAnd,
  kOr,
  kXor,
  // Ternary.
  kWhere,  // where(cond, a, b): cond as a bool
  // Conversion of its operand to the statement's dtype.
  kCast,
};

// What the code generators and the checks need to know of a scalar op.
struct ScalarOpInfo {
  ScalarOp op;
  const char* name;  // as printed: "add", "div_floor", "gelu_tanh"
  int arity;         // operand count
  bool needs_float;  // the result must be of a floating dtype
};

// Every scalar op's row, in the enum's order.
absl::Span<const ScalarOpInfo> ScalarOps();
// `op`'s row; nullptr for a value outside the enum.
const ScalarOpInfo* FindScalarOp(ScalarOp op);
// The printed name ("div_floor"); "?" for a value outside the enum.
const char* ScalarOpName(ScalarOp op);
// The op printed as `name`; nullopt for any other text.
std::optional<ScalarOp> ParseScalarOp(absl::string_view name);

// Reductions. Welford's three results come from one accumulation:
// kWelfordMean and kWelfordM2 name the same accumulator (args[0] equal) and
// read its mean and its sum of squared deviations; the count is the inner
// size.
enum class ReduceOp { kSum, kMax, kMin, kWelfordMean, kWelfordM2 };

struct Stmt {
  StmtKind kind = StmtKind::kOp;
  int pass = 0;
  bool inner = true;              // inside the sweep (false: outer level, after it)
  v1::DType dtype = v1::FLOAT32;  // of the result (loads: the buffer's)
  ScalarOp op = ScalarOp::kCast;  // kOp only
  std::vector<int> args;          // statement indices
  double constant = 0;
  int buffer = -1;  // kLoad / kStore / kGather: index into Kernel::buffers
  Index index;
  // kGather only: one per args[k], the gathered dimension's stride in the
  // buffer and its size.
  std::vector<ir::SymInt> gather_strides;
  std::vector<ir::SymInt> gather_sizes;
  bool gather_wraps = false;
  ReduceOp reduce = ReduceOp::kSum;
};

struct KernelBuffer {
  std::string value;  // the plan value whose storage this is
  v1::DType dtype = v1::FLOAT32;
  bool written = false;
  // Read by one pass of the kernel and by no later step of the plan
  // (compiler/loop/sweep_order.h): its loads may ask the caches not to
  // keep it. Not printed.
  bool streamed = false;
};

struct Kernel {
  std::string name;               // unique in its module: "kernel_3"
  std::vector<ir::SymInt> outer;  // sizes of the outer (parallel) dimensions
  std::vector<ir::SymInt> inner;  // sizes of the inner (swept) dimensions
  int passes = 1;
  std::vector<Stmt> stmts;
  std::vector<KernelBuffer> buffers;
  // The graph nodes fused into this kernel, in order (for the debug trace).
  std::vector<std::string> nodes;
  // The groups kAccumulate statements sum over (see above); 0: none.
  int64_t row_groups = 0;
  // Threads per block, as the CUDA autotuner chose them
  // (compiler/codegen/cuda_tuner.h); 0: the target's heuristic.
  int block = 0;
  // The launch's blocks take the outer work (rows, tiles of rows, chunks
  // of elements) from the last to the first: set by the sweep-order pass
  // (compiler/loop/sweep_order.h) where what the kernel reads was written
  // last by the step before it, and is partly in L2 still.
  bool reversed = false;
};

// Readable listing of a kernel, for the debug trace and for tests.
std::string PrintKernel(const Kernel& kernel);

// The text two kernels share exactly when their generated code would be the
// same: PrintKernel of the kernel without its name, its nodes and the plan
// values its buffers are bound to (launches pass their own).
std::string KernelCode(const Kernel& kernel);

}  // namespace kiln::loop

#endif  // KILN_COMPILER_LOOP_KERNEL_H_
