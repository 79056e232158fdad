// Derivative rules of the op registry (registry.h): the vector-Jacobian
// product of each differentiable core-ATen op, emitted as registry ops so
// that every gradient carries the metadata its shape rule gives.
//
// The formulas are libtorch's (tools/autograd/derivatives.yaml and
// torch/csrc/autograd/FunctionsManual.cpp), op for op where the op exists
// in the registry, so that gradients agree with eager autograd in float64;
// compiler/autograd/grad_check_test.cc holds every rule against libtorch.
// Where a libtorch helper has no core-ATen op (slice_backward, reshape,
// index_put), the rule spells the same values with registry ops; each such
// place says so in a one-line comment.
//
// RegisterDerivatives attaches rules to the entries RegisterShapeRules made
// and skips targets that have no entry: the grad-check test lists the
// targets that must have a rule.
//
// The rules live by op family in derivatives_*.cc (see
// derivatives_internal.h); this file holds the emission helpers and rule
// shapes they share and RegisterDerivatives, which registers the families in
// a fixed order.
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "common/status_macros.h"
#include "compiler/ops/derivative.h"
#include "compiler/ops/derivatives_internal.h"
#include "compiler/ops/registry.h"
#include "compiler/ops/shape_util.h"

namespace kiln::ops {
namespace derivatives_internal {

// ---------------------------------------------------------------------------
// Emission helpers.

Val Mul(Ctx& c, ValueId a, ValueId b) { return c.Op("aten.mul.Tensor", {Ref(a), Ref(b)}); }
Val Div(Ctx& c, ValueId a, ValueId b) { return c.Op("aten.div.Tensor", {Ref(a), Ref(b)}); }
Val Add(Ctx& c, ValueId a, ValueId b) { return c.Op("aten.add.Tensor", {Ref(a), Ref(b)}); }
Val Sub(Ctx& c, ValueId a, ValueId b) { return c.Op("aten.sub.Tensor", {Ref(a), Ref(b)}); }
Val Neg(Ctx& c, ValueId a) { return c.Op("aten.neg.default", {Ref(a)}); }
Val MulScalar(Ctx& c, ValueId a, Argument s) {
  return c.Op("aten.mul.Scalar", {Ref(a), std::move(s)});
}
Val DivScalar(Ctx& c, ValueId a, Argument s) {
  return c.Op("aten.div.Scalar", {Ref(a), std::move(s)});
}
Val AddScalar(Ctx& c, ValueId a, Argument s) {
  return c.Op("aten.add.Scalar", {Ref(a), std::move(s)});
}
Val ZerosLike(Ctx& c, ValueId a) { return c.Op("aten.zeros_like.default", {Ref(a)}); }
Val ZeroWhere(Ctx& c, ValueId a, ValueId mask) {
  return c.Op("aten.masked_fill.Scalar", {Ref(a), Ref(mask), ir::Float(0.0)});
}
Val Not(Ctx& c, ValueId a) { return c.Op("aten.logical_not.default", {Ref(a)}); }
Val Unsqueeze(Ctx& c, ValueId a, int64_t dim) {
  return c.Op("aten.unsqueeze.default", {Ref(a), ir::Int(dim)});
}

Argument SizesArg(const std::vector<ir::SymInt>& sizes) {
  if (auto ints = ConstantSizes(sizes)) return ir::Ints(*ints);
  return Argument{"", sizes};
}
Argument SymIntArg(const ir::SymInt& s) {
  if (s.is_constant()) return ir::Int(s.constant());
  return Argument{"", s};
}

Val CountOf(Ctx& c, ValueId like, const std::vector<int64_t>& dims, v1::DType dtype) {
  ASSIGN_OR_RETURN(ValueId ones, c.Op("aten.full_like.default", {Ref(like), ir::Float(1.0)},
                                      {ir::Kwarg("dtype", Argument{"", dtype})}));
  return c.Op("aten.sum.dim_IntList", {Ref(ones), ir::Ints(dims), ir::Bool(true)});
}

Val ScaleByCount(Ctx& c, ValueId a, ValueId like, const std::vector<int64_t>& dims, bool divide) {
  ir::SymInt n{int64_t{1}};
  for (int64_t d : dims) n = SymMul(n, c.meta(like).sizes[d]);
  if (n.is_constant()) {
    return divide ? DivScalar(c, a, ir::Int(n.constant())) : MulScalar(c, a, ir::Int(n.constant()));
  }
  const v1::DType t = c.meta(a).dtype;
  const v1::DType wide = t == v1::FLOAT64 ? v1::FLOAT64 : v1::FLOAT32;
  ASSIGN_OR_RETURN(ValueId count, CountOf(c, like, dims, wide));
  ASSIGN_OR_RETURN(ValueId scaled, divide ? Div(c, a, count) : Mul(c, a, count));
  if (t == wide) return scaled;
  return c.Op("aten._to_copy.default", {Ref(scaled)}, {ir::Kwarg("dtype", Argument{"", t})});
}

Val Expand(Ctx& c, ValueId a, const std::vector<ir::SymInt>& sizes) {
  return c.Op("aten.expand.default", {Ref(a), SizesArg(sizes)});
}

Argument Arg(const Ctx& c, const std::string& name) {
  const Argument* a = c.call().Find(name);
  Argument out = a != nullptr ? *a : ir::NoneArg();
  out.name.clear();
  return out;
}

absl::StatusOr<ValueId> Tensor(const Ctx& c, const std::string& name) {
  return c.call().Tensor(name);
}
absl::StatusOr<ir::TensorMeta> MetaOf(const Ctx& c, const std::string& name) {
  ASSIGN_OR_RETURN(const ir::TensorMeta* m, c.call().Meta(name));
  return *m;
}
int64_t Rank(const ir::TensorMeta& m) { return static_cast<int64_t>(m.sizes.size()); }

Val MaybeMultiply(Ctx& c, ValueId t, const std::string& scalar_param) {
  ASSIGN_OR_RETURN(double s, c.call().Double(scalar_param));
  if (s == 1.0) return t;
  return MulScalar(c, t, Arg(c, scalar_param));
}

absl::Status SetReduced(Ctx& c, const std::string& param, ValueId g) {
  ASSIGN_OR_RETURN(const ir::TensorMeta m, MetaOf(c, param));
  ASSIGN_OR_RETURN(ValueId r, c.SumToSize(g, m));
  c.SetGrad(param, r);
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------
// Rule shapes.

DerivativeRule SelfRule(GradFn f) {
  return [f = std::move(f)](Ctx& c) -> absl::Status {
    if (!c.NeedsGrad("self") || c.grad_output(0) == kNoValue) return absl::OkStatus();
    ASSIGN_OR_RETURN(ValueId g, f(c, c.grad_output(0)));
    return SetReduced(c, "self", g);
  };
}

DerivativeRule ParamRule(std::vector<std::pair<std::string, GradFn>> fs) {
  return [fs = std::move(fs)](Ctx& c) -> absl::Status {
    if (c.grad_output(0) == kNoValue) return absl::OkStatus();
    for (const auto& [param, f] : fs) {
      if (!c.NeedsGrad(param)) continue;
      ASSIGN_OR_RETURN(ValueId g, f(c, c.grad_output(0)));
      RETURN_IF_ERROR(SetReduced(c, param, g));
    }
    return absl::OkStatus();
  };
}

GradFn Identity() {
  return [](Ctx&, ValueId g) -> Val { return g; };
}
GradFn ZerosLikeGrad() {
  return [](Ctx& c, ValueId g) { return ZerosLike(c, g); };
}

// ---------------------------------------------------------------------------
// Registration.

void Def(Registry* registry, const std::string& target, DerivativeRule rule,
         std::vector<std::string> nondifferentiable) {
  OpDef* def = registry->Mutable(target);
  if (def == nullptr) return;  // no shape rule yet: the grad-check test reports it
  def->derivative = std::move(rule);
  def->nondifferentiable = std::move(nondifferentiable);
}

void NoGrad(Registry* registry, const std::string& target, std::vector<std::string> params) {
  OpDef* def = registry->Mutable(target);
  if (def == nullptr) return;
  def->nondifferentiable = std::move(params);
}

}  // namespace derivatives_internal

void RegisterDerivatives(Registry* registry) {
  derivatives_internal::RegisterPointwise(registry);
  derivatives_internal::RegisterCopiesAndReductions(registry);
  derivatives_internal::RegisterNormalization(registry);
  derivatives_internal::RegisterViews(registry);
  derivatives_internal::RegisterMatmulAndConvolution(registry);
}

}  // namespace kiln::ops
