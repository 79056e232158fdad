#include "compiler/ops/shape_util.h"

#include <algorithm>
#include <limits>
#include <numeric>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "compiler/ir/sym_expr.h"

namespace kiln::ops {
namespace {

// Constant arithmetic saturates instead of overflowing: an operand near the
// int64 bounds comes from a request (sizes are bounded by ir::kMaxElements
// once verified, but arguments such as a view's sizes are not), and a
// saturated result fails the size checks that follow instead of wrapping
// into a plausible value.
int64_t SaturatingAdd(int64_t a, int64_t b) {
  int64_t r;
  if (!__builtin_add_overflow(a, b, &r)) return r;
  return b > 0 ? std::numeric_limits<int64_t>::max() : std::numeric_limits<int64_t>::min();
}

int64_t SaturatingMul(int64_t a, int64_t b) {
  int64_t r;
  if (!__builtin_mul_overflow(a, b, &r)) return r;
  return (a < 0) == (b < 0) ? std::numeric_limits<int64_t>::max()
                            : std::numeric_limits<int64_t>::min();
}

using ir::SymExpr;
using ir::SymInt;

// The expression of `s`. Verify parses every size of a graph, so a size
// that does not parse comes from a caller that skipped it; it is combined as
// text, unsimplified.
std::optional<SymExpr> ExprOf(const SymInt& s) {
  if (s.is_constant()) return SymExpr::Constant(s.constant());
  absl::StatusOr<SymExpr> e = SymExpr::Parse(s.expr());
  if (!e.ok()) return std::nullopt;
  return *std::move(e);
}

SymInt FromExpr(const SymExpr& e) {
  if (std::optional<int64_t> c = e.constant()) return SymInt{*c};
  return SymInt{e.text()};
}

SymInt AsText(const SymInt& a, const char* op, const SymInt& b) {
  return SymInt{absl::StrCat("(", a.ToString(), ")", op, "(", b.ToString(), ")")};
}

SymInt Combine(const SymInt& a, const SymInt& b, const char* op,
               SymExpr (*combine)(const SymExpr&, const SymExpr&)) {
  std::optional<SymExpr> x = ExprOf(a), y = ExprOf(b);
  if (!x || !y) return AsText(a, op, b);
  return FromExpr(combine(*x, *y));
}

}  // namespace

bool IsConstant(const ir::SymInt& s, int64_t value) {
  return s.is_constant() && s.constant() == value;
}

ir::SymInt SymAdd(const ir::SymInt& a, const ir::SymInt& b) {
  if (a.is_constant() && b.is_constant()) return SymInt{SaturatingAdd(a.constant(), b.constant())};
  return Combine(a, b, " + ", ir::SymPlus);
}

ir::SymInt SymSub(const ir::SymInt& a, const ir::SymInt& b) {
  if (a.is_constant() && b.is_constant()) {
    return SymInt{SaturatingAdd(a.constant(), SaturatingMul(b.constant(), -1))};
  }
  return Combine(a, b, " - ", ir::SymMinus);
}

ir::SymInt SymMul(const ir::SymInt& a, const ir::SymInt& b) {
  if (a.is_constant() && b.is_constant()) return SymInt{SaturatingMul(a.constant(), b.constant())};
  if (IsConstant(a, 1)) return b;
  if (IsConstant(b, 1)) return a;
  return Combine(a, b, "*", ir::SymTimes);
}

ir::SymInt SymFloorDiv(const ir::SymInt& a, const ir::SymInt& b) {
  if (IsConstant(b, 1) || IsConstant(a, 0)) return a;
  return Combine(a, b, "//", ir::SymFloorDivide);
}

ir::SymInt Numel(absl::Span<const ir::SymInt> sizes) {
  SymInt n{int64_t{1}};
  for (const SymInt& s : sizes) n = SymMul(n, s);
  return n;
}

std::string SizesToString(absl::Span<const ir::SymInt> sizes) {
  return absl::StrCat(
      "[",
      absl::StrJoin(sizes, ", ",
                    [](std::string* out, const SymInt& s) { out->append(s.ToString()); }),
      "]");
}

SymSizes ToSymSizes(absl::Span<const int64_t> sizes) {
  SymSizes out;
  out.reserve(sizes.size());
  for (int64_t s : sizes) out.push_back(SymInt{s});
  return out;
}

std::optional<std::vector<int64_t>> ConstantSizes(absl::Span<const ir::SymInt> sizes) {
  std::vector<int64_t> out;
  out.reserve(sizes.size());
  for (const SymInt& s : sizes) {
    if (!s.is_constant()) return std::nullopt;
    out.push_back(s.constant());
  }
  return out;
}

absl::StatusOr<int64_t> WrapDim(int64_t dim, int64_t rank) {
  const int64_t r = std::max<int64_t>(rank, 1);
  if (dim < -r || dim >= r) {
    return absl::InvalidArgumentError(
        absl::StrCat("dimension ", dim, " is out of range for a tensor of rank ", rank,
                     " (expected a value in [", -r, ", ", r - 1, "])"));
  }
  return dim < 0 ? dim + r : dim;
}

absl::StatusOr<SymSizes> ReducedSizes(absl::Span<const ir::SymInt> sizes,
                                      absl::Span<const int64_t> dims, bool keepdim) {
  const int64_t rank = static_cast<int64_t>(sizes.size());
  std::vector<bool> reduce(sizes.size(), dims.empty());
  if (rank == 0) {
    for (int64_t d : dims) {
      auto w = WrapDim(d, rank);
      if (!w.ok()) return w.status();
    }
    return SymSizes{};
  }
  for (int64_t d : dims) {
    auto w = WrapDim(d, rank);
    if (!w.ok()) return w.status();
    if (reduce[*w]) {
      return absl::InvalidArgumentError(
          absl::StrCat("dimension ", *w, " appears more than once in the list of dimensions"));
    }
    reduce[*w] = true;
  }
  SymSizes out;
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (!reduce[i]) {
      out.push_back(sizes[i]);
    } else if (keepdim) {
      out.push_back(SymInt{int64_t{1}});
    }
  }
  return out;
}

