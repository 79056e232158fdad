// Shape, stride and dtype arithmetic that the op registry's shape rules share
// (compiler/ops/shape_rules.cc), and that passes may reuse: symbolic sizes,
// broadcasting, PyTorch's type promotion, contiguous and view strides,
// reduction and view size inference.
//
// Sizes are ir::SymInt: a constant or an expression in the syntax of
// compiler/ir/sym_expr.h ("s0", "16*s0", "s0 + 4"). The arithmetic here folds
// constants and keeps expressions in SymExpr's polynomial form (coefficient
// first, then the factors in sorted order: "16*s0*s1 + s1 - 2"; ir::Simplify),
// so that equal polynomials compare equal as strings.
//
// Errors are INVALID_ARGUMENT with a message that says what is wrong but not
// where: callers prefix the node and the argument ("node 'mm_1'
// (aten.mm.default): argument 'mat2' ...").
//
// Pure functions; thread-safe.
#ifndef KILN_COMPILER_OPS_SHAPE_UTIL_H_
#define KILN_COMPILER_OPS_SHAPE_UTIL_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "compiler/ir/graph.h"

namespace kiln::ops {

using SymSizes = std::vector<ir::SymInt>;

// ---------------------------------------------------------------------------
// Symbolic integers.

// Whether `s` is the constant `value`.
bool IsConstant(const ir::SymInt& s, int64_t value);

ir::SymInt SymAdd(const ir::SymInt& a, const ir::SymInt& b);
ir::SymInt SymSub(const ir::SymInt& a, const ir::SymInt& b);
// Products of constants and symbols stay canonical: 16 * s0 -> "16*s0",
// 2 * "16*s0" -> "32*s0", "s1" * "4*s0" -> "4*s0*s1".
ir::SymInt SymMul(const ir::SymInt& a, const ir::SymInt& b);
// Python's floor division; "32*s0" // 16 -> "2*s0". `b` must not be 0.
ir::SymInt SymFloorDiv(const ir::SymInt& a, const ir::SymInt& b);

// The product of `sizes` (1 for none).
ir::SymInt Numel(absl::Span<const ir::SymInt> sizes);

// "[4, s0, 8]".
std::string SizesToString(absl::Span<const ir::SymInt> sizes);
SymSizes ToSymSizes(absl::Span<const int64_t> sizes);
// The sizes as constants, or nullopt when any is symbolic.
std::optional<std::vector<int64_t>> ConstantSizes(absl::Span<const ir::SymInt> sizes);

// ---------------------------------------------------------------------------
// Dimensions.

// `dim` in [-rank, rank) made non-negative. A rank-0 tensor takes dims -1
// and 0, as in PyTorch. Error: "dimension 3 is out of range for a tensor of
// rank 2 (expected a value in [-2, 1])".
absl::StatusOr<int64_t> WrapDim(int64_t dim, int64_t rank);

// The sizes of a reduction of `sizes` over `dims` (any of them negative);
// an empty `dims` reduces every dimension. `keepdim` keeps the reduced
// dimensions with size 1. Errors on a dimension out of range or repeated.
//
//   ReducedSizes([2, 3, 4], {-1}, false) -> [2, 3]
//   ReducedSizes([2, 3, 4], {0, 2}, true) -> [1, 3, 1]
//   ReducedSizes([2, 3, 4], {}, false) -> []
absl::StatusOr<SymSizes> ReducedSizes(absl::Span<const ir::SymInt> sizes,
                                      absl::Span<const int64_t> dims, bool keepdim);

// The sizes `requested` for a view or reshape of a tensor of `sizes`, with
// at most one -1 inferred from the element count:
//   InferViewSizes([4, 6], [-1, 3]) -> [8, 3]
//   InferViewSizes([s0, 16], [-1, 4]) -> ["4*s0", 4]
// Errors on two -1s, on a negative size other than -1, and when the element
// counts differ for certain: constants that differ ("shape [5, -1] is
// invalid for input of size 24"), or symbolic counts a nonzero constant or a
// single term apart ([s0, 16] viewed as [s0, 8]). Other symbolic mismatches
// are not detected.
absl::StatusOr<SymSizes> InferViewSizes(absl::Span<const ir::SymInt> sizes,
                                        absl::Span<const ir::SymInt> requested);

// ---------------------------------------------------------------------------
// Broadcasting.

// PyTorch's broadcasting of two shapes, aligned at the trailing dimension.
// Equal sizes stay; a constant 1 takes the other size; a symbol against a
// constant other than 1 gives the constant; two different symbols give the
// first (the client's trace has guarded them equal). Error:
// "shapes [4, 8] and [3, 8] do not broadcast at dimension 0" (a dimension of
// the result).
absl::StatusOr<SymSizes> BroadcastSizes(absl::Span<const ir::SymInt> a,
                                        absl::Span<const ir::SymInt> b);

// ---------------------------------------------------------------------------
// Dtypes and type promotion.

inline constexpr v1::DType kDefaultFloat = v1::FLOAT32;  // torch.get_default_dtype()

bool IsFloating(v1::DType t);  // float16, bfloat16, float32, float64
bool IsComplex(v1::DType t);
bool IsIntegral(v1::DType t, bool include_bool);
// The real counterpart of a complex dtype (complex64 -> float32); others unchanged.
v1::DType ToReal(v1::DType t);
// int and bool dtypes -> the default float; others unchanged (the
// "int to float" promotion of exp, sqrt, true division...).
v1::DType IntToFloat(v1::DType t);
// float16 and bfloat16 -> float32 (the dtype PyTorch computes them in).
v1::DType ComputationDType(v1::DType t);

// torch.promote_types.
v1::DType PromoteTypes(v1::DType a, v1::DType b);

// One operand of torch.result_type. Tensors of rank > 0 take part fully;
// rank-0 tensors and Python numbers ("wrapped numbers") only raise the
// category (bool < integral < floating < complex) of the result, never its
// width within a category: int32 tensor + 2.5 -> float32 (the default
// float), float16 tensor + 2.5 -> float16, float16 tensor + float32 rank-0
// tensor -> float16, int32 tensor + int64 rank-0 tensor -> int32.
struct PromotionOperand {
  enum class Priority { kTensor, kZeroDim, kWrappedNumber };
  v1::DType dtype = v1::DTYPE_UNSPECIFIED;
  Priority priority = Priority::kTensor;

