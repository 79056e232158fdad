// Private to the op registry's derivative rules (derivatives*.cc): the
// emission helpers and rule shapes the rule families share, the
// registration helpers, and one registration function per family.
// RegisterDerivatives (derivatives.cc) calls the families in a fixed order.
//
//   derivatives.cc            shared helpers, RegisterDerivatives
//   derivatives_pointwise.cc  elementwise ops
//   derivatives_reductions.cc copies, reductions, softmax, normalization, losses
//   derivatives_views.cc      views, cat, stack, padding, indexing
//   derivatives_matmul.cc     matmul, convolution, pooling, embedding
//
// Rules emit into one DerivativeContext: not thread-safe (derivative.h).
#ifndef KILN_COMPILER_OPS_DERIVATIVES_INTERNAL_H_
#define KILN_COMPILER_OPS_DERIVATIVES_INTERNAL_H_

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "compiler/ops/derivative.h"
#include "compiler/ops/registry.h"

namespace kiln::ops::derivatives_internal {

using ir::Argument;
using ir::kNoValue;
using ir::Ref;
using ir::ValueId;
using Ctx = DerivativeContext;
using Val = absl::StatusOr<ValueId>;

// ---------------------------------------------------------------------------
// Emission helpers.

Val Mul(Ctx& c, ValueId a, ValueId b);
Val Div(Ctx& c, ValueId a, ValueId b);
Val Add(Ctx& c, ValueId a, ValueId b);
Val Sub(Ctx& c, ValueId a, ValueId b);
Val Neg(Ctx& c, ValueId a);
Val MulScalar(Ctx& c, ValueId a, Argument s);
Val DivScalar(Ctx& c, ValueId a, Argument s);
Val AddScalar(Ctx& c, ValueId a, Argument s);
Val ZerosLike(Ctx& c, ValueId a);
// where(mask, 0, a): libtorch's where(cond, grad, zeros) with cond = !mask.
Val ZeroWhere(Ctx& c, ValueId a, ValueId mask);
Val Not(Ctx& c, ValueId a);
Val Unsqueeze(Ctx& c, ValueId a, int64_t dim);

// A SymInt[] argument: plain ints when every entry is a constant.
Argument SizesArg(const std::vector<ir::SymInt>& sizes);
Argument SymIntArg(const ir::SymInt& s);

// The number of elements of `like` over `dims` as a tensor of `dtype`, the
// dims kept (size 1): ones summed, exact in float32 up to 2^24, as the
// forward's kernels count a symbolic row. For counts that are symbolic,
// which a Scalar argument (a number) cannot carry.
Val CountOf(Ctx& c, ValueId like, const std::vector<int64_t>& dims, v1::DType dtype);
// `a` times (or, with `divide`, over) the number of elements of `like`
// over `dims`: a Scalar where the count is a constant, else CountOf in
// float32 (float64 for float64 `a`); `a` broadcasts against `like` with
// `dims` kept. The result has `a`'s dtype.
Val ScaleByCount(Ctx& c, ValueId a, ValueId like, const std::vector<int64_t>& dims, bool divide);
Val Expand(Ctx& c, ValueId a, const std::vector<ir::SymInt>& sizes);

// The node's argument `name` as bound (defaults included), to pass on.
Argument Arg(const Ctx& c, const std::string& name);

absl::StatusOr<ValueId> Tensor(const Ctx& c, const std::string& name);
// A copy: metadata the builder holds moves when a rule emits a node, so
// rules never keep references to it across Op calls.
absl::StatusOr<ir::TensorMeta> MetaOf(const Ctx& c, const std::string& name);
int64_t Rank(const ir::TensorMeta& m);

// libtorch's maybe_multiply: t itself when the scalar is 1.
Val MaybeMultiply(Ctx& c, ValueId t, const std::string& scalar_param);

// Sets the gradient of `param` to `g` summed back over broadcast dimensions
// and cast to the input's dtype, as autograd's engine does (validate_outputs).
absl::Status SetReduced(Ctx& c, const std::string& param, ValueId g);

// ---------------------------------------------------------------------------
// Rule shapes.

using GradFn = std::function<Val(Ctx& c, ValueId grad)>;

// An op whose only differentiable tensor is `self` and whose gradient comes
// from output 0.
DerivativeRule SelfRule(GradFn f);

// One gradient function per differentiable parameter, each from output 0.
DerivativeRule ParamRule(std::vector<std::pair<std::string, GradFn>> fs);

GradFn Identity();
GradFn ZerosLikeGrad();

// ---------------------------------------------------------------------------
// Registration.

void Def(Registry* registry, const std::string& target, DerivativeRule rule,
         std::vector<std::string> nondifferentiable = {});

// Ops whose output carries no gradient from these tensor parameters
// (factories that read only an input's metadata; bernoulli, which libtorch
// does not differentiate), without a rule.
void NoGrad(Registry* registry, const std::string& target, std::vector<std::string> params);

// One per family, in the order RegisterDerivatives calls them.
void RegisterPointwise(Registry* r);             // derivatives_pointwise.cc
void RegisterCopiesAndReductions(Registry* r);   // derivatives_reductions.cc
void RegisterNormalization(Registry* r);         // derivatives_reductions.cc
void RegisterViews(Registry* r);                 // derivatives_views.cc
void RegisterMatmulAndConvolution(Registry* r);  // derivatives_matmul.cc

}  // namespace kiln::ops::derivatives_internal

#endif  // KILN_COMPILER_OPS_DERIVATIVES_INTERNAL_H_