absl::StatusOr<SymSizes> InferViewSizes(absl::Span<const ir::SymInt> sizes,
                                        absl::Span<const ir::SymInt> requested) {
  const SymInt numel = Numel(sizes);
  auto invalid = [&] {
    return absl::InvalidArgumentError(absl::StrCat(
        "shape ", SizesToString(requested), " is invalid for input of size ", numel.ToString()));
  };
  int infer = -1;
  SymInt known{int64_t{1}};
  for (size_t i = 0; i < requested.size(); ++i) {
    const SymInt& s = requested[i];
    if (IsConstant(s, -1)) {
      if (infer >= 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("shape ", SizesToString(requested), " has more than one -1"));
      }
      infer = static_cast<int>(i);
    } else if (s.is_constant() && s.constant() < 0) {
      return absl::InvalidArgumentError(absl::StrCat("shape ", SizesToString(requested),
                                                     " has the negative size ", s.constant()));
    } else {
      known = SymMul(known, s);
    }
  }
  SymSizes out(requested.begin(), requested.end());
  if (infer >= 0) {
    if (IsConstant(known, 0)) {
      return absl::InvalidArgumentError(
          absl::StrCat("shape ", SizesToString(requested),
                       " leaves the size of -1 undetermined: the other sizes multiply to 0"));
    }
    // known > numel covers a product of the other sizes that saturated.
    if (numel.is_constant() && known.is_constant() &&
        (known.constant() > numel.constant() || numel.constant() % known.constant() != 0)) {
      return invalid();
    }
    out[infer] = SymFloorDiv(numel, known);
  } else {
    // Unequal for every value of the symbols (sizes are at least 2 where
    // symbolic): a nonzero constant or a single product term apart.
    const SymInt diff = SymSub(numel, known);
    if (diff.is_constant()) {
      if (diff.constant() != 0) return invalid();
    } else if (std::optional<SymExpr> e = ExprOf(diff); e && e->IsMonomial()) {
      return invalid();
    }
  }
  return out;
}