  static PromotionOperand Tensor(const ir::TensorMeta& meta);
  // A Scalar argument: int (and SymInt) -> int64, float -> the default
  // float, bool -> bool. Non-numbers (None) yield DTYPE_UNSPECIFIED, which
  // ResultType skips.
  static PromotionOperand Scalar(const ir::Argument& arg);
};

// torch.result_type over the operands.
v1::DType ResultType(absl::Span<const PromotionOperand> operands);

// ---------------------------------------------------------------------------
// Strides.

// Row-major strides: the product of the later sizes (a size 0 counts as 1,
// as in PyTorch). Symbolic sizes give expressions: [4, s0, 16] ->
// ["16*s0", 16, 1].
SymSizes ContiguousStrides(absl::Span<const ir::SymInt> sizes);

// Whether `meta`'s strides are the contiguous strides of its sizes
// (dimensions of size 1 may have any stride).
bool IsContiguous(const ir::TensorMeta& meta);

// The strides of `new_sizes` viewing a tensor of `sizes`/`strides` without a
// copy (PyTorch's computeStride), or nullopt when no such view exists. With
// symbolic sizes only the cases of a contiguous input and of unchanged
// sizes are decided; others give contiguous strides.
std::optional<SymSizes> ViewStrides(absl::Span<const ir::SymInt> sizes,
                                    absl::Span<const ir::SymInt> strides,
                                    absl::Span<const ir::SymInt> new_sizes);

// The strides a copy of `meta` made with memory_format=preserve_format gets:
// `meta`'s own strides when they are constant, dense and non-overlapping
// (a permutation of contiguous strides), contiguous strides otherwise.
SymSizes PreservedStrides(const ir::TensorMeta& meta);

// The channels-last (NHWC) strides of 4-D sizes [N, C, H, W].
SymSizes ChannelsLastStrides(absl::Span<const ir::SymInt> sizes);

// Whether a 4-D `meta` is laid out channels-last, as c10's
// is_channels_last_strides_2d decides (suggest_memory_format): strides
// ordered C, W, H, N from the smallest, dense within C, W and H. An
// ambiguous layout (one channel and one pixel, [N, 1, 1, 1]) counts as
// contiguous. Needs constant strides and constant C, H and W; N may be
// symbolic.
bool IsChannelsLast(const ir::TensorMeta& meta);

}  // namespace kiln::ops

#endif  // KILN_COMPILER_OPS_SHAPE_UTIL_H_