absl::StatusOr<SymSizes> BroadcastSizes(absl::Span<const ir::SymInt> a,
                                        absl::Span<const ir::SymInt> b) {
  const size_t n = std::max(a.size(), b.size());
  SymSizes out(n);
  for (size_t i = 0; i < n; ++i) {
    // Dimension i of the result, counted from the front.
    const size_t from_end = n - 1 - i;
    const SymInt* x = from_end < a.size() ? &a[a.size() - 1 - from_end] : nullptr;
    const SymInt* y = from_end < b.size() ? &b[b.size() - 1 - from_end] : nullptr;
    if (x == nullptr) {
      out[i] = *y;
    } else if (y == nullptr || *x == *y || IsConstant(*y, 1)) {
      out[i] = *x;
    } else if (IsConstant(*x, 1)) {
      out[i] = *y;
    } else if (x->is_constant() && y->is_constant()) {
      return absl::InvalidArgumentError(absl::StrCat("shapes ", SizesToString(a), " and ",
                                                     SizesToString(b),
                                                     " do not broadcast at dimension ", i));
    } else if (x->is_constant()) {
      out[i] = *x;
    } else if (y->is_constant()) {
      out[i] = *y;
    } else {
      out[i] = *x;
    }
  }
  return out;
}

bool IsFloating(v1::DType t) {
  return t == v1::FLOAT16 || t == v1::BFLOAT16 || t == v1::FLOAT32 || t == v1::FLOAT64;
}

bool IsComplex(v1::DType t) { return t == v1::COMPLEX64 || t == v1::COMPLEX128; }

bool IsIntegral(v1::DType t, bool include_bool) {
  switch (t) {
    case v1::INT64:
    case v1::INT32:
    case v1::INT16:
    case v1::INT8:
    case v1::UINT8:
      return true;
    case v1::BOOL:
      return include_bool;
    default:
      return false;
  }
}

v1::DType ToReal(v1::DType t) {
  if (t == v1::COMPLEX64) return v1::FLOAT32;
  if (t == v1::COMPLEX128) return v1::FLOAT64;
  return t;
}

v1::DType IntToFloat(v1::DType t) { return IsIntegral(t, true) ? kDefaultFloat : t; }

v1::DType ComputationDType(v1::DType t) {
  return t == v1::FLOAT16 || t == v1::BFLOAT16 ? v1::FLOAT32 : t;
}

namespace {

int IntWidth(v1::DType t) {
  switch (t) {
    case v1::INT8:
    case v1::UINT8:
      return 1;
    case v1::INT16:
      return 2;
    case v1::INT32:
      return 4;
    default:
      return 8;
  }
}

v1::DType ToComplex(v1::DType real) { return real == v1::FLOAT64 ? v1::COMPLEX128 : v1::COMPLEX64; }

}  // namespace

v1::DType PromoteTypes(v1::DType a, v1::DType b) {
  if (a == b || b == v1::DTYPE_UNSPECIFIED) return a;
  if (a == v1::DTYPE_UNSPECIFIED) return b;
  if (a == v1::BOOL) return b;
  if (b == v1::BOOL) return a;
  if (IsComplex(a) || IsComplex(b)) {
    return ToComplex(PromoteTypes(ToReal(a), ToReal(b)));
  }
  if (IsFloating(a) && IsFloating(b)) {
    if (a == v1::FLOAT64 || b == v1::FLOAT64) return v1::FLOAT64;
    return v1::FLOAT32;  // float32 with anything, or float16 with bfloat16
  }
  if (IsFloating(a)) return a;
  if (IsFloating(b)) return b;
  // Both integral.
  if (a == v1::UINT8 || b == v1::UINT8) {
    const v1::DType other = a == v1::UINT8 ? b : a;
    return other == v1::INT8 ? v1::INT16 : other;
  }
  return IntWidth(a) >= IntWidth(b) ? a : b;
}

PromotionOperand PromotionOperand::Tensor(const ir::TensorMeta& meta) {
  return {meta.dtype, meta.sizes.empty() ? Priority::kZeroDim : Priority::kTensor};
}

PromotionOperand PromotionOperand::Scalar(const ir::Argument& arg) {
  PromotionOperand p;
  p.priority = Priority::kWrappedNumber;
  if (std::holds_alternative<double>(arg.kind)) {
    p.dtype = kDefaultFloat;
  } else if (std::holds_alternative<int64_t>(arg.kind) ||
             std::holds_alternative<ir::SymInt>(arg.kind)) {
    p.dtype = v1::INT64;
  } else if (std::holds_alternative<bool>(arg.kind)) {
    p.dtype = v1::BOOL;
  } else if (const auto* t = std::get_if<v1::DType>(&arg.kind)) {
    p.dtype = *t;
  }
  return p;
}

namespace {

// c10's combine_categories: `higher` is the result of the operands of higher
// priority; `lower` only raises its category.
v1::DType CombineCategories(v1::DType higher, v1::DType lower) {
  if (higher == v1::DTYPE_UNSPECIFIED) return lower;
  if (lower == v1::DTYPE_UNSPECIFIED) return higher;
  if (IsComplex(higher)) return higher;
  if (IsComplex(lower)) return IsFloating(higher) ? ToComplex(higher) : lower;
  if (IsFloating(higher)) return higher;
  if (higher == v1::BOOL || IsFloating(lower)) return PromoteTypes(higher, lower);
  return higher;
}

}  // namespace

v1::DType ResultType(absl::Span<const PromotionOperand> operands) {
  v1::DType dim = v1::DTYPE_UNSPECIFIED, zero = v1::DTYPE_UNSPECIFIED,
            wrapped = v1::DTYPE_UNSPECIFIED;
  for (const PromotionOperand& p : operands) {
    if (p.dtype == v1::DTYPE_UNSPECIFIED) continue;
    switch (p.priority) {
      case PromotionOperand::Priority::kTensor:
        dim = PromoteTypes(dim, p.dtype);
        break;
      case PromotionOperand::Priority::kZeroDim:
        zero = PromoteTypes(zero, p.dtype);
        break;
      case PromotionOperand::Priority::kWrappedNumber:
        wrapped = PromoteTypes(wrapped, p.dtype);
        break;
    }
  }
  return CombineCategories(dim, CombineCategories(zero, wrapped));
}

SymSizes ContiguousStrides(absl::Span<const ir::SymInt> sizes) {
  SymSizes strides(sizes.size());
  SymInt running{int64_t{1}};
  for (size_t i = sizes.size(); i-- > 0;) {
    strides[i] = running;
    const SymInt& s = sizes[i];
    running = SymMul(running, s.is_constant() && s.constant() == 0 ? SymInt{int64_t{1}} : s);
  }
  return strides;
}

bool IsContiguous(const ir::TensorMeta& meta) {
  if (meta.strides.size() != meta.sizes.size()) return false;
  for (const SymInt& s : meta.sizes) {
    if (IsConstant(s, 0)) return true;
  }
  SymInt expected{int64_t{1}};
  for (size_t i = meta.sizes.size(); i-- > 0;) {
    if (IsConstant(meta.sizes[i], 1)) continue;
    if (!(meta.strides[i] == expected)) return false;
    expected = SymMul(expected, meta.sizes[i]);
  }
  return true;
}

std::optional<SymSizes> ViewStrides(absl::Span<const ir::SymInt> sizes,
                                    absl::Span<const ir::SymInt> strides,
                                    absl::Span<const ir::SymInt> new_sizes) {
  if (strides.size() != sizes.size()) return ContiguousStrides(new_sizes);
  auto old_shape = ConstantSizes(sizes);
  auto old_stride = ConstantSizes(strides);
  auto new_shape = ConstantSizes(new_sizes);
  if (!old_shape || !old_stride || !new_shape) {
    if (std::equal(sizes.begin(), sizes.end(), new_sizes.begin(), new_sizes.end())) {
      return SymSizes(strides.begin(), strides.end());
    }
    // A contiguous input views contiguously; the undecided non-contiguous
    // symbolic cases get contiguous strides too.
    return ContiguousStrides(new_sizes);
  }
  // PyTorch's computeStride (aten/src/ATen/TensorUtils.cpp).
  const auto& os = *old_shape;
  const auto& ost = *old_stride;
  const auto& ns = *new_shape;
  const int64_t numel = std::accumulate(os.begin(), os.end(), int64_t{1}, std::multiplies<>());
  if (numel == 0 || os.empty()) {
    if (os == ns) return SymSizes(strides.begin(), strides.end());
    return ContiguousStrides(new_sizes);
  }
  std::vector<int64_t> out(ns.size(), 0);
  int64_t view_d = static_cast<int64_t>(ns.size()) - 1;
  int64_t chunk_base_stride = ost.back();
  int64_t tensor_numel = 1;
  int64_t view_numel = 1;
  for (int64_t tensor_d = static_cast<int64_t>(os.size()) - 1; tensor_d >= 0; --tensor_d) {
    tensor_numel *= os[tensor_d];
    if (tensor_d == 0 ||
        (os[tensor_d - 1] != 1 && ost[tensor_d - 1] != tensor_numel * chunk_base_stride)) {
      while (view_d >= 0 && (view_numel < tensor_numel || ns[view_d] == 1)) {
        out[view_d] = view_numel * chunk_base_stride;
        view_numel *= ns[view_d];
        --view_d;
      }
      if (view_numel != tensor_numel) return std::nullopt;
      if (tensor_d > 0) {
        chunk_base_stride = ost[tensor_d - 1];
        tensor_numel = 1;
        view_numel = 1;
      }
    }
  }
  if (view_d != -1) return std::nullopt;
  return ToSymSizes(out);
}

SymSizes PreservedStrides(const ir::TensorMeta& meta) {
  auto sizes = ConstantSizes(meta.sizes);
  auto strides = ConstantSizes(meta.strides);
  if (!sizes || !strides || strides->size() != sizes->size()) {
    // A batch of symbolic size keeps a channels-last layout, as in torch.
    return IsContiguous(meta) || IsChannelsLast(meta) ? meta.strides
                                                      : ContiguousStrides(meta.sizes);
  }
  // c10's is_non_overlapping_and_dense.
  std::vector<size_t> perm(sizes->size());
  std::iota(perm.begin(), perm.end(), 0);
  std::stable_sort(perm.begin(), perm.end(), [&](size_t a, size_t b) {
    const bool a_small = (*sizes)[a] < 2, b_small = (*sizes)[b] < 2;
    if (a_small != b_small) return b_small;  // sizes < 2 last
    if (a_small) return false;
    return (*strides)[a] < (*strides)[b];
  });
  int64_t require = 1;
  for (size_t i : perm) {
    if ((*sizes)[i] < 2) break;
    if ((*strides)[i] != require) return ContiguousStrides(meta.sizes);
    require *= (*sizes)[i];
  }
  return meta.strides;
}

SymSizes ChannelsLastStrides(absl::Span<const ir::SymInt> sizes) {
  const SymInt w_c = SymMul(sizes[3], sizes[1]);
  return SymSizes{SymMul(sizes[2], w_c), SymInt{int64_t{1}}, w_c, sizes[1]};
}

bool IsChannelsLast(const ir::TensorMeta& meta) {
  if (meta.sizes.size() != 4 || meta.strides.size() != 4) return false;
  const std::optional<std::vector<int64_t>> strides = ConstantSizes(meta.strides);
  if (!strides || (*strides)[1] == 0) return false;
  int64_t min = 0;
  for (const size_t d : {1, 3, 2, 0}) {
    const SymInt& size = meta.sizes[d];
    if (IsConstant(size, 0) || (*strides)[d] < min) return false;
    // [N, 1, 1, 1] and slices of it: contiguous, as c10 falls back to.
    if (d == 0) return min != (*strides)[1];
    if (!size.is_constant()) return false;
    min = (*strides)[d] * std::max<int64_t>(size.constant(), 1);
  }
  return true;
}

}  // namespace kiln::ops
